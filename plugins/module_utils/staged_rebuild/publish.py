# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Publish a planned run: every directory swap first, then module files and class links.

The swap of one directory is atomic (RENAME_EXCHANGE, or the restoring three-rename
fallback); a run of several modules is not one atomic operation. What makes it safe is the
reversal: if any swap, module write, class-link operation or journal write fails, every
completed operation is reversed, newest first, and the run ends ``failed`` with every live
directory and module file as it was. The same inverse operations serve ``rollback``.
"""

from __future__ import annotations

import contextlib

from ..common import errors
from . import ledger, operations, swap


class Transaction:
    """Journaled operations with their inverses; ``reverse()`` undoes the completed ones."""

    def __init__(self, journal, faults):
        self.journal = journal
        self.faults = faults
        self.undo = []

    def run(self, step, action, inverse, **fields):
        """Journal ``step`` (with ``fields``), run ``action``; remember ``inverse(result)``."""
        self.faults.before(step)
        entry = self.journal.start(step, **fields)
        result = action()
        self.undo.append((step, lambda: inverse(result)))
        self.faults.before("journal " + step)
        self.journal.finish(entry)
        return result

    def abort(self, err, what, state_reversed, state_stuck, consequence):
        """Reverse after ``err`` and raise the one-line error of ``what`` (publish, rollback).

        The run ends in ``state_reversed`` when every inverse worked, else in
        ``state_stuck`` (an interrupted state, for resume to finish from the disk).
        """
        failures = self.reverse()
        # If the journal itself fails, resume works from the disk and the last good journal.
        with contextlib.suppress(OSError):
            self.journal.set_state(state_stuck if failures else state_reversed)
        if failures:
            raise errors.PublishError(
                f"{what} of run {self.journal.run_id} failed ({err}) and reversing it failed too "
                f"({'; '.join(failures)}); run 'eb-staged-rebuild resume'"
            ) from err
        if isinstance(err, errors.HpcstackError) or not isinstance(err, Exception):
            raise err
        raise errors.PublishError(
            f"{what} of run {self.journal.run_id} failed: {err}; {consequence}"
        ) from err

    def reverse(self):
        """Undo every completed operation, newest first; report the ones that failed too."""
        failures = []
        while self.undo:
            step, inverse = self.undo.pop()
            try:
                entry = self.journal.start("undo " + step)
                inverse()
                self.journal.finish(entry)
            except Exception as err:  # keep reversing the others; report at the end
                failures.append(f"{step}: {err}")
        return failures


def apply(transaction, trees, entries):
    journal = transaction.journal
    """The forward operations of a publish, in the design's order."""
    for entry in entries:
        transaction.run(
            "swap " + entry["module"],
            lambda entry=entry: exchange_journaled(journal, transaction.faults, entry),
            lambda _method, entry=entry: operations.exchange(entry),
        )
    for entry in entries:
        transaction.run(
            "module " + entry["module"],
            lambda entry=entry: operations.write_module(entry),
            lambda _none, entry=entry: operations.restore_module(entry),
        )
        for module_class in entry.get("class_links", []):
            # What the link was is journaled (with the step) before the link changes, so that a
            # crash right after the change still leaves resume the target to put back.
            previous = operations.current_class_link(trees, entry, module_class)
            entry.setdefault("class_link_previous", {})[module_class] = previous
            transaction.run(
                f"class-link {module_class} {entry['module']}",
                lambda entry=entry, module_class=module_class: operations.set_class_link(
                    trees, entry, module_class
                ),
                lambda _previous, entry=entry, module_class=module_class, previous=previous: (
                    operations.restore_class_link(trees, entry, module_class, previous)
                ),
            )


def exchange_journaled(journal, faults, entry):
    """The swap, with each rename of the three-rename fallback journaled before it happens
    (resume reads them) and marked done when the next one starts or the swap returns."""
    started = []

    def on_step(name):
        if name == swap.STEP_EXCHANGE:
            return
        if started:
            journal.finish(started[-1])
        step = f"{name} {entry['module']}"
        faults.before(step)
        started.append(journal.start(step))

    method = operations.exchange(entry, on_step=on_step)
    if started:
        journal.finish(started[-1])
    return method


def publish(journal, trees, faults, ledger_config=None):
    """Run the forward operations; on any error reverse them all and raise PublishError."""
    transaction = Transaction(journal, faults)
    try:
        journal.set_state("publishing")
        apply(transaction, trees, journal.modules)
        if ledger_config:
            # The length before the append is journaled first: resume cuts a crashed run's lines.
            transaction.run(
                "ledger",
                lambda: ledger.append(ledger_config, ledger.records(journal, ledger_config)),
                lambda length: ledger.truncate(ledger_config, length),
                ledger_length=ledger.length(ledger_config),
            )
        faults.before("state published")
        journal.set_state("published")
    except BaseException as err:
        transaction.abort(err, "publish", "failed", "publishing", "every completed step was reversed")
