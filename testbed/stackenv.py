"""Where the real Lmod and EasyBuild are, and the environments that drive them.

Shared by the integration-test harness and ``make demo``, so both run EasyBuild the same
way: Lmod as the modules tool, Lua module files, sources and easyconfigs from local
directories (nothing is downloaded), all state under a prefix the caller owns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Debian's and Ubuntu's lmod package; LMOD_PKG (set by Lmod's init) names others.
_LMOD_PREFIXES = ("/usr/share/lmod/lmod",)


class StackError(Exception):
    """A real component the caller needs is missing or unusable."""


@dataclass(frozen=True)
class Lmod:
    init: Path  # the bash init script that defines `module`
    cmd: Path  # $LMOD_CMD

    def env(self, modulepath: list[Path] | tuple[Path, ...] = (), base: dict | None = None) -> dict:
        """An environment in which ``$LMOD_CMD`` works and ``MODULEPATH`` is exactly ``modulepath``."""
        env = dict(os.environ if base is None else base)
        env["LMOD_CMD"] = str(self.cmd)
        env["MODULEPATH"] = ":".join(str(p) for p in modulepath)
        # Lmod's spider cache would otherwise remember module trees of earlier runs.
        env["LMOD_IGNORE_CACHE"] = "1"
        for stale in ("LOADEDMODULES", "_LMFILES_", "LMOD_RC", "LMOD_PACKAGE_PATH"):
            env.pop(stale, None)
        for name in list(env):
            if name.startswith(("_ModuleTable", "__LMOD_REF_COUNT")):
                del env[name]
        return env

    def shell_command(self, script: str) -> list[str]:
        """``bash -c`` with ``module`` defined, for a script that uses it."""
        return ["bash", "--noprofile", "--norc", "-c", f'. "{self.init}" && {script}']


def find_lmod() -> Lmod:
    candidates = []
    if os.environ.get("LMOD_PKG"):
        candidates.append(Path(os.environ["LMOD_PKG"]))
    candidates.extend(Path(p) for p in _LMOD_PREFIXES)
    for prefix in candidates:
        init, cmd = prefix / "init" / "bash", prefix / "libexec" / "lmod"
        if init.is_file() and os.access(cmd, os.X_OK):
            return Lmod(init=init, cmd=cmd)
    raise StackError(
        "Lmod not found (looked in " + ", ".join(map(str, candidates)) + "); install the 'lmod' package"
    )


def find_eb() -> Path:
    """The ``eb`` of the running interpreter's environment (the project's .venv)."""
    eb = Path(sys.executable).parent / "eb"
    if not os.access(eb, os.X_OK):
        found = shutil.which("eb")
        if found is None:
            raise StackError(f"no eb next to {sys.executable} or on PATH; run tools/bootstrap.sh")
        eb = Path(found)
    return eb


def easybuild_env(
    lmod: Lmod,
    *,
    prefix: Path,
    installpath: Path,
    sources: Path,
    easyconfigs: Path,
    base: dict | None = None,
) -> dict:
    """EASYBUILD_* settings for an offline build into ``installpath``.

    ``prefix`` holds EasyBuild's own state (build dirs, repository, temp files); only the
    install path's module tree is on ``MODULEPATH``, so dependencies resolve there.
    """
    env = lmod.env([installpath / "modules" / "all"], base=base)
    for name in list(env):
        if name.startswith("EASYBUILD_"):
            del env[name]
    eb_bin = str(find_eb().parent)
    env["PATH"] = eb_bin + os.pathsep + env.get("PATH", os.defpath)
    # The eb wrapper picks the first python3 on PATH unless told which one to use.
    env["EB_PYTHON"] = sys.executable
    env.update(
        {
            "EASYBUILD_MODULES_TOOL": "Lmod",
            "EASYBUILD_MODULE_SYNTAX": "Lua",
            "EASYBUILD_PREFIX": str(prefix),
            "EASYBUILD_BUILDPATH": str(prefix / "build"),
            "EASYBUILD_TMPDIR": str(prefix / "tmp"),
            "EASYBUILD_REPOSITORYPATH": str(prefix / "ebfiles_repo"),
            "EASYBUILD_INSTALLPATH": str(installpath),
            "EASYBUILD_SOURCEPATH": str(sources),
            "EASYBUILD_ROBOT_PATHS": str(easyconfigs),
        }
    )
    if os.geteuid() == 0:
        env["EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES"] = "1"
    return env


# How much of a failed command's output its error shows, from each stream's end.
OUTPUT_TAIL = 3000


def run_checked(label: str, argv: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` (no input, output captured as text); a non-zero exit raises ``RuntimeError``
    naming ``label``, the command's start and the end of what it printed."""
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{label}: {' '.join(str(arg) for arg in argv[:6])} ... exited {done.returncode}:\n"
            + done.stdout[-OUTPUT_TAIL:]
            + done.stderr[-OUTPUT_TAIL:]
        )
    return done
