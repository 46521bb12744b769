# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Roll a published run back: module files and class links restored, then every retired
directory exchanged back into its stable path, in reverse publish order.

A failed rollback reverses its own completed operations, so the published tree stays live
and the run stays ``published``. Rolling back a run that is already rolled back changes
nothing.
"""

from __future__ import annotations

import stat
from functools import partial
from typing import Any, Dict

from ..common import errors
from . import fsutil, operations
from .journal import Journal, ModuleEntry, RunKind, RunState, StepKind, step_name
from .paths import Trees
from .transaction import Transaction, exchange_journaled


def _require_still_live(journal: Journal, entry: ModuleEntry) -> None:
    """Only the tree this run published may be exchanged back: a later run over the same
    module would otherwise have the original put live under its feet, and this run's sibling
    would end up holding the later run's tree."""
    # Read from the software root down, never through a link (fsutil.lstat_below).
    software = journal.trees.software
    retired = entry.retired_path
    found = fsutil.lstat_below(retired, software)
    if found is None or not stat.S_ISDIR(found.st_mode):
        raise errors.UsageError(
            f"run {journal.run_id}: the retired tree {retired} is gone (collected by gc?)"
        )
    live = fsutil.lstat_below(entry.stable_path, software)
    if live is None or live.st_ino != entry.stage_ino:
        raise errors.UsageError(
            f"run {journal.run_id} is no longer live at {entry.stable_path}: a later run replaced it; "
            "roll that run back first"
        )


def check(journal: Journal) -> bool:
    """Refuse a rollback that cannot be done; False when the run is rolled back already."""
    if journal.run.kind is not RunKind.PUBLISH:
        raise errors.UsageError(
            f"run {journal.run_id} is a {journal.run.kind.value} record; use its own rollback"
        )
    if journal.state is RunState.ROLLED_BACK:
        return False
    if journal.state is not RunState.PUBLISHED:
        raise errors.UsageError(
            f"run {journal.run_id} is {journal.state.value}, not published; only a published run can be "
            "rolled back ('eb-staged-rebuild resume' finishes an interrupted one)"
        )
    for entry in journal.modules:
        _require_still_live(journal, entry)
    return True


def rollback(journal: Journal, trees: Trees) -> Dict[str, Any]:
    if not check(journal):
        return {"run_id": journal.run_id, "changed": False, "state": journal.state.value}
    transaction = Transaction(journal)
    entries = list(reversed(journal.modules))
    try:
        journal.set_state(RunState.ROLLING_BACK)
        for entry in entries:
            for module_class, previous in sorted(entry.class_link_previous.items()):
                transaction.run(
                    step_name(StepKind.ROLLBACK_CLASS_LINK, entry, module_class),
                    partial(operations.restore_class_link, trees, entry, module_class, previous),
                    partial(operations.set_class_link, trees, entry, module_class),
                )
            transaction.run(
                step_name(StepKind.ROLLBACK_MODULE, entry),
                partial(operations.restore_module, trees, journal.state_root, entry),
                partial(operations.write_module, trees, journal.state_root, entry),
            )
        for entry in entries:
            transaction.run(
                step_name(StepKind.ROLLBACK_SWAP, entry),
                partial(exchange_journaled, journal, entry),
                partial(operations.exchange, trees, entry),
            )
        journal.faults.before("state rolled_back")
        journal.set_state(RunState.ROLLED_BACK)
    except BaseException as err:
        transaction.abort(
            err, "rollback", RunState.PUBLISHED, RunState.ROLLING_BACK, "the published tree stays live"
        )
    return {"run_id": journal.run_id, "changed": True, "state": journal.state.value}
