"""The guard's reference, written out independently of the code under test.

The tests compare the guard's behaviour with these lists and with a real bash, so that a
change to the code's own lists cannot go unnoticed.
"""

from __future__ import annotations

import subprocess

# "Variables the delta never includes", as the reference lists them.
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
PROMPTS = frozenset(("PS1", "PS2", "PS3", "PROMPT_COMMAND"))


def bash_env_after_eval(code: bytes, env: dict) -> dict:
    """The environment (bytes) of a real bash started with ``env`` after ``eval "$(code)"``.

    Raises AssertionError when bash fails or complains: the code must evaluate cleanly.
    """
    result = subprocess.run(
        ["/bin/bash", "--noprofile", "--norc", "-c", 'eval "$(</dev/stdin)" && exec /usr/bin/env -0'],
        input=code,
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    if (result.returncode, result.stderr) != (0, b""):
        raise AssertionError(f"bash exited {result.returncode}: {result.stderr!r}")
    return dict(record.split(b"=", 1) for record in result.stdout.split(b"\0")[:-1])
