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
                   stopped before its module list was saved, or without its generation
                   directory, ends ``failed``: nothing of it was built, or it failed
                   when its journal could not be written)
planning           the old tree stays live; the stage is discarded
publishing         every swapped module swapped back; the run ends ``failed``
rolling_back       the same, back to the old tree; the run ends ``rolled_back``
retiring           nothing: ``rollback <run>`` resolves a retire record
queued             nothing while its batch job is pending or running (or the scheduler
                   cannot be asked); ended ``failed`` when the scheduler no longer knows
                   the job, or the run never got one
staged             nothing: ``publish <run>`` or ``discard <run>`` resolves it
=================  ==========================================================

A batch job's run stopped while ``building`` is not built again here: resume may run on
another node than the one of the job's CPU target. Its build is discarded and the run ends
``failed``, as a build that failed does.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Callable, Dict, List, Optional

from . import fsutil, ledger, modulefile, operations, swap
from .journal import INTERRUPTED, Journal, ModuleEntry, RunKind, RunState, StepKind, now, step_name
from .paths import Trees
from .transaction import Transaction, exchange_journaled

# Each state is read through the directories opened from the tree's root (fsutil.lstat_below,
# read_regular with a root): read through a swapped-in link, "not swapped" or "not the new
# module file" would end the run with the new tree still live.


def _module_is_new(trees: Trees, entry: ModuleEntry) -> bool:
    if not entry.new_module_sha256 or fsutil.lstat_below(entry.module_file, trees.modules) is None:
        return False
    data = fsutil.read_regular(entry.module_file, "module file", root=trees.modules)
    return modulefile.module_hash(data) == entry.new_module_sha256


def _is_swapped(trees: Trees, entry: ModuleEntry) -> bool:
    if entry.stage_ino is None:
        return False
    live = fsutil.lstat_below(entry.stable_path, trees.software)
    return live is not None and live.st_ino == entry.stage_ino


def return_to_old(journal: Journal, trees: Trees) -> List[str]:
    """Put every live directory, module file and class link of ``journal`` back to the old tree.

    Each change is a step of a transaction: when one fails (a full or read-only disk), the
    ones done are reversed and the run stays in its interrupted state, so that a failed
    resume leaves the trees as it found them (not some module files old under a new tree)
    and the next resume starts from the same disk.
    """
    actions = []
    transaction = Transaction(journal)
    try:
        for entry in reversed(journal.modules):
            if fsutil.lstat_below(swap.hold_path(entry.retired_path), trees.software) is not None:
                # A repair of names a crash left half-renamed, not a change to reverse.
                with journal.step(StepKind.RESUME_RECOVER_FALLBACK, entry):
                    recovered = swap.recover_fallback(
                        entry.retired_path, entry.stable_path, root=trees.software
                    )
                actions.append(f"{entry.module}: {recovered}")
            for module_class, previous in sorted(entry.class_link_previous.items()):
                current = operations.class_link_target(trees, entry, module_class)
                if current != previous:
                    transaction.run(
                        step_name(StepKind.RESUME_CLASS_LINK, entry, module_class),
                        partial(operations.restore_class_link, trees, entry, module_class, previous),
                        partial(operations.restore_class_link, trees, entry, module_class, current),
                    )
                    actions.append(f"{entry.module}: class link {module_class} restored")
            if _module_is_new(trees, entry):
                transaction.run(
                    step_name(StepKind.RESUME_MODULE, entry),
                    partial(operations.restore_module, trees, journal.state_root, entry),
                    partial(operations.write_module, trees, journal.state_root, entry),
                )
                actions.append(f"{entry.module}: module file restored")
        config = journal.request.ledger_settings()
        for step in journal.steps_of(StepKind.LEDGER) if config else []:
            if step.ledger_length is not None and ledger.remove_run_records(
                config, step.ledger_length, journal.run_id
            ):
                actions.append("ledger records of the run removed")
        for entry in reversed(journal.modules):
            if _is_swapped(trees, entry):
                transaction.run(
                    step_name(StepKind.RESUME_SWAP, entry),
                    partial(exchange_journaled, journal, entry),
                    partial(operations.exchange, trees, entry),
                )
                actions.append(f"{entry.module}: old tree back at {entry.stable_path}")
    except BaseException as err:
        state = journal.state
        transaction.abort(
            err, "resume", state, state, f"what it changed was reversed; the run stays {state.value}"
        )
    return actions


# Whether the scheduler still knows a job (pending or running): True, False, or None when
# it cannot be asked.
JobAlive = Callable[[str], Optional[bool]]


