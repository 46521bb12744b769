#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_gc
short_description: Remove the trees that staged rebuilds replaced, once no job can still use them
version_added: 0.1.0
description:
  - Removes, on the target host, the previous install directories that runs of
    C(eb-staged-rebuild) kept beside the live ones (the hidden sibling
    C(<software>/<Name>/.<version>.<run_id>) each run's journal recorded), once the grace period
    has passed since the run last changed state and no process on the target host uses them.
    The live path is never removed.
  - A process uses a tree when its executable, working directory or root is in it, it holds a
    file of it open or mapped, or its environment names a path in it, as C(/proc) shows it.
    Such a tree is kept whatever the grace period says, with the processes in RV(kept). As
    root every process of the host is seen; as another user only that user's (RV(processes)).
  - Once a run's previous tree is gone, M(hpcstack.ops.staged_rollback) refuses to roll that
    run back.
  - The software directory of a retired module file is only reported (RV(kept) or RV(manual)),
    never deleted.
  - Interrupted runs are listed in RV(interrupted) and each becomes a warning; finish or reverse
    them with C(eb-staged-rebuild resume), or roll back an interrupted retire.
  - Reports a change only when something was removed; in check mode, when something would be.
  - A journal whose paths are not where the state root's runs put them is refused. When the
    target host sets E(EASYBUILD_INSTALLPATH) (or E(EASYBUILD_INSTALLPATH_SOFTWARE) and
    E(EASYBUILD_INSTALLPATH_MODULES)), a run of other trees is refused too.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
    details: Lists what would be removed in RV(removed) and removes nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    description: When run twice with the same arguments, the second run reports no change.
options:
  fleet_answers:
    description:
      - What M(hpcstack.ops.staged_in_use) answered on the other hosts that may use the trees
        (the compute nodes) - each host's name mapped to the C(in_use) it returned,
        or to anything else (V(null), an empty string) for a host that did not answer.
      - A tree that a process on any of them uses is kept, with the host named. A host that
        did not answer keeps every tree (RV(fleet)), so that no tree goes while a host that may
        use it cannot be asked. A host whose answer does not name a tree keeps that tree (its
        scan ran before a rebuild made the tree a candidate), with the host in C(not_asked).
      - The fleet mode of the C(hpcstack.ops.gc) playbook fills it.
    type: dict
  squeue:
    description:
      - Ask C(squeue) on the target host which Slurm jobs run. When it answers for every job,
        a previous tree is kept exactly while a running job started before it was swapped out,
        and the grace period plays no part. When it does not answer, or this is V(false), the
        grace period decides; RV(slurm) says which.
      - C(squeue) is asked with C(--all) (hidden partitions and partitions closed to the
        caller's groups too), in UTC, and without the host's variables that C(squeue) and
        C(scontrol) read as options (every C(SQUEUE_*), C(SCONTROL_*) and C(SLURM_*) but
        C(SLURM_CONF)), under the state-root lock, after the journals are read. As root or the
        cluster's C(SlurmUser) its answer is believed; as another user only where
        C(scontrol show config) says C(PrivateData) does not hide other users' jobs.
    type: bool
    default: true
  grace_hours:
    description:
      - How long, in hours, a previous tree is kept after its run last changed state. Set it to
        the site's longest job walltime plus a margin, so that no job still runs from it.
      - When not given, the target host's environment variable E(EB_STAGED_REBUILD_GRACE_HOURS),
        else V(144) (a 120-hour walltime plus 24 hours).
      - Must not be negative.
    type: float
seealso:
  - module: hpcstack.ops.staged_info
  - module: hpcstack.ops.staged_rollback
"""

EXAMPLES = r"""
- name: Remove previous trees older than the default grace period
  hpcstack.ops.staged_gc:
    state_root: /apps/.eb-staged-rebuild

- name: See what a two-day grace period would remove
  hpcstack.ops.staged_gc:
    state_root: /apps/.eb-staged-rebuild
    grace_hours: 48
  check_mode: true
  register: would_remove
"""

RETURN = r"""
removed:
  description: The previous trees removed (in check mode, that would be removed), each with its run.
  returned: success
  type: list
  elements: dict
  sample:
    - path: /apps/software/TinyApp/.1.0.20261201T053043Z-89e721
      run_id: 20261201T053043Z-89e721
kept:
  description:
    - Previous trees and software directories that stay, each with its run and why (processes
      use it, the grace period, or a tracked module file still uses it). A tree that processes
      use also lists them (C(pid), C(uid), C(user), C(command), and C(uses), some of C(exe),
      C(cwd), C(root), C(fd), C(maps), C(environ)), and C(job_id), the process's
      C(SLURM_JOB_ID) as it was; C(why) names a job only when that value has a Slurm job id's
      form (C(4242), C(4242_7), C(4242+1)), and counts the others. One that running jobs keep
      lists them in C(jobs); one that fleet hosts were not asked about names them in
      C(not_asked).
  returned: success
  type: list
  elements: dict
  sample:
    - path: /apps/software/TinyApp/.1.0.20261201T053043Z-89e721
      run_id: 20261201T053043Z-89e721
      why: grace period
    - path: /apps/software/TinyApp/.1.0.20261130T101500Z-1c2d3e
      run_id: 20261130T101500Z-1c2d3e
      why: "in use by 1 process (pids 48213; users alice)"
      processes:
        - pid: 48213
          uid: 1001
          user: alice
          command: tinyapp
          uses: [maps]
manual:
  description:
    - Software directories of retired module files that no tracked module file uses any more;
      delete them by hand when sure.
  returned: success
  type: list
  elements: dict
  sample:
    - path: /apps/software/TinyApp/1.0
      run_id: retire-20261201T053059657999Z
      why: "retired; no tracked module uses it: delete it by hand when sure"
interrupted:
  description:
    - Runs that a crash interrupted, each with its state and the command that finishes or
      reverses it. Each also becomes a warning.
  returned: success
  type: list
  elements: dict
  sample:
    - run_id: 20261201T053043Z-89e721
      state: publishing
      why: "interrupted: 'eb-staged-rebuild resume'"
incomplete:
  description:
    - What O(state_root)'s C(runs/) holds that is not a run with a journal, each with C(path),
      C(run_id) (null for a name that is no run id), C(kind) and C(why) - C(incomplete), a run
      directory without a journal (left by a crash or a full disk while an earlier release
      created the run); C(leftover), a C(.creating-*) directory an interrupted creation left;
      C(unreadable), a symbolic link or a file where a run directory should be. gc never loads
      them and never removes them. Each also becomes a warning; remove them by hand.
  returned: success
  type: list
  elements: dict
  sample:
    - path: /var/lib/eb-staged-rebuild/runs/20261201T053043Z-89e721
      run_id: 20261201T053043Z-89e721
      kind: incomplete
      why: "a run directory without a journal (...); remove it by hand"
processes:
  description:
    - What the scan of C(/proc) saw - C(scanned) processes, C(unreadable) ones (not read in
      full; never taken as unused), the uid it ran as (C(as_uid)), and C(seen), which says
      whether that was every process of the host or only that uid's.
  returned: success
  type: dict
  sample:
    scanned: 214
    unreadable: 0
    as_uid: 0
    seen: "every process of this node's pid namespace"
candidates:
  description:
    - The old trees gc considered - the recorded siblings of finished runs that exist - for
      M(hpcstack.ops.staged_in_use) to look for on other hosts.
  returned: success
  type: list
  elements: str
  sample: [/apps/software/TinyApp/.1.0.20261201T053043Z-89e721]
fleet:
  description:
    - With O(fleet_answers), the hosts that did not answer (C(unanswered)); any keeps every tree.
  returned: when O(fleet_answers) is given
  type: dict
  sample:
    unanswered: [n3]
slurm:
  description:
    - Whether C(squeue) answered (C(answered)) and for how many running jobs (C(running)), or
      why not (C(why)), and then that the grace period decided (C(fallback)).
  returned: success
  type: dict
  sample:
    answered: false
    why: squeue not found on PATH
    fallback: grace period
grace_hours:
  description: The grace period, in hours, that this run applied.
  returned: success
  type: float
  sample: 144.0
dry_run:
  description: Whether nothing was removed because the module ran in check mode.
  returned: success
  type: bool
  sample: false
escaped:
  description:
    - The JSON pointers (RFC 6901) of the strings of this result that held bytes that are not
      UTF-8 (a path, a process's C(SLURM_JOB_ID)), each given in bash's C($'...')
      form - C(\xNN) for such a byte, a backslash doubled - so that the result is valid
      Unicode, which the controller requires. Absent when there is none.
  returned: when a string held bytes that are not UTF-8
  type: list
  elements: str
  sample: ["/kept/0/processes/0/job_id"]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    inuse,
    module_support,
    settings,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            module_support.common_arguments(),
            grace_hours={"type": "float"},
            squeue={"type": "bool", "default": True},
            fleet_answers={"type": "dict"},
        ),
        supports_check_mode=True,
    )
    params = module.params
    result, failure = module_support.run(
        lambda dry_run: commands.collect_garbage(
            module_support.state_root(params, os.environ),
            settings.grace_hours(params, os.environ),
            settings.lock_timeout(params),
            dry_run=dry_run,
            trees=module_support.host_trees(os.environ),
            squeue_environ=os.environ if params["squeue"] else None,
            fleet=None
            if params["fleet_answers"] is None
            else inuse.Fleet.from_answers(params["fleet_answers"]),
        ),
        module.check_mode,
    )
    if failure is not None:
        module.fail_json(**failure)
    for run in result["interrupted"]:
        module.warn(module_support.warning(f"run {run['run_id']} ({run['state']}) is {run['why']}"))
    for run in result["incomplete"]:
        module.warn(module_support.warning(f"{run['path']}: {run['why']}"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
