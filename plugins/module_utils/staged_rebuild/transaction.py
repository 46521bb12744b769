# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Journaled operations with their inverses, and the journaled exchange of two directories.

A publish or a rollback is a sequence of reversible operations (``operations``). Each runs
as one journaled step (``Journal.step``); its inverse is remembered once it succeeded. When
any later operation, or a journal write, fails, ``abort`` runs the inverses newest first,
each journaled as ``undo <step>``, with SIGTERM held: a second SIGTERM must not cut the
reversal in half and leave a mix of old and new. What resume does after a crash in the
middle is in ``resume``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Tuple

from ..common import errors
from ..common.deadline import SigtermHeld
from . import operations, swap
from .journal import Journal, ModuleEntry, RunState, StepHandle, StepKind, StepName, step_name


class Transaction:
    """Journaled operations with their inverses; ``abort()`` undoes the completed ones."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.undo: List[Tuple[StepName, Callable[[], Any]]] = []

    def run(
        self, name: StepName, action: Callable[[], Any], inverse: Callable[[], Any], **fields: Any
    ) -> None:
        """Journal ``name`` (with ``fields``), run ``action``; remember ``inverse`` once it worked."""
        handle = self.journal.begin(name, **fields)
        action()
        self.undo.append((name, inverse))
        handle.done()

    def abort(
        self, err: BaseException, what: str, state_reversed: RunState, state_stuck: RunState, consequence: str
    ) -> None:
        """Reverse after ``err`` and raise the one-line error of ``what`` (publish, rollback).

        The run ends in ``state_reversed`` when every inverse worked, else in
        ``state_stuck`` (an interrupted state, for resume to finish from the disk).
        """
        with SigtermHeld():
            failures = self._reverse()
            state = state_stuck if failures else state_reversed
            if state is RunState.FAILED:
                self.journal.run.record_failure(err)
            # If the journal itself fails, resume works from the disk and the last good journal.
            with contextlib.suppress(OSError):
                self.journal.set_state(state)
        if failures:
            raise errors.PublishError(
                f"{what} of run {self.journal.run_id} failed ({errors.marked(err)}) "
                "and reversing it failed too "
                f"({'; '.join(failures)}); run 'eb-staged-rebuild resume'"
            ) from err
        if isinstance(err, errors.HpcstackError) or not isinstance(err, Exception):
            raise err
        raise errors.PublishError(
            f"{what} of run {self.journal.run_id} failed: {errors.marked(err)}; {consequence}"
        ) from err

    def _reverse(self) -> List[str]:
        """Undo every completed operation, newest first; report the ones that failed too."""
        failures = []
        while self.undo:
            name, inverse = self.undo.pop()
            try:
                with self.journal.step_named(name.undone()):
                    inverse()
            except Exception as err:  # keep reversing the others; report at the end
                failures.append(f"{name}: {err}")
        return failures


_FALLBACK_KINDS = {kind.value: kind for kind in StepKind if kind.value in swap.FALLBACK_STEPS}


def exchange_journaled(journal: Journal, entry: ModuleEntry) -> str:
    """The swap, with each rename of the three-rename fallback journaled before it happens
    (resume reads them) and marked done when the next one starts or the swap returns."""
    started: List[Optional[StepHandle]] = [None]

    def on_step(name: str) -> None:
        if name == swap.STEP_EXCHANGE:
            return
        if started[0] is not None:
            started[0].done()
        started[0] = journal.begin(step_name(_FALLBACK_KINDS[name], entry))

    method = operations.exchange(journal.trees, entry, on_step=on_step)
    if started[0] is not None:
        try:
            started[0].done()
        except BaseException:
            # The exchange is complete but not recorded, and the caller has no inverse for an
            # action that raised: exchange back here, so that its reversal starts from the
            # trees as they were (swap.exchange does the same for a failed on_step).
            operations.exchange(journal.trees, entry)
            raise
    return method
