#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: arch_guard_info
short_description: What eessi-arch-guard sees on a node, for each EESSI version
version_added: 0.1.0
description:
  - Tells, for the target host, what C(eessi-arch-guard) (the Slurm TaskProlog of this collection)
    sees there, namely for each EESSI version the answer of EESSI's archdetect, the CPU target the
    guard would select (the first C(cpupath) candidate with a C(software/linux/<candidate>/software)
    directory) and the guard's failure token when it would select none (V(no-software-dir),
    V(archdetect-failed), or V(timeout)).
  - It runs the guard's own code for this, not a copy of its rules, so the report says what a job
    on this node would get.
  - Also reports whether the C(hpcstack.ops.arch_guard) role's install is there and whole, the Lmod a
    reload would run, and the directory the guard would put its cache and work directories in.
  - It is the per-node half of a fleet report; RV(targets) and RV(problems) are the summaries a
    playbook aggregates over the hosts.
  - archdetect runs in a clean environment, built as a job's is once EESSI is loaded
    (C(PATH=/usr/local/bin:/usr/bin:/bin), the version's C(EESSI_PREFIX), C(TMPDIR) from O(tmpdir)),
    with only O(job_env) on top; nothing of the module's own environment reaches it, EESSI's override
    variables included.
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild.attributes
  - hpcstack.ops.staged_rebuild.read_only
options:
  eessi_root:
    description:
      - The EESSI repository; each directory C(<eessi_root>/versions/<version>) is one version's
        C(EESSI_PREFIX).
    type: path
    default: /cvmfs/software.eessi.io
  versions:
    description:
      - The versions to report, each the name of a directory under C(<eessi_root>/versions).
      - When not given or empty, every version directory found there, sorted.
      - A version that is not there is reported as the guard sees it, with V(archdetect-failed)
        (there is no archdetect to run).
    type: list
    elements: str
  prefix:
    description:
      - Where the C(hpcstack.ops.arch_guard) role installs the guard (its C(arch_guard_prefix)), namely
        the code in C(lib/current/hpcstack_ops/) (C(current) a link to the build in use), the
        launcher C(bin/eessi-arch-guard) and C(release.json).
    type: path
    default: /opt/hpcstack/arch-guard
  lmod_cmd:
    description:
      - The Lmod command (C($LMOD_CMD)) jobs on this node have, which the guard needs to reload EESSI.
      - When not given, the module's environment variable E(LMOD_CMD), else the first executable of
        C(/usr/share/lmod/lmod/libexec/lmod), C(/opt/apps/lmod/lmod/libexec/lmod),
        C(/usr/share/lmod/*/libexec/lmod) and C(/opt/apps/lmod/*/libexec/lmod).
    type: path
  tmpdir:
    description:
      - The C(TMPDIR) jobs get on this node. It is in archdetect's environment, and RV(cache_dir)
        follows from it by the guard's rule (C(TMPDIR) when it is an absolute path to a trusted
        directory, one owned by root or the running user and not writable by group or others unless
        sticky; else C(/tmp) when that is trusted).
      - When not given, jobs are taken to have no C(TMPDIR), so RV(cache_dir) is C(/tmp).
    type: path
  job_env:
    description:
      - Variables of the job's environment laid over the clean one archdetect runs in, for example
        E(EESSI_SOFTWARE_SUBDIR_OVERRIDE), E(EESSI_ACCELERATOR_TARGET_OVERRIDE), E(EESSI_PROC_CPUINFO),
        E(EESSI_MACHINE_TYPE), E(EESSI_INIT_PREFIX), or a E(PATH) where the node's C(nvidia-smi) is.
      - Values are strings (numbers are turned into strings). E(EESSI_PREFIX) is each version's own
        and E(TMPDIR) is O(tmpdir); neither may be set here.
    type: dict
  timeout:
    description:
      - Seconds for each version's two archdetect runs (C(-a cpupath) and C(accelpath)), as the guard's
        E(EESSI_ARCH_GUARD_TIMEOUT); what is still running then is killed and the version reported
        with V(timeout).
      - More than 0, at most 86400.
    type: float
    default: 60
