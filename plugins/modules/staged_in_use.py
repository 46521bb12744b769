#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_in_use
short_description: Find the processes of a host that use the trees staged rebuilds replaced
version_added: 0.2.0
description:
  - Reads C(/proc) on the target host once and reports, for each of O(trees), the processes
    that use it - its executable, working directory or root is in it, it holds a file of it
    open or mapped (a shared library, an C(mmap) of data), or a value of its environment names
    a path in it.
  - This is the scan C(eb-staged-rebuild gc) runs on its own host, for the others - the fleet
    mode of the C(hpcstack.ops.gc) playbook runs it on every compute node and gives the
    answers to M(hpcstack.ops.staged_gc) on the build host, which removes only the trees that
    no host uses.
  - Run as root to see every process of the host; as another user only that user's are read,
    and RV(processes) says so.
  - Processes in another pid namespace (a container runtime's) are not seen, and a process in
    another mount namespace names paths as its own root sees them.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild.attributes
  - hpcstack.ops.staged_rebuild.read_only
options:
  trees:
    description:
      - The directories to look for, as absolute paths - normally the C(candidates) that a
        check-mode run of M(hpcstack.ops.staged_gc) returns on the build host. The trees need
        not exist on this host.
    type: list
    elements: path
    required: true
seealso:
  - module: hpcstack.ops.staged_gc
"""

EXAMPLES = r"""
- name: Ask each compute node which old trees its processes use
  hpcstack.ops.staged_in_use:
    trees:
      - /apps/software/TinyApp/.1.0.20261201T053043Z-89e721
  register: in_use
"""

RETURN = r"""
in_use:
  description:
    - For each of O(trees), the processes that use it (an empty list for none), each with
      C(pid), C(uid), C(user), C(command), C(uses) (some of C(exe), C(cwd), C(root), C(fd),
      C(maps), C(environ)) and C(job_id), its C(SLURM_JOB_ID) where its environment could be
      read.
  returned: success
  type: dict
  sample:
    /apps/software/TinyApp/.1.0.20261201T053043Z-89e721:
      - pid: 48213
        uid: 1001
        user: alice
        command: tinyapp
        uses: [fd, maps]
        job_id: "4242"
processes:
  description:
    - What the scan saw - C(scanned) processes, C(unreadable) ones (not read in full), the uid
      it ran as (C(as_uid)), and C(seen), which says whether that was every process of the
      host or only that uid's.
  returned: success
  type: dict
  sample:
    scanned: 214
    unreadable: 0
    as_uid: 0
    seen: "every process of this node's pid namespace"
escaped:
  description:
    - The JSON pointers (RFC 6901) of the strings of this result that held bytes that are not
      UTF-8 (a path, a process's C(SLURM_JOB_ID)), each given in bash's C($'...')
      form - C(\xNN) for such a byte, a backslash doubled - so that the result is valid
      Unicode, which the controller requires. Absent when there is none.
  returned: when a string held bytes that are not UTF-8
  type: list
  elements: str
  sample: ["/in_use/~1apps~1software~1TinyApp~1.1.0.20261201T053043Z-89e721/0/job_id"]
"""

import dataclasses

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.common.printable import unicode_result
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import inuse


def main():
    module = AnsibleModule(
        argument_spec={"trees": {"type": "list", "elements": "path", "required": True}},
        supports_check_mode=True,
    )
    trees = module.params["trees"]
    relative = [tree for tree in trees if not tree.startswith("/")]
    if relative:
        module.fail_json(msg=f"trees: {relative[0]!r} is not an absolute path")
    found = inuse.scan(trees)
    # A process's job id or command is its owner's choice, and may hold bytes that are not
    # UTF-8: the controller would refuse the whole answer, and this host would count as silent.
    result = {
        "in_use": {tree: [dataclasses.asdict(process) for process in found.users[tree]] for tree in trees},
        "processes": found.summary(),
    }
    module.exit_json(changed=False, **unicode_result(result))


if __name__ == "__main__":
    main()
