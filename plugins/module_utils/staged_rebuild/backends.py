# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the build runs. ``installpath``: EasyBuild builds into the run's generation directory,
separate software and module trees beside the live ones, with no kernel sandbox.

The generation directory lies inside the live software root, so the finished install moves
next to the live one by rename. The build's output streams to the caller line by line
(progress) and is kept in full in the run directory.
"""

from __future__ import annotations

import os
import subprocess

from ..common import errors
from . import easybuild

UNSANDBOXED = (
    "eb-staged-rebuild: backend installpath: EasyBuild runs WITHOUT a sandbox; "
    "a hook that writes outside its install path is not contained (--backend bwrap|userns requires one)"
)
BUILD_LOG = "build.log"


def command(eb, eb_args, generation):
    return easybuild.staged_command(
        eb, eb_args, os.path.join(generation, "software"), os.path.join(generation, "modules")
    )


def environment(base):
    return easybuild.filter_env(base)


def run(argv, env, run_dir, progress):
    """Run the build; stream EasyBuild's step lines to ``progress``; keep the whole log."""
    log_path = os.path.join(run_dir, BUILD_LOG)
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                close_fds=True,
            )
        except OSError as err:
            raise errors.UsageError(f"cannot run {argv[0]}: {err.strerror}") from None
        with proc:
            for line in proc.stdout:
                log.write(line)
                if line.startswith("== ") and not line.startswith("== ..."):
                    progress(line.rstrip("\n"))
    if proc.returncode != 0:
        raise errors.PublishError(
            f"EasyBuild failed (exit {proc.returncode}); nothing was swapped; its log is {log_path}"
        )
    return log_path