notes:
  - The module runs archdetect as the account Ansible runs it as (normally root); the guard runs it as
    the job's user. On a node where that makes a difference (a cpuinfo file only root can read) the
    answers differ.
  - Nothing is written on the node; archdetect runs in its own session and is killed at the deadline
    or when the module gets SIGTERM.
  - See C(docs/arch-guard.md) for the guard's decision and C(docs/ansible.md) for a fleet report.
seealso:
  - module: hpcstack.ops.staged_info
"""

EXAMPLES = r"""
- name: What the guard sees on each compute node
  hpcstack.ops.arch_guard_info:
  register: guard_info

- name: One version, jobs' TMPDIR on local scratch, nvidia-smi in CUDA's directory
  hpcstack.ops.arch_guard_info:
    versions: [2023.06]
    tmpdir: /local/scratch
    job_env:
      PATH: /usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin

- name: The target of 2023.06 on each node of the play
  ansible.builtin.debug:
    msg: >-
      {{ dict(ansible_play_hosts | zip(ansible_play_hosts
         | map('extract', hostvars, ['guard_info', 'targets', '2023.06']))) }}
  run_once: true

- name: The nodes where a job would get no-software-dir
  ansible.builtin.debug:
    msg: >-
      {{ ansible_play_hosts
         | zip(ansible_play_hosts | map('extract', hostvars, ['guard_info', 'problems'])
               | map('dict2items') | map('map', attribute='value') | map('list'))
         | selectattr('1', 'contains', 'no-software-dir') | map(attribute='0') | list }}
  run_once: true
"""

RETURN = r"""
node:
  description: The host name of the node, without its domain.
  returned: success
  type: str
  sample: node042
eessi_root:
  description: O(eessi_root), normalized.
  returned: success
  type: str
  sample: /cvmfs/software.eessi.io
available_versions:
  description: Every version directory under C(<eessi_root>/versions), sorted; empty when there is none.
  returned: success
  type: list
  elements: str
  sample: ["2023.06", "2025.06"]
eessi:
  description: One entry for each version reported, in the order of O(versions) (or sorted).
  returned: success
  type: list
  elements: dict
  contains:
    version:
      description: The version.
      type: str
      sample: "2023.06"
    prefix:
      description: Its C(EESSI_PREFIX), C(<eessi_root>/versions/<version>).
      type: str
    prefix_exists:
      description: Whether the prefix is a directory on this node.
      type: bool
    archdetect:
      description:
        - The C(eessi_archdetect.sh) the guard runs, found as the guard finds it (C($EESSI_INIT_PREFIX),
          else C(<prefix>/init)); null when there is none.
      type: str
    cpupath:
      description:
        - The candidates of C(eessi_archdetect.sh -a cpupath), most specific first; null when archdetect
          failed.
      type: list
      elements: str
      sample: ["x86_64/amd/zen3", "x86_64/amd/zen2", "x86_64/generic"]
    accelpath:
      description:
        - The accelerator archdetect's C(accelpath) names (C(accel/nvidia/ccNN) or C(accel/amd/gfxNNN)); null
          for none, or when archdetect failed.
      type: str
    target:
      description:
        - The CPU target the guard selects, the first candidate with a software directory; null when none
          has one.
      type: str
      sample: x86_64/amd/zen3
    accel:
      description: The accelerator the guard takes the node to have once a target is selected; null otherwise.
      type: str
    software_dir:
      description:
        - C(<prefix>/software/linux/<target>/software), or with no target that of the first candidate; null
          when archdetect failed.
      type: str
    software_dir_exists:
      description: Whether RV(eessi[].software_dir) is a directory.
      type: bool
    problem:
      description: Null, or the guard's token, namely V(no-software-dir), V(archdetect-failed) or V(timeout).
      type: str
    detail:
      description:
        - The guard's detail for RV(eessi[].problem) (what archdetect said, or where no directory was); null
          without a problem.
      type: str
