# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The commands of eb-staged-rebuild as functions of plain arguments.

The command line (``cli``) and the Ansible modules both call these, one call per command:
each checks its state root, takes the state-root lock where it writes, and returns the
result dict that ``--json`` prints and the modules return. Errors are ``HpcstackError``
(one line, meant for the user) or ``OSError``; ``failure_message`` words either as one line.
"""

from __future__ import annotations

import contextlib
import os
import signal

from ..common import errors
from . import (
    backends,
    fsutil,
    locking,
    lockprobe,
    paths,
    probe,
    rebuild,
    resume,
    retire,
    rollback,
    runningjobs,
    settings,
    staged,
    uptodate,
)
from . import gc as gc_module
from . import journal as journals
from .journal import RunKind, RunState

FAILURES = (errors.HpcstackError, OSError)


def _raise_terminated(signum, frame):
    raise errors.Terminated(f"terminated by signal {signum}; completed steps were reversed")


@contextlib.contextmanager
def sigterm_raises():
    """Within the block SIGTERM raises Terminated, so that a run's reversal runs before the end.

    The command line and the modules both run a command inside it: Slurm, systemd and
    Ansible stop a process with SIGTERM, whose default would leave a half-published run.
    """
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def failure_message(err, name_of=settings.flag) -> str:
    """One line for an error from a command: the core's own words, or the system's.

    ``name_of`` spells the settings an error names (the command line's flags by default).
    """
    return errors.message(err, name_of)


def failure_details(err) -> dict:
    """The fields an error carries beside its message (a failed build's ``easybuild_reason``
    and ``build_log``); none for an error of the system."""
    return dict(err.details) if isinstance(err, errors.HpcstackError) else {}


def failure_kind(err) -> str:
    """The stable name of an error's kind, for a playbook to test (``lock_held``: retry)."""
    return err.kind if isinstance(err, errors.HpcstackError) else "os_error"


def existing_state_root(state_root: str) -> str:
    """The state root of earlier runs, as it is; refuses one that never had a run."""
    fsutil.refuse_symlink_components(state_root)
    if not os.path.isdir(os.path.join(state_root, "runs")):
        raise errors.UsageError(f"state root {state_root} has no runs (nothing was ever published with it)")
    return state_root


def rebuild_if_changed(request, state_root, progress, env, dry_run=False) -> dict:
    """Rebuild unless every requested module is live from the same easyconfig and EasyBuild.

    The result has ``up_to_date``: each module with whether it matched and why not.
    """
    comparison = uptodate.compare(request)
    if all(entry["up_to_date"] for entry in comparison):
        # A backend that cannot run here is refused whatever is live, as when it would build.
        backends.select(request.backend)
        return {"changed": False, "state": "up_to_date", "dry_run": dry_run, "up_to_date": comparison}
    result = run_rebuild(request, state_root, progress, env, dry_run)
    result["up_to_date"] = comparison
    return result


def run_rebuild(request, state_root, progress, env, dry_run=False) -> dict:
    """Build and publish; with ``dry_run`` what it would do (``changed`` says whether it would)."""
    if dry_run:
        result = rebuild.dry_run(request, env, state_root)
        result["would_change"] = True
        return result
    return rebuild.rebuild(request, state_root, progress, env)


def start_job(state_root, run_id, progress, env, *, node, job_id=None, check_node=None) -> dict:
    """What a batch job runs: its queued run started on ``node`` by job ``job_id``, built,
    planned, and published or left ``staged`` (``rebuild.start_queued``)."""
    state_root = existing_state_root(state_root)
    return rebuild.start_queued(
        state_root, run_id, progress, env, node=node, job_id=job_id, check_node=check_node
    )


def publish_runs(runs, lock_timeout, progress) -> dict:
    """Publish staged runs together (``staged.publish_staged``); ``runs`` are
    ``(state_root, run_id)`` pairs."""
    runs = [(existing_state_root(state_root), run_id) for state_root, run_id in runs]
    return staged.publish_staged(runs, lock_timeout, progress)


def discard_runs(runs, lock_timeout) -> dict:
    """End staged runs ``failed``, their stages removed (``staged.discard_staged``)."""
    runs = [(existing_state_root(state_root), run_id) for state_root, run_id in runs]
    return staged.discard_staged(runs, lock_timeout)


def _runs(state_root, run_id, trees=None):
    """The run ``run_id`` (None: every run), each refused when it names other trees than
    ``trees``, those the command was given or configured (None: the journals' own are used)."""
    # An empty run id is refused (find checks it), not read as "every run".
    runs = [journals.find(state_root, run_id)] if run_id is not None else journals.run_journals(state_root)
    for journal in runs:
        journal.check_trees(trees)
    return runs


def resume_runs(
    state_root, run_id, *, lock_timeout, progress, env, dry_run=False, trees=None, job_alive=None
) -> dict:
    """Finish or reverse interrupted runs (one, or all); with ``dry_run`` only which would be.
    ``job_alive(job_id)`` (True, False, or None: cannot ask) says whether a queued run's batch
    job is still pending or running; without it queued runs are left as they are."""
    state_root = existing_state_root(state_root)
    if run_id is not None:
        paths.check_run_id(run_id)  # before the lock: a refused request writes nothing
    if dry_run:
        runs = _runs(state_root, run_id, trees)
        pending = [journal.run_id for journal in runs if journal.state in journals.INTERRUPTED]
        return {"changed": False, "dry_run": True, "would_change": bool(pending), "interrupted": pending}
    # Read first: a journal that does not load refuses before the lock file is written.
    _runs(state_root, run_id, trees)
    paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        results = [
            resume.resume_run(
                journal, lambda journal: rebuild.build_and_publish(journal, progress, env), job_alive
            )
            for journal in _runs(state_root, run_id, trees)
        ]
    return {"changed": any(result["changed"] for result in results), "runs": results}


def _rollback_check(journal):
    return (retire.check_rollback if journal.run.kind is RunKind.RETIRE else rollback.check)(journal)


def roll_back(state_root, run_id, lock_timeout, dry_run=False, trees=None) -> dict:
    """Put back what run ``run_id`` replaced (a tree, or a retired module file)."""
    state_root = existing_state_root(state_root)
    paths.check_run_id(run_id)
    # Read first: a journal that does not load refuses before the lock file is written.
    (journal,) = _runs(state_root, run_id, trees)
    if dry_run:
        return {
            "changed": False,
            "dry_run": True,
            "run_id": run_id,
            "state": journal.state.value,
            # The real rollback's own checks: a refused one fails here as it would there.
            "would_change": _rollback_check(journal),
        }
    paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        (journal,) = _runs(state_root, run_id, trees)
        if journal.run.kind is RunKind.RETIRE:
            return retire.rollback_retire(journal)
        return rollback.rollback(journal, journal.trees)


def retire_module(
    state_root, module_file, reason, *, lock_timeout=0.0, already_retired_ok=False, dry_run=False
) -> dict:
    """Move a module file out of MODULEPATH's way, journaled so that rollback puts it back.

    With ``already_retired_ok``, a file that a retire run of this state root moved away
    (and that is not back) gives that run's result with ``changed`` false, not an error.
    """
    earlier = _retired_by(state_root, module_file) if already_retired_ok else None
    if earlier is not None:
        return earlier
    retire.check(module_file, reason, state_root)
    if dry_run:
        return {
            "changed": False,
            "dry_run": True,
            "module_file": os.path.abspath(module_file),
            "would_change": True,
        }
    state_root = paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        return retire.retire(state_root, module_file, reason)


def _retired_by(state_root, module_file):
    module_file = os.path.abspath(module_file)
    if os.path.lexists(module_file) or not os.path.isdir(os.path.join(state_root, "runs")):
        return None
    for journal in reversed(journals.run_journals(state_root)):
        if journal.run.kind is RunKind.RETIRE and journal.run.module_file == module_file:
            if journal.state is not RunState.RETIRED:
                return None
            return {
                "changed": False,
                "run_id": journal.run_id,
                "state": journal.state.value,
                "module_file": module_file,
                "retired_to": journal.run.retired_to,
            }
    return None


def collect_garbage(  # noqa: PLR0917 - the command line's options
    state_root,
    grace_hours,
    lock_timeout,
    dry_run=False,
    trees=None,
    squeue_environ=None,
    fleet=None,
    now=None,
) -> dict:
    """Remove retired trees no process here (or, with ``fleet``, on the hosts that answered)
    and no running job uses, or (where Slurm does not answer: ``squeue_environ`` None, or no
    ``squeue`` on its PATH) older than ``grace_hours`` at ``now`` (by default the clock's);
    ``dry_run`` lists them instead. Slurm is asked by ``gc`` itself, under the lock, after
    it read the journals it decides on."""
    state_root = existing_state_root(state_root)

    def ask_slurm():
        return runningjobs.NOT_ASKED if squeue_environ is None else runningjobs.running_jobs(squeue_environ)

    if dry_run:
        # Reads only: no lock (its files would be written) and no missing directories made.
        report = gc_module.gc(
            state_root,
            grace_hours=grace_hours,
            dry_run=True,
            now=now,
            trees=trees,
            ask_slurm=ask_slurm,
            fleet=fleet,
        )
        report["would_change"] = bool(report["removed"])
        return report
    # Read first: a journal that does not load refuses before the lock file is written.
    journals.check_all(state_root, trees)
    paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        return gc_module.gc(
            state_root,
            grace_hours=grace_hours,
            dry_run=False,
            now=now,
            trees=trees,
            ask_slurm=ask_slurm,
            fleet=fleet,
        )


def show_status(state_root, run_id=None) -> dict:
    """The runs of a state root, or one run in detail; reads only."""
    state_root = existing_state_root(state_root)
    if run_id is not None:
        return {"run": journals.summary(journals.find(state_root, run_id), detail=True)}
    return {
        "runs": [journals.summary(journal) for journal in journals.run_journals(state_root)],
        "incomplete": journals.incomplete(state_root),
    }


def probe_host(path, eb, contention=None) -> dict:
    """The probe of ``path``; with ``contention`` (``lockprobe.contend``'s arguments) the lock's too."""
    result = {"changed": False, "probe": probe.probe(path, eb)}
    if contention is not None:
        result["lock"] = lockprobe.contend(**contention)
    return result
