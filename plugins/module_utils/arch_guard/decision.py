# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decision for one task: what to change in its environment and what to tell the user.

The same value is emitted as prolog lines or as shell code, and (per step) cached; it is
kept to plain data so reading a cached one needs nothing else.
"""

from __future__ import annotations

SKIP = "skip"
RELOAD = "reload"
FAIL = "fail"

RELOADED_MARKER = "EESSI_ARCH_GUARD_RELOADED"
FAILED_MARKER = "EESSI_ARCH_GUARD_FAILED"

# The tokens of a decision cut short: they say nothing about the step, so they are never
# cached for the step's other tasks.
TIMEOUT = "timeout"
TERMINATED = "terminated"

# The tokens of a decision that found no target for this node: archdetect gave no usable
# answer, or EESSI has no software directory for any of its candidates. The fleet report
# (nodeinfo) names the same ones.
ARCHDETECT_FAILED = "archdetect-failed"
NO_SOFTWARE_DIR = "no-software-dir"
# The job's Lmod is in the compatibility layer of another CPU family, and EESSI has no layer
# (no Lmod) for this node's: nothing can reload the job's modules here.
NO_COMPAT_LAYER = "no-compat-layer"
# The tokens of a decision that found a target and could not reload the job's EESSI for it.
UNSAFE_MODULE_NAME = "unsafe-module-name"
UNSAFE_ENVIRONMENT = "unsafe-environment"
LMOD_UNAVAILABLE = "lmod-unavailable"
RESTORE_FAILED = "restore-failed"
# EESSI started by sourcing init/bash: no module to load again, only the script to source.
NO_EESSI_MODULE = "no-eessi-module"
# Every token a failure marker can carry, in the order docs/reference/eessi-arch-guard.md
# lists them.
FAILURE_TOKENS = (
    NO_SOFTWARE_DIR,
    ARCHDETECT_FAILED,
    UNSAFE_MODULE_NAME,
    UNSAFE_ENVIRONMENT,
    LMOD_UNAVAILABLE,
    RESTORE_FAILED,
    TIMEOUT,
    TERMINATED,
    NO_EESSI_MODULE,
    NO_COMPAT_LAYER,
)


class Decision:
    """``action`` is SKIP, RELOAD or FAIL; ``detail`` is the reason VERBOSE writes.

    ``changes`` is the delta in order, ``(name, value)`` to export and ``(name, None)`` to
    unset; ``message`` is the sentence for the user ("" for none).
    """

    __slots__ = ("action", "changes", "detail", "message")

    def __init__(self, action: str, detail: str, changes=(), message: str = "") -> None:
        self.action = action
        self.detail = detail
        self.changes = tuple(changes)
        self.message = message

    def __eq__(self, other) -> bool:
        return isinstance(other, Decision) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.action, self.detail, self.changes, self.message))

    def __repr__(self) -> str:
        return f"Decision({self.action!r}, {self.detail!r}, {self.changes!r}, {self.message!r})"

    def as_dict(self) -> dict:
        return {
            "action": self.action,
            "detail": self.detail,
            "changes": [[name, value] for name, value in self.changes],
            "message": self.message,
        }


def skip(detail: str) -> Decision:
    return Decision(SKIP, detail)


def is_interrupted(decision: Decision) -> bool:
    """A TIMEOUT or TERMINATED failure."""
    return decision.action == FAIL and any(
        name == FAILED_MARKER and value is not None and value.endswith((f"->{TIMEOUT}", f"->{TERMINATED}"))
        for name, value in decision.changes
    )
