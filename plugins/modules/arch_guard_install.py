#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: arch_guard_install
short_description: The guard's files on a node, written as root where no other user can replace them
version_added: 0.1.0
description:
  - Writes, step by step, what the C(hpcstack.ops.arch_guard) role installs under its prefix, or removes it.
  - Every directory from C(/) down to O(prefix) is walked by descriptors, each opened without following a
    link and checked on its descriptor; a missing one is made by root there and then, and one that is
    not root's, or that others could write (unless it is sticky, as C(/tmp) is), is refused with one line
    naming it. The files are written relative to the checked descriptors, each replaced whole.
  - Each step writes only what differs from what is there.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
    details: Says what it would write; nothing is written and the launcher is not run.
  diff_mode:
    support: partial
    details: The launcher's and the wrapper's text, before and after.
  idempotent:
    description: A second run with the same arguments finds every file as wanted and changes nothing.
    support: full
options:
  prefix:
    description: The guard's directory.
    type: path
    required: true
  state:
    description: V(present) writes the files of O(step); V(absent) removes O(prefix) and all it holds.
    type: str
    choices: [present, absent]
    default: present
  step:
    description:
      - V(code) unpacks O(archive) into C(lib/<build>) and byte-compiles it with O(python).
      - V(switch) points C(lib/current) at O(build) in one rename, writes O(release) to C(release.json)
        and removes the builds no task can still be using (all but this one and the one it replaced).
      - V(launcher) writes C(bin/eessi-arch-guard), then runs it once as slurmstepd runs it, through the
        descriptor it checked (root's, writable by nobody else, the bytes it wrote), and only when its
        interpreter O(python) is a file nobody but root could have written; it must load the guard.
      - V(wrapper) writes C(bin/task-prolog) with O(wrapper), or removes it without.
    type: str
    choices: [code, switch, launcher, wrapper]
  build:
    description: The build's name, C(lib/<build>) (O(step=code), O(step=switch)).
    type: str
  archive:
    description: The guard's code, a tar archive in base64 (O(step=code)).
    type: str
  python:
    description: The interpreter that compiles and runs the guard (O(step=code), O(step=launcher)).
    type: path
  release:
    description: What C(release.json) records (O(step=switch)).
    type: dict
  launcher:
    description: The launcher's text (O(step=launcher)).
    type: str
  wrapper:
    description: The wrapper's text (O(step=wrapper)); without it, a wrapper there is removed.
    type: str
seealso:
  - module: hpcstack.ops.arch_guard_survey
"""

EXAMPLES = r"""
- name: Write the launcher and check it
  hpcstack.ops.arch_guard_install:
    prefix: /opt/hpcstack/arch-guard
    step: launcher
    python: /usr/bin/python3
    launcher: "{{ lookup('ansible.builtin.template', 'eessi-arch-guard.j2') }}"
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


def _step(params, dry_run, diff):
    prefix = params["prefix"]
    if params["state"] == "absent":
        return install.remove(prefix, dry_run=dry_run)
    if params["step"] == "code":
        code = (params["build"], params["archive"], params["python"])
        return install.install_code(prefix, *code, dry_run=dry_run)
    if params["step"] == "switch":
        return install.switch(prefix, params["build"], params["release"], dry_run=dry_run)
    if params["step"] == "wrapper":
        return install.write_wrapper(prefix, wrapper=params["wrapper"], dry_run=dry_run, diff=diff)
    return install.write_launcher(
        prefix, launcher=params["launcher"], python=params["python"], dry_run=dry_run, diff=diff
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "prefix": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "step": {"type": "str", "choices": ["code", "switch", "launcher", "wrapper"]},
            "build": {"type": "str"},
            "archive": {"type": "str", "no_log": True},
            "python": {"type": "path"},
            "release": {"type": "dict"},
            "launcher": {"type": "str"},
            "wrapper": {"type": "str"},
        },
        required_if=[
            ("state", "present", ("step",)),
            ("step", "code", ("build", "archive", "python")),
            ("step", "switch", ("build", "release")),
            ("step", "launcher", ("python", "launcher")),
        ],
        supports_check_mode=True,
    )
    try:
        result = _step(module.params, module.check_mode, module._diff)
    except (errors.HpcstackError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
