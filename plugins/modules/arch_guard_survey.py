#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: arch_guard_survey
short_description: What the arch_guard role reads on a node, in one round trip
version_added: 0.1.0
description:
  - Looks at a node for the C(hpcstack.ops.arch_guard) role and returns typed facts, without
    deciding anything (the role's decisions are the C(hpcstack.ops.arch_guard_plan) filter's).
  - Each part is asked for by its option; a part not asked for is not in the result.
  - Every file is read without following a link (slurm.conf's own path is resolved first),
    without waiting on a FIFO, with its type checked on the open file and its size bounded. An
    interpreter is started only when it and every directory above it are root's and writable
    by nobody else.
  - A slurmd counts as configless (C(--conf-server)) only when it runs as root, or as
    C(SlurmdUser), and C(/proc/PID/exe) is a slurmd binary of root's.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild.attributes
  - hpcstack.ops.staged_rebuild.read_only
options:
  prefix:
    description: The guard's directory (C(arch_guard_prefix)); reports RV(parents), RV(guard) and RV(release).
    type: path
  state_dir:
    description: Where the TaskProlog line found before the guard's is kept; reports RV(state).
    type: path
  slurm_conf:
    description: The slurm.conf this host reads; reports RV(slurm_conf).
    type: path
  python:
    description:
      - Interpreters to start as the launcher starts them (C(-IS)), in order, up to the first that is
        3.8 or newer.
    type: list
    elements: str
  prologs:
    description:
      - More paths to report in RV(prologs), besides the TaskProlog paths slurm.conf and the kept line
        name.
    type: list
    elements: str
  slurm_nodes:
    description: List the nodes C(scontrol show nodes) names for O(slurm_conf), in RV(nodes).
    type: bool
    default: false
notes:
  - See C(docs/ansible.md) for how the role uses each part.
seealso:
  - module: hpcstack.ops.arch_guard_install
"""

EXAMPLES = r"""
- name: Look at a node as the arch_guard role does
  hpcstack.ops.arch_guard_survey:
    prefix: /opt/hpcstack/arch-guard
    state_dir: /var/lib/hpcstack/arch-guard
    slurm_conf: /etc/slurm/slurm.conf
    python: [/usr/bin/python3]
  register: survey
"""

RETURN = r"""
problems:
  description:
    - The node's own checks that the options give what they read, each by the name its fact is
      reported under (C(parents)), to the one line that refuses what it found, or an empty string.
  returned: always
  type: dict
parents:
  description:
    - Each directory from C(/) down to O(prefix) that is there (the walk ends at the first missing one,
      or at one that is no directory), each with C(path), C(type), C(uid), C(gid) and C(mode).
  returned: with O(prefix)
  type: list
  elements: dict
guard:
  description:
    - The guard's own paths that are there, path to its facts (and the C(sha256) of the launcher and
      the wrapper).
  returned: with O(prefix)
  type: dict
release:
  description:
    - C(version), C(digest), C(python) and C(build) of the installed C(release.json); null when it is not
      there.
  returned: with O(prefix)
  type: dict
release_problem:
  description: Why C(release.json) could not be used, or null.
  returned: with O(prefix)
  type: str
state:
  description:
    - C(parents) of O(state_dir), its C(stat) (null when not there), the C(kept) line (C(line), C(slurm_conf),
      C(text)) or null, and C(problem) when the kept file cannot be used.
  returned: with O(state_dir)
  type: dict
slurm_conf:
  description:
    - C(path), C(problem) (null, or why it cannot be read), C(task_prolog) (each TaskProlog line as
      C(text) and whether a newline ends it, C(terminated)), C(slurmd_user), and C(identity)
      (C(configless), C(fstype), C(source), C(dev), C(ino), C(boot_id), C(sha256)).
  returned: with O(slurm_conf)
  type: dict
python:
  description:
    - Each interpreter started, in order, with C(path), C(version) (null when it does not run) and
      C(problem).
  returned: with O(python)
  type: list
  elements: dict
prologs:
  description: Each TaskProlog path to its facts (as C(parents)), null when it is not there.
  returned: when there are any
  type: dict
nodes:
  description: The NodeNames C(scontrol show nodes) lists.
  returned: with O(slurm_nodes)
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import survey
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors

OPTIONS = ("prefix", "state_dir", "slurm_conf", "python", "prologs", "slurm_nodes")


def main():
    module = AnsibleModule(
        argument_spec={
            "prefix": {"type": "path"},
            "state_dir": {"type": "path"},
            "slurm_conf": {"type": "path"},
            "python": {"type": "list", "elements": "str"},
            "prologs": {"type": "list", "elements": "str"},
            "slurm_nodes": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        # Reads only, so the same in check mode.
        facts = survey.survey(**{name: module.params[name] for name in OPTIONS})
    except (errors.HpcstackError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