targets:
  description: The target of each version reported, null where there is none.
  returned: success
  type: dict
  sample: {"2023.06": "x86_64/amd/zen3", "2025.06": null}
problems:
  description: The token of each version that has a problem; empty when none has.
  returned: success
  type: dict
  sample: {"2025.06": "no-software-dir"}
guard:
  description:
    - The arch_guard role's install under O(prefix).
    - Nothing installed there is RV(guard.installed) false with RV(guard.problem) null; a part missing, or a
      C(release.json) that cannot be read, is false with the problem.
  returned: success
  type: dict
  contains:
    prefix:
      description: O(prefix), normalized.
      type: str
    installed:
      description:
        - Whether the code, the launcher, a valid C(release.json) and the interpreter it names are all there.
      type: bool
    version:
      description: The collection version C(release.json) names; null when not read.
      type: str
    digest:
      description: The SHA-256 (hex) of the installed code that C(release.json) names; null when not read.
      type: str
    python:
      description: The interpreter the launcher runs, from C(release.json); null when not read.
      type: str
    launcher:
      description: C(<prefix>/bin/eessi-arch-guard) when it is an executable file, else null.
      type: str
    code:
      description:
        - The directory of the guard's code, C(<prefix>/lib/current/hpcstack_ops); null when it
          is not a directory.
      type: str
    problem:
      description: What is wrong with the install, in one line; null when it is whole or absent.
      type: str
  sample:
    prefix: /opt/hpcstack/arch-guard
    installed: true
    version: 0.1.0
    digest: 9f2c5e0d6c1e4a0b8d7f3a2e1c0b9a8f7e6d5c4b3a291807f6e5d4c3b2a19080
    python: /usr/bin/python3
    launcher: /opt/hpcstack/arch-guard/bin/eessi-arch-guard
    code: /opt/hpcstack/arch-guard/lib/current/hpcstack_ops
    problem: null
lmod:
  description: The Lmod a reload would run.
  returned: success
  type: dict
  contains:
    cmd:
      description: Its path; null when none was given or found.
      type: str
    executable:
      description: Whether it is an executable file, the guard's test (else it reports V(lmod-unavailable)).
      type: bool
    source:
      description: Where it came from, namely V(option), V(environment), V(search), or null.
      type: str
  sample: {"cmd": "/usr/share/lmod/lmod/libexec/lmod", "executable": true, "source": "search"}
tmpdir:
  description: O(tmpdir), or null.
  returned: success
  type: str
cache_dir:
  description:
    - The directory the guard would put its step cache and the restore helper's work directories in.
    - Null when neither the job's C(TMPDIR) nor C(/tmp) is trusted (then the guard keeps no cache
      and a reload ends C(restore-failed)).
  returned: success
  type: str
  sample: /tmp
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import nodeinfo
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Terminated
from ansible_collections.hpcstack.ops.plugins.module_utils.common.printable import unicode_result

OPTIONS = ("eessi_root", "versions", "prefix", "lmod_cmd", "tmpdir", "job_env", "timeout")


def main():
    module = AnsibleModule(
        argument_spec={
            "eessi_root": {"type": "path", "default": nodeinfo.DEFAULT_EESSI_ROOT},
            "versions": {"type": "list", "elements": "str"},
            "prefix": {"type": "path", "default": nodeinfo.DEFAULT_GUARD_PREFIX},
            "lmod_cmd": {"type": "path"},
            "tmpdir": {"type": "path"},
            "job_env": {"type": "dict"},
            "timeout": {"type": "float", "default": nodeinfo.DEFAULT_TIMEOUT_SECONDS},
        },
        supports_check_mode=True,
    )
    try:
        # Reads only, so the same in check mode.
        result = nodeinfo.node_report(**{name: module.params[name] for name in OPTIONS})
    except (nodeinfo.NodeInfoError, Terminated) as err:
        module.fail_json(**unicode_result({"msg": str(err)}))
    module.exit_json(**unicode_result(result))


if __name__ == "__main__":
    main()
