#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_resume
short_description: Finish or reverse staged rebuilds that a crash interrupted
version_added: 0.1.0
description:
  - Resumes the runs of C(eb-staged-rebuild) on the target host that a crash, a kill or a lost
    node left unfinished, from their journals and from the disk itself.
  - A run that was publishing or rolling back returns every module to the tree that was live
    before it, entirely; a run that was still building is built again and published.
  - Runs that are finished are left alone; when none is interrupted, nothing changes.
  - M(hpcstack.ops.staged_rebuild) refuses to start while a run of the same state root is
    interrupted, so this module comes first after a crash.
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
    details: Check mode lists the interrupted runs and changes nothing.
  diff_mode:
    support: none
  idempotent:
    description: When run twice with the same arguments, the second run reports no change.
    support: full
options:
  run_id:
    description:
      - The one run to resume; by default every interrupted run of the state root.
    type: str
seealso:
  - module: hpcstack.ops.staged_rebuild
  - module: hpcstack.ops.staged_info
"""

EXAMPLES = r"""
- name: Finish whatever a crash interrupted
  hpcstack.ops.staged_resume:
    state_root: /apps/.eb-staged-rebuild

- name: Resume one run only
  hpcstack.ops.staged_resume:
    state_root: /apps/.eb-staged-rebuild
    run_id: 20261201T053043Z-89e721
"""

RETURN = r"""
runs:
  description:
    - One entry per run looked at, with C(run_id), its C(state) afterwards, C(changed) and the
      C(actions) taken (each one line).
  returned: success, except in check mode
  type: list
  elements: dict
  sample:
    - run_id: 20261201T053043Z-89e721
      state: failed
      changed: true
      actions:
        - "TinyApp/1.0: module file restored"
        - "TinyApp/1.0: old tree back at /apps/software/TinyApp/1.0"
interrupted:
  description: The interrupted runs that would be resumed.
  returned: in check mode
  type: list
  elements: str
  sample:
    - 20261201T053043Z-89e721
progress:
  description: EasyBuild's step lines when a run that was building is built again.
  returned: success
  type: list
  elements: str
  sample: []
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    module_support,
    settings,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(module_support.common_arguments(), run_id={"type": "str"}),
        supports_check_mode=True,
    )
    # Never printed: the module's stdout is its JSON result.
    progress = []
    result, failure = module_support.run(
        lambda dry_run: commands.resume_runs(
            module_support.state_root(module.params, os.environ),
            module.params["run_id"],
            lock_timeout=settings.lock_timeout(module.params),
            progress=progress.append,
            env=dict(os.environ),
            dry_run=dry_run,
            trees=module_support.host_trees(os.environ),
        ),
        module.check_mode,
        progress=progress,
    )
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
