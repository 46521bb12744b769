# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Finish what a crash interrupted, from the journal and the disk itself.

For every interrupted run: first an interrupted three-rename fallback gets its original
names back (the hold name says one was in flight); then the run returns to the old tree.
Whether a swap happened is read from the disk, not trusted to the journal: the live path
names the staged inode exactly when it was swapped. Likewise a module file is restored
exactly when it holds the new bytes. So resume is idempotent: a second run finds
everything old and changes nothing. A run that was still ``building`` is built again by
the caller (its request is in the journal).
"""

from __future__ import annotations

import os

from . import faults, ledger, modulefile, operations, swap
from . import journal as journals
from .publish import exchange_journaled


def _module_is_new(entry):
    if not entry.get("new_module_sha256") or not os.path.isfile(entry["module_file"]):
        return False
    with open(entry["module_file"], "rb") as handle:
        return modulefile.module_hash(handle.read()) == entry["new_module_sha256"]


def _is_swapped(entry):
    return entry.get("stage_ino") is not None and os.lstat(entry["stable_path"]).st_ino == entry["stage_ino"]


def return_to_old(journal, trees):
    """Put every live directory, module file and class link of ``journal`` back to the old tree."""
    actions = []
    for entry in reversed(journal.modules):
        if os.path.lexists(swap.hold_path(entry["retired_path"])):
            step = journal.start("resume recover-fallback " + entry["module"])
            actions.append(
                "{}: {}".format(
                    entry["module"], swap.recover_fallback(entry["retired_path"], entry["stable_path"])
                )
            )
            journal.finish(step)
        for module_class, previous in sorted(entry.get("class_link_previous", {}).items()):
            link = operations.class_link_path(trees, entry, module_class)
            current = os.readlink(link) if os.path.islink(link) else None
            if current != previous:
                step = journal.start("resume class-link {} {}".format(module_class, entry["module"]))
                operations.restore_class_link(trees, entry, module_class, previous)
                journal.finish(step)
                actions.append("{}: class link {} restored".format(entry["module"], module_class))
        if _module_is_new(entry):
            step = journal.start("resume module " + entry["module"])
            operations.restore_module(entry)
            journal.finish(step)
            actions.append("{}: module file restored".format(entry["module"]))
    config = journal.data.get("request", {}).get("ledger_config")
    ledger_steps = [step for step in journal.data["steps"] if step["step"] == "ledger"] if config else []
    for step in ledger_steps:
        if ledger.remove_run_records(ledger.load_config(config), step["ledger_length"], journal.run_id):
            actions.append("ledger records of the run removed")
    for entry in reversed(journal.modules):
        if _is_swapped(entry):
            step = journal.start("resume swap " + entry["module"])
            exchange_journaled(journal, faults.Faults(), entry)
            journal.finish(step)
            actions.append("{}: old tree back at {}".format(entry["module"], entry["stable_path"]))
    return actions


def resume_run(journal, trees, rebuild):
    """Resume one run; ``rebuild(journal)`` builds a ``building`` run again and publishes it."""
    if journal.state not in journals.INTERRUPTED:
        return {"run_id": journal.run_id, "state": journal.state, "changed": False, "actions": []}
    if journal.data["kind"] == "retire":
        note = f"retire record: 'eb-staged-rebuild rollback {journal.run_id}' resolves it"
        return {"run_id": journal.run_id, "state": journal.state, "changed": False, "actions": [note]}
    if journal.state == "building":
        result = rebuild(journal)
        result["actions"] = ["built again and published"]
        return result
    final = "rolled_back" if journal.state == "rolling_back" else "failed"
    actions = return_to_old(journal, trees)
    # A stage that was never swapped in goes, as for a refused run; one that may have been
    # live for a moment stays for gc's grace period, since a job may have started from it.
    swapped = any(step["step"].startswith("swap ") for step in journal.data["steps"])
    if final == "failed" and not swapped:
        operations.discard_stage(journal, trees.generation(journal.run_id))
    journal.data["resumed"] = journals.now()
    journal.set_state(final)
    return {"run_id": journal.run_id, "state": final, "changed": True, "actions": actions}
