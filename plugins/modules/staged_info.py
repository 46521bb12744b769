#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_info
short_description: List the runs of staged rebuilds and retires, and probe what a host can do
version_added: 0.1.0
description:
  - Lists the runs of one state root of C(eb-staged-rebuild) on the target host (rebuilds and
    retires, oldest first, with their state), or one run in detail with its journaled steps.
  - With O(probe_path), also reports what the filesystem there and this host can do, namely whether
    the directory exchange works (else publishing falls back to three renames), which sandbox
    backends work for this user, the EasyBuild version, and a recommendation for each finding
    that needs one.
  - One unreadable journal fails the module with its message; a partial list would hide the
    broken run.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild
  - hpcstack.ops.staged_rebuild.attributes
  - hpcstack.ops.staged_rebuild.read_only
options:
  run_id:
    description:
      - Show this run in detail (RV(run)) instead of listing every run (RV(runs)).
    type: str
  probe_path:
    description:
      - A directory whose filesystem to probe, normally the live software tree; adds RV(probe).
    type: path
  eb:
    description:
      - The EasyBuild command whose version O(probe_path) checks.
      - When not given, the target host's environment variable E(EB_STAGED_REBUILD_EB), else
        C(eb) as found on the target's C(PATH).
    type: str
notes:
  - The state root must hold runs (the directory C(runs/) that every rebuild or retire creates),
    also when only O(probe_path) is of interest.
  - The probe tries the directory exchange for real, on two scratch directories in a directory
    C(.eb-staged-rebuild-probe-*) that it makes inside O(probe_path) and removes at once; the
    account the module runs as must be able to write there.
seealso:
  - module: hpcstack.ops.staged_rollback
  - module: hpcstack.ops.staged_gc
"""

EXAMPLES = r"""
- name: List the runs
  hpcstack.ops.staged_info:
    state_root: /apps/.eb-staged-rebuild
  register: staged

- name: Show one run with its steps
  hpcstack.ops.staged_info:
    state_root: /apps/.eb-staged-rebuild
    run_id: 20261201T053043Z-89e721

- name: List the runs and probe the live software tree
  hpcstack.ops.staged_info:
    state_root: /apps/.eb-staged-rebuild
    probe_path: /apps/software
    eb: /opt/easybuild/bin/eb
"""

RETURN = r"""
runs:
  description:
    - Every run, oldest first, each with C(run_id), C(kind) (V(publish) or V(retire)), C(state),
      C(created) and C(state_since); a rebuild with its C(modules), a retire with its
      C(module_file), C(retired_to), C(software_dir) and C(reason).
  returned: when O(run_id) is not given
  type: list
  elements: dict
  sample: [{"run_id": "20261201T053043Z-89e721", "kind": "publish", "schema": 2, "state": "published"}]
incomplete:
  description:
    - What C(runs/) holds that is not a run with a journal, each with C(path), C(run_id) (null
      for a name that is no run id), C(kind) and C(why) - C(incomplete), a run directory without
      a journal (left by a crash or a full disk while an earlier release created the run);
      C(leftover), a C(.creating-*) directory an interrupted creation left; C(unreadable), a
      symbolic link or a file where a run directory should be. None is loaded; remove them by hand.
  returned: when O(run_id) is not given
  type: list
  elements: dict
  sample:
    - path: /state/runs/20261201T053043Z-89e721
      run_id: 20261201T053043Z-89e721
      kind: incomplete
      why: "..."
run:
  description: The run O(run_id) in detail, as in RV(runs), with its C(steps) and the path of its C(journal).
  returned: when O(run_id) is given
  type: dict
  sample: {"run_id": "20261201T053043Z-89e721", "kind": "publish", "state": "published", "steps": []}
probe:
  description:
    - What the filesystem at O(probe_path) and this host can do, with C(recommendations), one line each.
  returned: when O(probe_path) is given
  type: dict
  contains:
    path:
      description: The probed directory, as an absolute path.
      type: str
    filesystem:
      description: Its filesystem type.
      type: str
    exchange:
      description: Whether the atomic directory exchange works there.
      type: bool
    publish_method:
      description: How a rebuild there publishes (V(exchange), or the three-rename fallback).
      type: str
    easybuild_version:
      description: The version of O(eb), or null when it does not run.
      type: str
    auto_backend:
      description: The sandbox backend that V(auto) chooses for this user.
      type: str
    recommendations:
      description: One line for each finding that needs action.
      type: list
      elements: str
  sample: {"path": "/apps/software", "filesystem": "xfs", "exchange": true, "publish_method": "exchange"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    module_support,
    probe,
    settings,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            module_support.common_arguments(),
            run_id={"type": "str"},
            probe_path={"type": "path"},
            eb={"type": "str"},
        ),
        supports_check_mode=True,
    )
    params = module.params

    def read_state(dry_run):
        # Reads only, so the same in check mode; the probe's scratch directory is removed.
        state_root = module_support.state_root(params, os.environ)
        result = dict(commands.show_status(state_root, params["run_id"]), changed=False)
        if params["probe_path"]:
            result["probe"] = probe.probe(params["probe_path"], settings.eb(params, os.environ))
        return result

    result, failure = module_support.run(read_state, module.check_mode)
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
