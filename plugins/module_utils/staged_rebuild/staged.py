# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``publish`` and ``discard`` of staged runs: the runs of several trees, published together.

A run whose request publishes together (one per CPU target, each its own tree and state
root) stops ``staged`` after planning: its new tree beside the live one, nothing live
changed. ``publish_staged`` publishes a set of them as one decision: it takes the lock of
every state root (in sorted order, so that two such commands cannot each hold one lock the
other waits for), refuses unless every run is ``staged`` and still as planned (the stage
where planning left it, the live tree and module file unchanged since), and publishes each
in turn. When one publish fails (and reversed itself: ``publish.publish``), the runs this
command published before it are rolled back, each journaled as any rollback is; the others
stay ``staged``. ``discard_staged`` ends each run ``failed`` with its stage removed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..common import errors
from ..common.deadline import SigtermHeld
from . import fsutil, locking, modulefile, operations, paths, planner, rebuild, rollback
from . import journal as journals
from .faults import Faults
from .journal import Journal, RunKind, RunState

Progress = Callable[[str], None]
# The one line a discarded run records as why it ended failed.
DISCARDED = "discarded while staged: never published"


def _checked(runs: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """``runs`` with each state root absolute and normal; refused when empty, when a run id is
    no plain name or a state root has a link on its path, and when a run is named twice (its
    second publish would exchange its trees back)."""
    if not runs:
        raise errors.UsageError("no run given")
    checked = []
    for state_root, run_id in runs:
        paths.check_run_id(run_id)
        fsutil.refuse_symlink_components(state_root)
        run = (os.path.abspath(state_root), run_id)
        if run in checked:
            raise errors.UsageError(f"run {run_id} in {run[0]} is named twice")
        checked.append(run)
    return checked


def _state_roots(runs: Sequence[Tuple[str, str]]) -> List[str]:
    """The distinct state roots of ``runs``, sorted: the order their locks are taken in."""
    return sorted({state_root for state_root, _run_id in runs})


@contextlib.contextmanager
def _locked(state_roots: List[str], lock_timeout: float):
    """Every state root's lock, taken in the order given, released in reverse."""
    with contextlib.ExitStack() as stack:
        for state_root in state_roots:
            # Read first: a journal that does not load refuses before the lock file is written.
            journals.check_all(state_root)
            stack.enter_context(locking.StateLock(state_root, lock_timeout))
        yield


def _staged_journals(runs: Sequence[Tuple[str, str]], command: str) -> List[Journal]:
    """The journals of ``runs``, each a publish run in state ``staged``; else one refusal
    naming every run that is not (nothing is done to any)."""
    found = [journals.find(state_root, run_id) for state_root, run_id in runs]
    not_staged = [
        f"{journal.run_id} in {journal.state_root} is {journal.state.value}"
        for journal in found
        if journal.run.kind is not RunKind.PUBLISH or journal.state is not RunState.STAGED
    ]
    if not_staged:
        raise errors.UsageError(
            f"only staged runs can be {command}ed: run {'; run '.join(not_staged)}; nothing was {command}ed"
        )
    return found


def _module_file_unchanged(journal: Journal, entry: journals.ModuleEntry) -> bool:
    """The live module file is the one planning backed up (or there still is none)."""
    modules = journal.trees.modules
    if fsutil.lstat_below(entry.module_file, modules) is None:
        return entry.old_module_sha256 is None
    data = fsutil.read_regular(entry.module_file, "module file", root=modules)
    return modulefile.module_hash(data) == entry.old_module_sha256


def check_still_planned(journal: Journal) -> None:
    """Refuse (PublishError) a staged run whose trees moved since it was planned: its stage
    is no longer at its sibling path, the live tree is another, a live file or the module
    file changed. Publishing it would put live what no check saw."""
    trees = journal.trees
    for entry in journal.modules:
        if not operations.still_staged(trees, entry):
            raise errors.PublishError(
                f"run {journal.run_id}: {entry.retired_path} is no longer its stage beside the live "
                f"{entry.stable_path} as planned; nothing was published"
            )
        if not planner.has_build_evidence(entry.retired_path):
            raise errors.PublishError(
                f"run {journal.run_id}: {entry.retired_path} lost its build evidence (PAYLOAD or "
                "easybuild/*.eb); nothing was published"
            )
        planner.check_live(journal, entry)
        if not _module_file_unchanged(journal, entry):
            raise errors.PublishError(
                f"run {journal.run_id}: the module file {entry.module_file} changed since the run was "
                "planned; nothing was published"
            )


def publish_staged(
    runs: Sequence[Tuple[str, str]],
    lock_timeout: float,
    progress: Progress,
    faults: Optional[Mapping[str, Faults]] = None,
) -> Dict[str, Any]:
    """Publish every run of ``runs`` (``(state_root, run_id)`` pairs), all staged, under every
    state root's lock; ``{"published": [{"state_root", "run_id"}...], "runs": [summary...]}``.

    Refused, publishing nothing, unless every run is staged and still as planned. A publish
    that fails ends its own run ``failed`` (reversed); the runs published before it by this
    call are rolled back (``rolled_back``), the rest stay ``staged``, and the PublishError
    says all of that. ``faults`` (by state root) is for tests: each run's fault injection."""
    runs = _checked(runs)
    with _locked(_state_roots(runs), lock_timeout):
        staged = _staged_journals(runs, "publish")
        for journal in staged:
            check_still_planned(journal)
            if faults is not None and journal.state_root in faults:
                journal.faults = faults[journal.state_root]
        published: List[Journal] = []
        # One handler for the whole loop: a SIGTERM between two publishes rolls back too.
        try:
            for journal in staged:
                progress(f"publishing run {journal.run_id} in {journal.state_root}")
                rebuild.publish_planned(journal)
                published.append(journal)
        except BaseException as err:
            raise _publish_failed(err, published, staged) from err
        return {
            "changed": True,
            "published": [_ref(journal) for journal in published],
            "runs": [journals.summary(journal) for journal in staged],
        }


def _discard_unrecorded(journal: Journal, err: OSError) -> errors.JournalError:
    """A discard whose stage is gone but whose journal could not say so (a full or read-only
    state root): the run still reads ``staged``, which publish refuses, having no stage; a
    second discard finds nothing left to remove and ends it ``failed``."""
    return errors.JournalError(
        f"{_name(journal)}: its stage is removed, but its journal could not record the discard "
        f"({errors.message(err)}); the same discard again ends it once the state root can be written"
    )


def _name(journal: Journal) -> str:
    return f"run {journal.run_id} in {journal.state_root}"


def _ref(journal: Journal) -> Dict[str, str]:
    return {"state_root": journal.state_root, "run_id": journal.run_id}


def _publish_failed(
    err: BaseException, published: List[Journal], staged: List[Journal]
) -> errors.PublishError:
    """Roll back the runs ``published`` by this call, newest first, and say what became of
    every run: the one whose publish failed (reversed by its own transaction), those rolled
    back, those still staged."""
    outcome = []
    # A second SIGTERM must not leave some targets published and others not.
    with SigtermHeld():
        for journal in reversed(published):
            try:
                rollback.rollback(journal, journal.trees)
                outcome.append(f"{_name(journal)} rolled back")
            except (errors.HpcstackError, OSError) as rollback_err:
                outcome.append(
                    f"{_name(journal)} stays published: its rollback failed "
                    f"({journals.failure_reason(rollback_err)}); "
                    f"'eb-staged-rebuild rollback {journal.run_id}'"
                )
    outcome.extend(f"{_name(journal)} stays staged" for journal in staged[len(published) + 1 :])
    details = dict(err.details) if isinstance(err, errors.HpcstackError) else {}
    details["outcome"] = outcome
    failed = _name(staged[len(published)]) if len(published) < len(staged) else "the runs"
    return errors.PublishError(
        f"publish of {failed} failed ({errors.marked(err)}); "
        + ("; ".join(outcome) if outcome else "no other run was published"),
        details=details,
    )


def discard_staged(runs: Sequence[Tuple[str, str]], lock_timeout: float) -> Dict[str, Any]:
    """End every run of ``runs``, all staged, ``failed`` with its stage and build area
    removed (the live trees untouched); refused, discarding nothing, unless all are staged."""
    runs = _checked(runs)
    with _locked(_state_roots(runs), lock_timeout):
        staged = _staged_journals(runs, "discard")
        for journal in staged:
            operations.discard_stage(journal, journal.trees.generation(journal.run_id))
            journal.run.refused = True
            journal.run.error = DISCARDED
            try:
                journal.set_state(RunState.FAILED)
            except OSError as err:
                raise _discard_unrecorded(journal, err) from err
        return {
            "changed": True,
            "discarded": [_ref(journal) for journal in staged],
            "runs": [journals.summary(journal) for journal in staged],
        }
