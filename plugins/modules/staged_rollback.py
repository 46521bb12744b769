#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_rollback
short_description: Put back what a staged rebuild or a retire replaced
version_added: 0.1.0
description:
  - Rolls back one run of C(eb-staged-rebuild) on the target host. For a rebuild, the previous
    install directory is swapped back into the live path in one atomic exchange and the previous
    module files are restored; for a retire, the module file is moved back.
  - A run that is already rolled back is left alone and reported as not changed.
  - The previous tree must still exist; once M(hpcstack.ops.staged_gc) removed it, the rollback is
    refused.
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
  diff_mode:
    support: full
    details: The diff shows each live directory's inode and the module files, before and after.
  idempotent:
    support: full
    description: When run twice with the same arguments, the second run reports no change.
options:
  run_id:
    description:
      - The run to roll back, as M(hpcstack.ops.staged_rebuild) or M(hpcstack.ops.staged_retire)
        returned it, or as M(hpcstack.ops.staged_info) lists it.
    type: str
    required: true
seealso:
  - module: hpcstack.ops.staged_rebuild
  - module: hpcstack.ops.staged_info
"""

EXAMPLES = r"""
- name: Roll back a rebuild
  hpcstack.ops.staged_rollback:
    state_root: /apps/.eb-staged-rebuild
    run_id: 20261201T053043Z-89e721

- name: Put back a module file that was retired
  hpcstack.ops.staged_rollback:
    state_root: /apps/.eb-staged-rebuild
    run_id: retire-20261201T053059657999Z
"""

RETURN = r"""
run_id:
  description: The run that was rolled back.
  returned: success
  type: str
  sample: 20261201T053043Z-89e721
state:
  description: The run's state afterwards (V(rolled_back)); in check mode, its state now.
  returned: success
  type: str
  sample: rolled_back
module_file:
  description: For a retire run, the module file that was moved back.
  returned: when a retired module file was moved back
  type: str
  sample: /apps/modules/all/TinyApp/1.0.lua
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
        argument_spec=dict(module_support.common_arguments(), run_id={"type": "str", "required": True}),
        supports_check_mode=True,
    )
    run_id = module.params["run_id"]
    result, failure = module_support.run(
        lambda dry_run: commands.roll_back(
            module_support.state_root(module.params, os.environ),
            run_id,
            settings.lock_timeout(module.params),
            dry_run=dry_run,
            trees=module_support.host_trees(os.environ),
        ),
        module.check_mode,
        module._diff,
        snapshot=lambda: module_support.run_snapshot(
            module_support.state_root(module.params, os.environ), run_id
        ),
    )
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
