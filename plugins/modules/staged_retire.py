#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_retire
short_description: Move a module file out of MODULEPATH's way, so that rollback can put it back
version_added: 0.1.0
description:
  - Retires one module file on the target host, for a package that now lives elsewhere on
    C(MODULEPATH) (for example on CVMFS). The file is moved with one rename into the state
    root's C(retired/) directory, and the move is journaled as a run of its own; give its
    RV(run_id) to M(hpcstack.ops.staged_rollback) to move the file back.
  - Only the module file moves; the software directory it points at is left alone, so a job that
    loaded the module keeps its paths. M(hpcstack.ops.staged_gc) reports that directory and never
    deletes it.
  - A module file that a retire run of this state root already moved away (and that was not
    rolled back) is left alone and reported as not changed, with that run's RV(run_id).
  - Refused, with the core's one-line message, are a file without a root assignment
    (C(local root = "...")), a symbolic link anywhere in the path, anything but a regular file, a
    blank O(reason), and a state root on another filesystem than the module file (the rename there
    would not be atomic).
  - Also refused is a module file outside an EasyBuild module tree
    (C(<installpath>/modules/all/<Name>/<file>)) or whose root is not under that tree's software
    root C(<installpath>/software) (a root such as C(/etc)).
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff shows the module file's text before and after (after a retire, no module file).
  idempotent:
    support: full
    description: When run twice with the same arguments, the second run reports no change.
options:
  module_file:
    description:
      - The module file to retire, for example C(/apps/modules/all/TinyApp/1.0.lua).
    type: path
    required: true
  reason:
    description:
      - Why the module is retired; kept in the run's journal, which M(hpcstack.ops.staged_info) shows.
    type: str
    required: true
seealso:
  - module: hpcstack.ops.staged_rollback
  - module: hpcstack.ops.staged_info
  - module: hpcstack.ops.staged_gc
"""

EXAMPLES = r"""
- name: Retire a module that CVMFS now provides
  hpcstack.ops.staged_retire:
    state_root: /apps/.eb-staged-rebuild
    module_file: /apps/modules/all/TinyApp/1.0.lua
    reason: TinyApp/1.0 is now on /cvmfs
  register: retired

- name: Put it back
  hpcstack.ops.staged_rollback:
    state_root: /apps/.eb-staged-rebuild
    run_id: "{{ retired.run_id }}"
"""

RETURN = r"""
run_id:
  description:
    - The retire run, to give M(hpcstack.ops.staged_rollback); for a file retired earlier, that run.
  returned: success, except in check mode when the file is still there
  type: str
  sample: retire-20261201T053059657999Z
state:
  description: The run's state (V(retired)).
  returned: success, except in check mode when the file is still there
  type: str
  sample: retired
module_file:
  description: The module file, as an absolute path.
  returned: success
  type: str
  sample: /apps/modules/all/TinyApp/1.0.lua
retired_to:
  description: Where the module file is now, under the state root's C(retired/) directory.
  returned: success, except in check mode when the file is still there
  type: str
  sample: /apps/.eb-staged-rebuild/retired/20261201T053059657999Z/apps/modules/all/TinyApp/1.0.lua
dry_run:
  description: Whether only the check ran (check mode).
  returned: in check mode when the file is still there
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            module_support.common_arguments(),
            module_file={"type": "path", "required": True},
            reason={"type": "str", "required": True},
        ),
        supports_check_mode=True,
    )
    module_file = module.params["module_file"]
    result, failure = module_support.run(
        lambda dry_run: commands.retire_module(
            module_support.state_root(module.params, os.environ),
            module_file,
            module.params["reason"],
            lock_timeout=settings.lock_timeout(module.params),
            already_retired_ok=True,
            dry_run=dry_run,
        ),
        module.check_mode,
        module._diff,
        snapshot=lambda: module_support.file_snapshot(module_file),
    )
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
