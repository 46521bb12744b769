# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Finish what a crash interrupted, from the journal and the disk itself.

For every interrupted run: first an interrupted three-rename fallback gets its original
names back (the hold name says one was in flight); then the run returns to the old tree.
Whether a swap happened is read from the disk, not trusted to the journal: the live path
names the staged inode exactly when it was swapped. Likewise a module file is restored
exactly when it holds the new bytes. So resume is idempotent: a second run finds
everything old and changes nothing. A run that was still ``building`` (a crash, not an
error: a rebuild that fails ends its run ``failed``) is built again by the caller (its
request is in the journal). A ``failed`` run is never built or published again.

=================  ==========================================================
state              what resume does
=================  ==========================================================
building           built again from the journal's request, then published (a run
                   stopped before its module list was saved ends ``failed``: nothing
                   of it was built)
planning           the old tree stays live; the stage is discarded
publishing         every swapped module swapped back; the run ends ``failed``
rolling_back       the same, back to the old tree; the run ends ``rolled_back``
retiring           nothing: ``rollback <run>`` resolves a retire record
=================  ==========================================================
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List

from . import fsutil, ledger, modulefile, operations, swap
from .journal import INTERRUPTED, Journal, ModuleEntry, RunKind, RunState, StepKind, now
from .paths import Trees
from .transaction import exchange_journaled


def _module_is_new(entry: ModuleEntry) -> bool:
    if not entry.new_module_sha256 or not os.path.isfile(entry.module_file):
        return False
    return (
        modulefile.module_hash(fsutil.read_regular(entry.module_file, "module file"))
        == entry.new_module_sha256
    )


def _is_swapped(entry: ModuleEntry) -> bool:
    return entry.stage_ino is not None and os.lstat(entry.stable_path).st_ino == entry.stage_ino


def return_to_old(journal: Journal, trees: Trees) -> List[str]:
    """Put every live directory, module file and class link of ``journal`` back to the old tree."""
    actions = []
    for entry in reversed(journal.modules):
        if os.path.lexists(swap.hold_path(entry.retired_path)):
            with journal.step(StepKind.RESUME_RECOVER_FALLBACK, entry):
                recovered = swap.recover_fallback(entry.retired_path, entry.stable_path, root=trees.software)
            actions.append(f"{entry.module}: {recovered}")
        for module_class, previous in sorted(entry.class_link_previous.items()):
            link = operations.class_link_path(trees, entry, module_class)
            current = os.readlink(link) if os.path.islink(link) else None
            if current != previous:
                with journal.step(StepKind.RESUME_CLASS_LINK, entry, module_class):
                    operations.restore_class_link(trees, entry, module_class, previous)
                actions.append(f"{entry.module}: class link {module_class} restored")
        if _module_is_new(entry):
            with journal.step(StepKind.RESUME_MODULE, entry):
                operations.restore_module(trees, entry)
            actions.append(f"{entry.module}: module file restored")
    config = journal.request.ledger_settings()
    for step in journal.steps_of(StepKind.LEDGER) if config else []:
        if step.ledger_length is not None and ledger.remove_run_records(
            config, step.ledger_length, journal.run_id
        ):
            actions.append("ledger records of the run removed")
    for entry in reversed(journal.modules):
        if _is_swapped(entry):
            with journal.step(StepKind.RESUME_SWAP, entry):
                exchange_journaled(journal, entry)
            actions.append(f"{entry.module}: old tree back at {entry.stable_path}")
    return actions


def resume_run(journal: Journal, rebuild: Callable[[Journal], Dict[str, Any]]) -> Dict[str, Any]:
    """Resume one run; ``rebuild(journal)`` builds a ``building`` run again and publishes it."""
    unchanged: Dict[str, Any] = {
        "run_id": journal.run_id,
        "state": journal.state.value,
        "changed": False,
        "actions": [],
    }
    if journal.state not in INTERRUPTED:
        return unchanged
    if journal.run.kind is RunKind.RETIRE:
        unchanged["actions"] = [f"retire record: 'eb-staged-rebuild rollback {journal.run_id}' resolves it"]
        return unchanged
    if journal.state is RunState.BUILDING and not journal.modules:
        # Stopped between the journal's creation and its module list: nothing was built or
        # staged, and the live-change record was never taken, so nothing is built now either.
        journal.run.resumed = now()
        journal.set_state(RunState.FAILED)
        return {
            "run_id": journal.run_id,
            "state": journal.state.value,
            "changed": True,
            "actions": ["stopped before its modules were recorded: nothing built or published; ended failed"],
        }
    if journal.state is RunState.BUILDING:
        result = rebuild(journal)
        result["actions"] = ["built again and published"]
        return result
    final = RunState.ROLLED_BACK if journal.state is RunState.ROLLING_BACK else RunState.FAILED
    trees = journal.trees
    actions = return_to_old(journal, trees)
    # A stage that was never swapped in goes, as for a refused run; one that may have been
    # live for a moment stays for gc's grace period, since a job may have started from it.
    if final is RunState.FAILED and not journal.steps_of(StepKind.SWAP):
        operations.discard_stage(journal, trees.generation(journal.run_id))
    journal.run.resumed = now()
    journal.set_state(final)
    return {"run_id": journal.run_id, "state": final.value, "changed": True, "actions": actions}
