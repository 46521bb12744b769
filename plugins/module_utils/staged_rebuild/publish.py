# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Publish a planned run: every directory swap first, then module files and class links.

The swap of one directory is atomic (RENAME_EXCHANGE, or the restoring three-rename
fallback); a run of several modules is not one atomic operation. What makes it safe is the
reversal: if any swap, module write, class-link operation or journal write fails, every
completed operation is reversed, newest first (``transaction.Transaction``), and the run
ends ``failed`` with every live directory and module file as it was. The same inverse
operations serve ``rollback``.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

from . import ledger, operations
from .journal import Journal, RunState, StepKind, step_name
from .ledger import LedgerConfig
from .paths import Trees
from .transaction import Transaction, exchange_journaled


def _apply(transaction: Transaction, trees: Trees) -> None:
    """The forward operations of a publish, in the design's order."""
    journal = transaction.journal
    for entry in journal.modules:
        transaction.run(
            step_name(StepKind.SWAP, entry),
            partial(exchange_journaled, journal, entry),
            partial(operations.exchange, trees, entry),
        )
    for entry in journal.modules:
        transaction.run(
            step_name(StepKind.MODULE, entry),
            partial(operations.write_module, trees, entry),
            partial(operations.restore_module, trees, entry),
        )
        for module_class in entry.class_links:
            # What the link was is journaled (with the step) before the link changes, so that a
            # crash right after the change still leaves resume the target to put back.
            previous = operations.current_class_link(trees, entry, module_class)
            entry.class_link_previous[module_class] = previous
            transaction.run(
                step_name(StepKind.CLASS_LINK, entry, module_class),
                partial(operations.set_class_link, trees, entry, module_class),
                partial(operations.restore_class_link, trees, entry, module_class, previous),
            )


def publish(journal: Journal, trees: Trees, ledger_config: Optional[LedgerConfig] = None) -> None:
    """Run the forward operations; on any error reverse them all and raise PublishError."""
    transaction = Transaction(journal)
    try:
        journal.set_state(RunState.PUBLISHING)
        _apply(transaction, trees)
        if ledger_config:
            # The length before the append is journaled first: resume cuts a crashed run's lines.
            length = ledger.length(ledger_config)
            transaction.run(
                step_name(StepKind.LEDGER),
                partial(ledger.append_run, ledger_config, journal),
                partial(ledger.truncate, ledger_config, length),
                ledger_length=length,
            )
        journal.faults.before("state published")
        journal.set_state(RunState.PUBLISHED)
    except BaseException as err:
        transaction.abort(
            err, "publish", RunState.FAILED, RunState.PUBLISHING, "every completed step was reversed"
        )
