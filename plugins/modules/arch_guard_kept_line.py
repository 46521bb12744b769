#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: arch_guard_kept_line
short_description: The TaskProlog line found before the guard's, kept for the arch_guard role's removal
version_added: 0.1.0
description:
  - Keeps, in O(state_dir) on the host of slurm.conf, the C(TaskProlog) line that slurm.conf had before the
    C(hpcstack.ops.arch_guard) role named the guard there, so that removal can put it back byte for byte;
    or forgets it once it is back.
  - The state directory is made root's, mode 0700, by descriptors from C(/) as
    M(hpcstack.ops.arch_guard_install) makes the guard's; a directory on the way that others could
    replace is refused with one line naming it.
  - The file is written only when its content, owner or mode differ.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    description: A second run with the same arguments finds the line kept (or gone) and changes nothing.
    support: full
options:
  state_dir:
    description: The role's state directory (C(arch_guard_state_dir)).
    type: path
    required: true
  state:
    description: V(present) keeps O(line); V(absent) forgets the kept line.
    type: str
    choices: [present, absent]
    default: present
  slurm_conf:
    description: The slurm.conf the line belongs to, recorded with it.
    type: str
  line:
    description: The line, as it was written; null when slurm.conf had none.
    type: str
seealso:
  - module: hpcstack.ops.arch_guard_install
"""

EXAMPLES = r"""
- name: Keep the TaskProlog line found before the guard's
  hpcstack.ops.arch_guard_kept_line:
    state_dir: /var/lib/hpcstack/arch-guard
    slurm_conf: /etc/slurm/slurm.conf
    line: TaskProlog=/etc/slurm/prolog.sh
"""

RETURN = r"""
actions:
  description: What was done (or in check mode would be), one line each.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import install
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors


def main():
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "slurm_conf": {"type": "str"},
            "line": {"type": "str"},
        },
        required_if=[("state", "present", ("slurm_conf",))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "absent":
            result = install.forget_line(params["state_dir"], dry_run=module.check_mode)
        else:
            result = install.keep_line(
                params["state_dir"], params["slurm_conf"], params["line"], dry_run=module.check_mode
            )
    except (errors.HpcstackError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
