# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The delta: what a task's environment must change to become the restored one.

A change is ``(name, value)`` for an export and ``(name, None)`` for an unset. Values are
``str`` as ``os.environ`` holds them (undecodable bytes as surrogate escapes), so
``os.fsencode`` gives back the bytes the task had.
"""

from __future__ import annotations

# Shell state, or variables Slurm and the shell manage per task: carrying them from the
# helper's shell would overwrite the task's own (TMPDIR: slurmstepd creates it after the
# prolog, and an export would change which directory it creates).
OMITTED_NAMES = frozenset(
    (
        "_",
        "SHLVL",
        "PWD",
        "OLDPWD",
        "TMPDIR",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_XTRACEFD",
        "PS4",
        "BASH_ARGC",
        "BASH_ARGV",
        "BASH_LINENO",
        "BASH_SOURCE",
        "BASH_VERSINFO",
        "BASH_VERSION",
        "DIRSTACK",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "FUNCNAME",
        "GROUPS",
        "HOSTNAME",
        "HOSTTYPE",
        "IFS",
        "MACHTYPE",
        "OPTERR",
        "OPTIND",
        "OSTYPE",
        "PIPESTATUS",
        "PPID",
    )
)
OMITTED_PREFIXES = ("BASH_FUNC_", "SLURM_")

# Facts EESSI detects about the node it runs on and keeps in the environment, detecting them
# again only while they are unset (its SitePackage caches the driver's CUDA version for its
# GPU modules): one inherited from a login node would outlive the reload. The reload starts
# without them, and the task gets what this node's detection gave, or loses them.
NODE_FACTS = ("EESSI_CUDA_DRIVER_VERSION",)

# Names a bash child reads at start-up and acts on (a startup file, shell options, exported
# functions that would shadow the commands the helper runs). They are omitted from every
# delta, so dropping them from a child's environment changes nothing the task sees.
_SHELL_STARTUP_NAMES = ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "BASH_XTRACEFD", "PS4")


def is_omitted(name: str) -> bool:
    return name in OMITTED_NAMES or name.startswith(OMITTED_PREFIXES)


def child_environment(task_env) -> dict:
    """The task's environment without what would make a bash child run anything of its own."""
    return {
        name: value
        for name, value in task_env.items()
        if name not in _SHELL_STARTUP_NAMES and not name.startswith("BASH_FUNC_")
    }


def reload_environment(task_env) -> dict:
    """What the restore helper starts from: ``child_environment`` without the node facts, so
    that this node's own detection runs."""
    env = child_environment(task_env)
    for name in NODE_FACTS:
        env.pop(name, None)
    return env


def compute(task_env, before, after, restarted=()) -> list:
    """The changes that take ``task_env`` to the restored environment.

    ``before`` and ``after`` are the helper's environment before and after the reload, read
    by the same shell: comparing them (rather than ``task_env`` with ``after``) leaves out
    what the shell itself changed at start-up, such as dropping ``PS1`` or setting ``SHLVL``.
    The node facts, which the helper started without, and the names in ``restarted``, which
    it started with other values than the task's, are ``after``'s or none. Sorted by name,
    so equal inputs give equal output.
    """
    changes = []
    from_task = set(NODE_FACTS) | set(restarted)
    for name in sorted(set(before) | set(after) | from_task):
        if name in from_task:
            # The helper did not start with the task's value (reload_environment, or the
            # restart of another family's job): after holds this node's.
            if task_env.get(name) != after.get(name):
                changes.append((name, after.get(name)))
            continue
        if is_omitted(name) or before.get(name) == after.get(name):
            continue
        if name in after:
            if task_env.get(name) != after[name]:
                changes.append((name, after[name]))
        elif name in task_env:
            changes.append((name, None))
    return changes
