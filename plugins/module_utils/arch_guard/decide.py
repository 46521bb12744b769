# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's decision for one task, from the environment it arrived with.

The steps, each of which can end it: disabled, EESSI not loaded, archdetect, the target
EESSI would select here, already matching, EESSI's module among the loaded ones, module
names, Lmod (this node's family's, when the job's is of another: ``family``), the restore
helper, and whether the delta can be carried in the output mode. A failure exports only
EESSI_ARCH_GUARD_FAILED: the task keeps its environment, which may still run here.
"""

from __future__ import annotations

import re

from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import Terminated
from ..common.printable import printable as escaped
from . import archdetect, emit, envdelta, family, restore, settings
from .decision import (
    ARCHDETECT_FAILED,
    FAIL,
    FAILED_MARKER,
    LMOD_UNAVAILABLE,
    NO_COMPAT_LAYER,
    NO_EESSI_MODULE,
    NO_SOFTWARE_DIR,
    RELOAD,
    RELOADED_MARKER,
    RESTORE_FAILED,
    TERMINATED,
    TIMEOUT,
    UNSAFE_ENVIRONMENT,
    UNSAFE_MODULE_NAME,
    Decision,
    skip,
)

# Names the helper passes to Lmod: a module path of plain components, nothing a shell or
# Lmod could read as an option or a pattern.
_MODULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*\Z")

_REMEDY = "add 'module reset' to the job script or submit with --export=NONE"
_NO_LAYER_REMEDY = "run the job on nodes of a CPU family that EESSI supports"
# EESSI module's own overrides, which archdetect does not read: set in a job, they were the
# user's or the site's choice, and the reload keeps them (EESSI's module reads them again).
MODULE_OVERRIDES = (
    family.CPU_FAMILY_OVERRIDE,
    "EESSI_ACCEL_SOFTWARE_SUBDIR_OVERRIDE",
    "EESSI_VERSION_OVERRIDE",
)
_EESSI_MODULE = re.compile(r"EESSI/[^/]+\Z")


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
    """``text`` as one short line, escaped as every value shown to people is
    (``common.printable``): labels end up in marker values and messages."""
    text = escaped(text)
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 3] + "..."


def decide(env, mode: str, deadline: Deadline) -> Decision:
    """The decision for a task whose environment is ``env``, to be emitted in ``mode``."""
    early = settings.early_skip(env)
    if early is not None:
        return early
    was = Node(env["EESSI_SOFTWARE_SUBDIR"], env.get("EESSI_ACCEL_SUBDIR"))
    try:
        return _decide_loaded(env, mode, was, deadline)
    except DeadlineExceeded as err:
        return interrupted(env, TIMEOUT, f"{err}", f"gave up after {deadline.seconds:g} s")
    except Terminated as err:
        return interrupted(env, TERMINATED, f"{err}", "was terminated")


def interrupted(env, token: str, detail: str, problem: str) -> Decision:
    """The failure for a decision cut short (TIMEOUT or TERMINATED): never cached."""
    was = Node(env.get("EESSI_SOFTWARE_SUBDIR", ""), env.get("EESSI_ACCEL_SUBDIR"))
    return _failed(was, token, detail, problem)


def _decide_loaded(env, mode, was: Node, deadline) -> Decision:
    node = family.node_family(env)
    try:
        # Without the job's compatibility layer of another family on PATH: archdetect's
        # helpers (uname, grep, ...) would be found there, and refused by the kernel.
        detection = archdetect.detect(family.runnable(env, node), deadline)
    except archdetect.ArchdetectFailed as err:
        return _failed(was, ARCHDETECT_FAILED, str(err), "could not detect this node's CPU")
    target = archdetect.select_target(detection.candidates, env.get("EESSI_PREFIX"))
    if target is None:
        return _failed(
            was,
            NO_SOFTWARE_DIR,
            no_software_detail(detection.candidates, env.get("EESSI_PREFIX")),
            f"EESSI has no software for this node ({printable(':'.join(detection.candidates))})",
        )
    now = Node(target, detection.accel)
    respected = respected_overrides(detection, env)
    if now == was:
        return skip(f"target already matches this node{respected}")
    modules = [name for name in env.get("LOADEDMODULES", "").split(":") if name]
    lmod = family.lmod_for_node(env.get("LMOD_CMD", ""), node)
    refused = _cannot_reload(env, modules, was=was, now=now) or _no_lmod(env, lmod, node, was=was, now=now)
    if refused is not None:
        return refused
    reloaded = _reload(env, mode, deadline, was=was, now=now, modules=modules, lmod=lmod, node=node)
    if reloaded.action != RELOAD:
        return reloaded
    note = _family_note(env, target, lmod) + respected
    return Decision(reloaded.action, reloaded.detail + note, reloaded.changes, reloaded.message)


def _family_note(env, target: str, lmod: family.NodeLmod) -> str:
    """The detail's note of a change of CPU family, and of the Lmod it took ("" when none)."""
    was_family, now_family = family.job_family(env), family.eessi_family(env, target)
    note = f"; CPU family {was_family}->{now_family}" if was_family and was_family != now_family else ""
    if lmod.init is not None:
        note += f"; Lmod of this node's family: {lmod.command} (the job's is in {lmod.job_layer})"
    return escaped(note)


def _no_lmod(env, lmod: family.NodeLmod, node: str, *, was: Node, now: Node):
    """The failure when no Lmod can reload here, else None: the job's is of another family
    and this node's family has none where EESSI's layout puts it, or it is not executable."""
    if lmod.missing is not None:
        return _failed(
            was,
            NO_COMPAT_LAYER,
            f"LMOD_CMD ({env.get('LMOD_CMD')}) is in {lmod.job_layer}, which cannot run on this "
            f"{node} node, and {lmod.missing} is not there",
            f"EESSI has no compatibility layer for this node's CPU family ({printable(node)}), and "
            f"the job's Lmod (in {printable(lmod.job_layer or '')}) cannot run here",
            now,
            remedy=_NO_LAYER_REMEDY,
        )
    if lmod.init is None and restore.lmod_command(env) is None:
        where = env.get("LMOD_CMD") or "unset"
        return _failed(
            was,
            LMOD_UNAVAILABLE,
            f"LMOD_CMD ({where}) is not an executable file",
            "Lmod is not available",
            now,
        )
    return None


def _cannot_reload(env, modules, *, was: Node, now: Node):
    """The failure when the task's modules cannot be reloaded here, else None: no EESSI
    module to load again (EESSI sourced by init/bash), a name unsafe to pass to Lmod."""
    if not any(_EESSI_MODULE.match(name) for name in modules):
        init = f"{env.get('EESSI_PREFIX') or '$EESSI_PREFIX'}/init/bash"
        return _failed(
            was,
            NO_EESSI_MODULE,
            f"no EESSI module in LOADEDMODULES ({env.get('LOADEDMODULES', '')!r}): "
            "EESSI was started by sourcing init/bash",
            f"EESSI was started by sourcing init/bash, not by its module, so it cannot be "
            f"loaded again for {now.label(was)}",
            now,
            remedy=f"submit with --export=NONE and source {printable(init)} in the job script",
        )
    unsafe = [name for name in modules if not _MODULE_NAME.match(name)]
    if unsafe:
        return _failed(
            was,
            UNSAFE_MODULE_NAME,
            f"unsafe module name {unsafe[0]!r}",
            "a loaded module cannot be reloaded safely",
            now,
        )
    return None


def respected_overrides(detection: archdetect.Detection, env) -> str:
    """The detail's note of EESSI's overrides the job carries: those that decided the
    target, and those of EESSI's module (``MODULE_OVERRIDES``). The job's own choice, which
    the guard follows as EESSI's module does ("" when none was set)."""
    overrides = [*detection.overrides, *(f"{name}={env[name]}" for name in MODULE_OVERRIDES if env.get(name))]
    if not overrides:
        return ""
    return f"; {', '.join(map(printable, overrides))} respected as the job's own choice"


def no_software_detail(candidates, eessi_prefix) -> str:
    """The detail of NO_SOFTWARE_DIR: the candidates and where none had a software directory."""
    where = eessi_prefix or "an unset EESSI_PREFIX"
    return f"no software directory for any of {':'.join(candidates)} under {where}"


def _reload(
    env, mode, deadline, *, was: Node, now: Node, modules, lmod: family.NodeLmod, node: str
) -> Decision:
    start = family.before_eessi(env, node)
    try:
        report = restore.reload_modules(env, modules, deadline, lmod=lmod, start=start)
    except restore.ModuleLoadFailed as err:
        return _failed(
            was,
            now.label(was),
            str(err),
            f"module {printable(err.module)} cannot be loaded for {now.label(was)}",
            now,
        )
    except restore.RestoreFailed as err:
        return _failed(was, RESTORE_FAILED, str(err), f"reloading EESSI for {now.label(was)} failed", now)
    return from_report(env, mode, report, was=was, now=now, restarted=start)


def from_report(env, mode, report: restore.Report, *, was: Node, now: Node, restarted=()) -> Decision:
    """The decision once the helper reported: the delta with its markers, if it can be carried."""
    reloaded = report.after.get("EESSI_SOFTWARE_SUBDIR", "")
    if reloaded != now.cpu:
        return _failed(
            was,
            RESTORE_FAILED,
            f"after the reload EESSI_SOFTWARE_SUBDIR is {reloaded!r}, not {now.cpu!r}",
            f"reloading EESSI for {now.label(was)} failed",
            now,
        )
    transition = f"{was.label(now)}->{now.label(was)}"
    changes = envdelta.compute(env, report.before, report.after, restarted)
    changes.append((RELOADED_MARKER, transition))
    if FAILED_MARKER in env:
        changes.append((FAILED_MARKER, None))
    carried, unsafe = emit.carry(changes, mode)
    if carried is None:
        return _failed(
            was, UNSAFE_ENVIRONMENT, unsafe, "the reloaded environment cannot be passed to the task", now
        )
    return Decision(
        RELOAD,
        f"reloaded {transition}",
        carried,
        f"eessi-arch-guard: reloaded EESSI for {now.label(was)} (job environment was {was.label(now)})",
    )


def _failed(was: Node, token: str, detail: str, problem: str, now=None, *, remedy: str = _REMEDY) -> Decision:
    """EESSI_ARCH_GUARD_FAILED=<was>-><token>; the task's environment is otherwise kept."""
    was_label = was.label(now)
    return Decision(
        FAIL,
        detail,
        [(FAILED_MARKER, f"{was_label}->{token}")],
        f"eessi-arch-guard: {problem}; the job keeps its {was_label} environment, "
        f"which may not run on this node: {remedy}",
    )
