# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's decision for one task, from the environment it arrived with.

The steps, each of which can end it: disabled, EESSI not loaded, archdetect, the target
EESSI would select here, already matching, module names, Lmod, the restore helper, and
whether the delta can be carried in the output mode. A failure exports only
EESSI_ARCH_GUARD_FAILED: the task keeps its environment, which may still run here.
"""

from __future__ import annotations

import re

from ..common import proc
from . import archdetect, emit, envdelta, restore
from .decision import FAIL, FAILED_MARKER, RELOAD, RELOADED_MARKER, Decision, skip

DEFAULT_TIMEOUT_SECONDS = 60.0
# A TaskProlog that runs for a day is a hung node, and larger values overflow the kernel's
# timeouts: they mean the default.
MAX_TIMEOUT_SECONDS = 86400.0
DISABLING_VALUES = frozenset(("0", "off", "no", "false"))

# Names the helper passes to Lmod: a module path of plain components, nothing a shell or
# Lmod could read as an option or a pattern.
_MODULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*\Z")

_REMEDY = "add 'module reset' to the job script or submit with --export=NONE"


class Node:
    """A CPU target and an accelerator (None for none), as EESSI names them."""

    __slots__ = ("accel", "cpu")

    def __init__(self, cpu: str, accel) -> None:
        self.cpu = cpu
        self.accel = accel or None

    def __eq__(self, other) -> bool:
        return isinstance(other, Node) and (self.cpu, self.accel) == (other.cpu, other.accel)

    def __hash__(self) -> int:
        return hash((self.cpu, self.accel))

    def label(self, other=None) -> str:
        """``<cpu>``, or ``<cpu> <accel>`` / ``<cpu> no accel`` when ``other``'s accelerator differs."""
        if other is None or other.accel == self.accel:
            return printable(self.cpu)
        return printable(f"{self.cpu} {self.accel or 'no accel'}")


LABEL_MAX = 200


def printable(text: str) -> str:
    """``text`` as one short line: labels end up in marker values and messages."""
    text = "".join(char if char.isprintable() else "?" for char in text)
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 3] + "..."


def timeout_seconds(env) -> float:
    try:
        seconds = float(env.get("EESSI_ARCH_GUARD_TIMEOUT", ""))
    except ValueError:
        return DEFAULT_TIMEOUT_SECONDS
    return seconds if 0 < seconds <= MAX_TIMEOUT_SECONDS else DEFAULT_TIMEOUT_SECONDS


def disabled_by(env):
    """The value of EESSI_ARCH_GUARD when it switches the guard off, else None."""
    value = env.get("EESSI_ARCH_GUARD")
    if value is not None and value.strip().lower() in DISABLING_VALUES:
        return value
    return None


def decide(env, mode: str, deadline: proc.Deadline) -> Decision:
    """The decision for a task whose environment is ``env``, to be emitted in ``mode``."""
    switch = disabled_by(env)
    if switch is not None:
        return skip(f"disabled by EESSI_ARCH_GUARD={switch}")
    if not env.get("EESSI_SOFTWARE_SUBDIR"):
        return skip("EESSI is not loaded (EESSI_SOFTWARE_SUBDIR is unset or empty)")
    was = Node(env["EESSI_SOFTWARE_SUBDIR"], env.get("EESSI_ACCEL_SUBDIR"))
    try:
        return _decide_loaded(env, mode, was, deadline)
    except proc.DeadlineExceeded as err:
        return _failed(was, "timeout", str(err), f"gave up after {deadline.seconds:g} s")


def _decide_loaded(env, mode, was: Node, deadline) -> Decision:
    try:
        detection = archdetect.detect(env, deadline)
    except archdetect.ArchdetectFailed as err:
        return _failed(was, "archdetect-failed", str(err), "could not detect this node's CPU")
    target = archdetect.select_target(detection.candidates, env.get("EESSI_PREFIX"))
    if target is None:
        candidates = ":".join(detection.candidates)
        prefix = env.get("EESSI_PREFIX") or "an unset EESSI_PREFIX"
        return _failed(
            was,
            "no-software-dir",
            f"no software directory for any of {candidates} under {prefix}",
            f"EESSI has no software for this node ({printable(candidates)})",
        )
    now = Node(target, detection.accel)
    if now == was:
        return skip("target already matches this node")
    modules = [name for name in env.get("LOADEDMODULES", "").split(":") if name]
    unsafe = [name for name in modules if not _MODULE_NAME.match(name)]
    if unsafe:
        return _failed(
            was,
            "unsafe-module-name",
            f"unsafe module name {unsafe[0]!r}",
            "a loaded module cannot be reloaded safely",
            now,
        )
    if restore.lmod_command(env) is None:
        where = env.get("LMOD_CMD") or "unset"
        return _failed(
            was,
            "lmod-unavailable",
            f"LMOD_CMD ({where}) is not an executable file",
            "Lmod is not available",
            now,
        )
    return _reload(env, mode, deadline, was=was, now=now, modules=modules)


def _reload(env, mode, deadline, *, was: Node, now: Node, modules) -> Decision:
    try:
        report = restore.reload_modules(env, modules, deadline)
    except restore.ModuleLoadFailed as err:
        return _failed(
            was,
            now.label(was),
            str(err),
            f"module {printable(err.module)} cannot be loaded for {now.label(was)}",
            now,
        )
    except restore.RestoreFailed as err:
        return _failed(was, "restore-failed", str(err), f"reloading EESSI for {now.label(was)} failed", now)
    return from_report(env, mode, report, was=was, now=now)


def from_report(env, mode, report: restore.Report, *, was: Node, now: Node) -> Decision:
    """The decision once the helper reported: the delta with its markers, if it can be carried."""
    reloaded = report.after.get("EESSI_SOFTWARE_SUBDIR", "")
    if reloaded != now.cpu:
        return _failed(
            was,
            "restore-failed",
            f"after the reload EESSI_SOFTWARE_SUBDIR is {reloaded!r}, not {now.cpu!r}",
            f"reloading EESSI for {now.label(was)} failed",
            now,
        )
    transition = f"{was.label(now)}->{now.label(was)}"
    changes = envdelta.compute(env, report.before, report.after)
    changes.append((RELOADED_MARKER, transition))
    if FAILED_MARKER in env:
        changes.append((FAILED_MARKER, None))
    carried, unsafe = emit.carry(changes, mode)
    if carried is None:
        return _failed(
            was, "unsafe-environment", unsafe, "the reloaded environment cannot be passed to the task", now
        )
    return Decision(
        RELOAD,
        f"reloaded {transition}",
        carried,
        f"eessi-arch-guard: reloaded EESSI for {now.label(was)} (job environment was {was.label(now)})",
    )


def _failed(was: Node, token: str, detail: str, problem: str, now=None) -> Decision:
    """EESSI_ARCH_GUARD_FAILED=<was>-><token>; the task's environment is otherwise kept."""
    was_label = was.label(now)
    return Decision(
        FAIL,
        detail,
        [(FAILED_MARKER, f"{was_label}->{token}")],
        f"eessi-arch-guard: {problem}; the job keeps its {was_label} environment, "
        f"which may not run on this node: {_REMEDY}",
    )