def _end_failed(journal: Journal, why: str) -> Dict[str, Any]:
    journal.run.resumed = now()
    journal.run.error = why
    journal.set_state(RunState.FAILED)
    return {
        "run_id": journal.run_id,
        "state": journal.state.value,
        "changed": True,
        "actions": [why + "; ended failed"],
    }


def _resume_queued(
    journal: Journal, job_alive: Optional[JobAlive], unchanged: Dict[str, Any]
) -> Dict[str, Any]:
    """A queued run waits for its job; one whose job the scheduler no longer knows (or that
    never got a job id: its submission failed half-way) ends ``failed``, nothing built."""
    job = journal.run.job
    job_id = job.job_id if job is not None else None
    if job_id is None:
        return _end_failed(journal, "it has no job: its submission did not finish")
    alive = job_alive(job_id) if job_alive is not None else None
    if alive is None:
        unchanged["actions"] = [f"queued for job {job_id}, whose state cannot be asked here; left queued"]
        return unchanged
    if alive:
        unchanged["actions"] = [f"queued for job {job_id}, which is pending or running"]
        return unchanged
    return _end_failed(journal, f"its job {job_id} ended before it started")


def _left_as_it_is(journal: Journal) -> List[str]:
    """What resolves a run resume leaves alone (a staged run, a retire record): nothing for a finished one."""
    if journal.state is RunState.STAGED:
        return [
            f"staged: 'eb-staged-rebuild publish {journal.run_id}' or 'eb-staged-rebuild discard "
            f"{journal.run_id}' resolves it"
        ]
    if journal.run.kind is RunKind.RETIRE and journal.state in INTERRUPTED:
        return [f"retire record: 'eb-staged-rebuild rollback {journal.run_id}' resolves it"]
    return []


def _resume_building(journal: Journal, rebuild: Callable[[Journal], Dict[str, Any]]) -> Dict[str, Any]:
    if not journal.modules:
        # Stopped between the journal's creation and its module list: nothing was built or
        # staged, and the live-change record was never taken, so nothing is built now either.
        return _end_failed(journal, "stopped before its modules were recorded: nothing built or published")
    generation = journal.trees.generation(journal.run_id)
    if not os.path.isdir(generation):
        # The generation directory is made before the build starts and discarded when a run
        # fails. Without it the run either stopped before its build, or failed when even its
        # journal could not say so (a read-only or full state root): building it now would
        # publish a run that failed.
        return _end_failed(journal, "no build area: it failed or stopped before building; nothing published")
    if journal.run.job is not None:
        # Built again here, it would be built on this host, not on a node of its job's target.
        operations.discard_stage(journal, generation)
        return _end_failed(
            journal, f"its job {journal.run.job.job_id} stopped while building; its build was discarded"
        )
    result = rebuild(journal)
    result["actions"] = ["built again and " + result["state"]]
    return result


def resume_run(
    journal: Journal,
    rebuild: Callable[[Journal], Dict[str, Any]],
    job_alive: Optional[JobAlive] = None,
) -> Dict[str, Any]:
    """Resume one run; ``rebuild(journal)`` builds a ``building`` run again and publishes it;
    ``job_alive(job_id)`` says whether a queued run's job is still pending or running."""
    unchanged: Dict[str, Any] = {
        "run_id": journal.run_id,
        "state": journal.state.value,
        "changed": False,
        "actions": [],
    }
    if journal.state is RunState.QUEUED:
        return _resume_queued(journal, job_alive, unchanged)
    if journal.state not in INTERRUPTED or journal.run.kind is RunKind.RETIRE:
        unchanged["actions"] = _left_as_it_is(journal)
        return unchanged
    if journal.state is RunState.BUILDING:
        return _resume_building(journal, rebuild)
    final = RunState.ROLLED_BACK if journal.state is RunState.ROLLING_BACK else RunState.FAILED
    trees = journal.trees
    actions = return_to_old(journal, trees)
    # A stage that was never swapped in goes, as for a refused run; one that may have been
    # live for a moment stays for gc's grace period, since a job may have started from it.
    if final is RunState.FAILED and not journal.steps_of(StepKind.SWAP):
        operations.discard_stage(journal, trees.generation(journal.run_id))
    journal.run.resumed = now()
    if final is RunState.FAILED:
        journal.run.error = f"stopped while {journal.state.value}; resume reversed it"
    journal.set_state(final)
    return {"run_id": journal.run_id, "state": final.value, "changed": True, "actions": actions}
