#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_probe
short_description: What a build host and its filesystem can do, and whether the lock holds across hosts
version_added: 0.1.0
description:
  - Probes a directory on the target host, normally the live software tree, as
    C(eb-staged-rebuild probe) does, namely whether the directory exchange works there (else
    publishing falls back to three renames), which sandbox backends work for this user, which one
    O(hpcstack.ops.staged_rebuild#module:backend=auto) picks, the EasyBuild version, and a
    recommendation for each finding that needs one.
  - With O(lock_contention), the hosts of a play that share one state root contend for its lock at
    the same time and each reports whether it ever found another host inside the lock. flock
    reaches only one kernel; the POSIX lock on the sidecar must reach the other nodes through the
    filesystem, and this measures whether it does. The playbook C(hpcstack.ops.probe) runs it on a
    host group and prints one table.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
    details: The probes run in check mode too; they change nothing and leave nothing behind.
  diff_mode:
    support: none
  idempotent:
    support: full
    description: The module never reports a change.
options:
  path:
    description:
      - The directory to probe, normally the live software tree. The account the module runs as must
        be able to write there (the exchange is tried on two scratch directories, removed at once).
    type: path
    required: true
  eb:
    description:
      - The EasyBuild command whose version is checked.
      - When not given, the target host's environment variable E(EB_STAGED_REBUILD_EB), else C(eb)
        as found on the target's C(PATH).
    type: str
  lock_contention:
    description:
      - Contend for the lock of O(state_root) with the other hosts of the probe (O(participants) in
        all, the same O(probe_id)), O(rounds) times each.
      - The state root must exist and be the same directory for every participant.
    type: bool
    default: false
  participants:
    description:
      - How many hosts take part; each waits until all of them have arrived, so that they contend at
        the same time.
    type: int
    default: 1
  probe_id:
    description:
      - A name shared by the participants of one probe and new for each probe, for example a
        timestamp chosen once for the play. Required with O(lock_contention).
    type: str
  host:
    description:
      - This host's name in the probe, unique among the participants; the playbook passes
        C(inventory_hostname). By default the host's node name.
    type: str
  rounds:
    description: How often each host takes the lock.
    type: int
    default: 20
  hold_seconds:
    description: How long each host holds the lock each time.
    type: float
    default: 0.05
  wait_seconds:
    description: How long a host waits for the others to arrive, and for the lock each time.
    type: float
    default: 60
seealso:
  - module: hpcstack.ops.staged_info
"""

EXAMPLES = r"""
- name: Probe the live software tree
  hpcstack.ops.staged_probe:
    path: /apps/software

- name: Probe, and contend for the shared state root's lock with the play's other hosts
  hpcstack.ops.staged_probe:
    path: /shared/apps/software
    state_root: /shared/apps/.eb-staged-rebuild
    lock_contention: true
    participants: "{{ ansible_play_hosts | length }}"
    probe_id: "{{ probe_id }}"
    host: "{{ inventory_hostname }}"
"""

RETURN = r"""
probe:
  description: What C(eb-staged-rebuild probe --path PATH --json) reports.
  returned: success
  type: dict
  sample:
    path: /apps/software
    filesystem: ext4
    exchange: true
    exchange_errno: null
    publish_method: exchange
    bwrap: true
    userns: true
    auto_backend: bwrap
    easybuild_version: 5.4.1
    recommendations: []
lock:
  description:
    - The lock contention of this host; RV(lock.coherent) is false when it ever found another host
      inside the lock, and RV(lock.overlaps) lists what it found there.
  returned: when O(lock_contention) is true
  type: dict
  contains:
    host:
      description: This host's name in the probe.
      type: str
      sample: build1
    probe_id:
      description: The probe's name, shared by its participants.
      type: str
      sample: probe-20261201T060000123456789
    participants:
      description: How many hosts took part.
      type: int
      sample: 2
    rounds:
      description: How often this host took the lock.
      type: int
      sample: 20
    overlaps:
      description: What this host found inside the lock instead of nothing or its own name.
      type: list
      elements: str
      sample: []
    coherent:
      description: Whether this host never found another inside the lock with it.
      type: bool
      sample: true
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    module_support,
    settings,
)

CONTENTION = ("probe_id", "participants", "rounds", "hold_seconds", "wait_seconds")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            module_support.common_arguments(),
            path={"type": "path", "required": True},
            eb={"type": "str"},
            lock_contention={"type": "bool", "default": False},
            participants={"type": "int", "default": 1},
            probe_id={"type": "str"},
            host={"type": "str"},
            rounds={"type": "int", "default": 20},
            hold_seconds={"type": "float", "default": 0.05},
            wait_seconds={"type": "float", "default": 60.0},
        ),
        required_if=[("lock_contention", True, ("probe_id",))],
        supports_check_mode=True,
    )
    params = module.params

    def contention():
        if not params["lock_contention"]:
            return None
        return {
            "state_root": module_support.state_root(params, os.environ),
            "host": params["host"] or os.uname().nodename,
            **{key: params[key] for key in CONTENTION},
        }

    result, failure = module_support.run(
        lambda dry_run: commands.probe_host(params["path"], settings.eb(params, os.environ), contention()),
        module.check_mode,
    )
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
