# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What EESSI's own detection says about this node, and the target EESSI would pick.

EESSI's ``eessi_archdetect.sh`` runs with the task's environment, so ``EESSI_PROC_CPUINFO``,
``EESSI_MACHINE_TYPE`` and EESSI's override variables act as they do when the EESSI module
runs it. Its stderr is captured, never passed on: in a TaskProlog it would be parsed as
directives.
"""

from __future__ import annotations

import os
import re

from ..common import proc
from ..common.deadline import Deadline
from . import envdelta

SCRIPT_NAME = "eessi_archdetect.sh"

# accelpath exits 2 without nvidia-smi and 3 when nvidia-smi fails ("No devices were
# found"): both mean this node has no accelerator.
NO_ACCELERATOR_EXITS = (2, 3)

# nvidia-smi's stderr can leak into accelpath's stdout, so only a line of this shape counts.
_ACCEL = re.compile(r"accel/(nvidia/cc[0-9]+|amd/gfx[0-9a-f]+)\Z")
# A target becomes a path component under the EESSI prefix: no '..', no absolute paths.
_TARGET = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_.+-]+)*\Z")


class ArchdetectFailed(Exception):
    """archdetect could not be found or run, or answered something unusable."""


# EESSI's overrides of its own detection, as a user or site sets them: archdetect answers
# the first and the last instead of looking at the node, and EESSI's module takes the second
# instead of running cpupath. A job that carries one from its login node made that choice.
SUBDIR_OVERRIDE = "EESSI_SOFTWARE_SUBDIR_OVERRIDE"
OPTIONS_OVERRIDE = "EESSI_ARCHDETECT_OPTIONS_OVERRIDE"
ACCEL_OVERRIDE = "EESSI_ACCELERATOR_TARGET_OVERRIDE"
OVERRIDES = (SUBDIR_OVERRIDE, OPTIONS_OVERRIDE, ACCEL_OVERRIDE)


class Detection:
    """``candidates``: the compatible CPU targets, most specific first; ``accel`` or None;
    ``overrides``: the ``NAME=value`` of each of EESSI's overrides that decided them."""

    __slots__ = ("accel", "candidates", "overrides")

    def __init__(self, candidates, accel, overrides=()) -> None:
        self.candidates = tuple(candidates)
        self.accel = accel
        self.overrides = tuple(overrides)


def find_script(env):
    """``$EESSI_INIT_PREFIX/eessi_archdetect.sh``, else ``$EESSI_PREFIX/init/eessi_archdetect.sh``."""
    places = []
    if env.get("EESSI_INIT_PREFIX"):
        places.append(os.path.join(env["EESSI_INIT_PREFIX"], SCRIPT_NAME))
    if env.get("EESSI_PREFIX"):
        places.append(os.path.join(env["EESSI_PREFIX"], "init", SCRIPT_NAME))
    for place in places:
        if os.path.isfile(place):
            return place
    raise ArchdetectFailed(f"no {SCRIPT_NAME} in " + (" or ".join(places) or "an unset EESSI_PREFIX"))


def bash_path(env) -> str:
    """The system's bash first: the script needs bash >= 4 whatever the task's PATH says."""
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = proc.find_program("bash", env.get("PATH", os.defpath))
    if found is None:
        raise ArchdetectFailed("no bash to run archdetect with")
    return found


def detect(env, deadline: Deadline) -> Detection:
    """Run ``-a cpupath`` and ``accelpath``; raise ArchdetectFailed with the reason.

    With ``EESSI_ARCHDETECT_OPTIONS_OVERRIDE`` set, its value is the candidates and cpupath
    does not run, as in EESSI's module.
    """
    script = find_script(env)
    argv = [bash_path(env), script]
    child_env = envdelta.child_environment(env)
    overrides = [f"{name}={env[name]}" for name in OVERRIDES if env.get(name)]
    options_override = env.get(OPTIONS_OVERRIDE)
    if options_override:
        answer = options_override
        (accelpath,) = _run([[*argv, "accelpath"]], child_env, deadline)
    else:
        # Both at once: two shells that each take as long as the other, on a node's CPUs.
        cpupath, accelpath = _run([[*argv, "-a", "cpupath"], [*argv, "accelpath"]], child_env, deadline)
        if cpupath.returncode != 0:
            raise ArchdetectFailed(_failure("-a cpupath", cpupath))
        answer = _answer(cpupath.stdout)
    candidates = answer.split(":")
    if not all(_TARGET.match(candidate) for candidate in candidates):
        if options_override:
            raise ArchdetectFailed(f"{OPTIONS_OVERRIDE} is {answer!r}, not a list of CPU targets")
        raise ArchdetectFailed(f"archdetect -a cpupath answered {answer!r}")
    if accelpath.returncode in NO_ACCELERATOR_EXITS:
        return Detection(candidates, None, overrides)
    accel = _accel_line(accelpath.stdout)
    if accelpath.returncode != 0 or accel is None:
        raise ArchdetectFailed(_failure("accelpath", accelpath))
    return Detection(candidates, accel, overrides)


def cpupath(script, env, deadline: Deadline) -> str:
    """``bash SCRIPT cpupath``'s answer: the one CPU target EESSI picks for this node, with
    ``env`` as the script reads it (its overrides included); ArchdetectFailed otherwise."""
    (result,) = _run([[bash_path(env), script, "cpupath"]], envdelta.child_environment(env), deadline)
    if result.returncode != 0:
        raise ArchdetectFailed(_failure("cpupath", result))
    answer = _answer(result.stdout)
    if not _TARGET.match(answer):
        raise ArchdetectFailed(f"archdetect cpupath answered {answer!r}")
    return answer


def select_target(candidates, eessi_prefix):
    """The first candidate with a software directory: the one the EESSI module would load."""
    if not eessi_prefix:
        return None
    for candidate in candidates:
        if os.path.isdir(os.path.join(eessi_prefix, "software", "linux", candidate, "software")):
            return candidate
    return None


def _run(argvs, env, deadline) -> list:
    try:
        return proc.run_children(argvs, env=env, deadline=deadline)
    except OSError as err:
        raise ArchdetectFailed(f"cannot run {argvs[0][1]}: {err.strerror}") from None


def _answer(output: bytes) -> str:
    """The last line: anything a tool printed before its answer is not the answer."""
    lines = os.fsdecode(output).strip().splitlines()
    return lines[-1].strip() if lines else ""


def _accel_line(output: bytes):
    for line in reversed(os.fsdecode(output).splitlines()):
        if _ACCEL.match(line.strip()):
            return line.strip()
    return None


def _failure(what: str, result: proc.ChildResult) -> str:
    said = proc.summary(result.stderr) or proc.summary(result.stdout) or "no output"
    return f"archdetect {what} exited {result.returncode}: {said}"
