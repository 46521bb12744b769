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
import math
import os
import shutil
import signal

from ..common import errors
from . import faults as faults_module
from . import fsutil, locking, lockprobe, paths, probe, rebuild, resume, retire, rollback, status, uptodate
from . import gc as gc_module
from . import journal as journals

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


def failure_message(err) -> str:
    """One line for an error from a command: the core's own words, or the system's."""
    if isinstance(err, errors.HpcstackError):
        return str(err)
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    return f"{err.strerror or err}{where}"


def state_root_path(state_root, lock_timeout=0.0) -> str:
    """The absolute state root; refuses a missing one and a bad lock timeout."""
    if lock_timeout < 0 or math.isnan(lock_timeout):
        raise errors.UsageError(
            f"lock timeout must be 0 or more seconds (--lock-timeout), not {lock_timeout}"
        )
    if not state_root:
        raise errors.UsageError("no state root: give --state-root DIR or set EB_STAGED_REBUILD_STATE_ROOT")
    return os.path.abspath(state_root)


def existing_state_root(state_root, lock_timeout=0.0) -> str:
    """The state root of earlier runs, as it is; refuses one that never had a run."""
    state_root = state_root_path(state_root, lock_timeout)
    fsutil.refuse_symlink_components(state_root)
    if not os.path.isdir(os.path.join(state_root, "runs")):
        raise errors.UsageError(f"state root {state_root} has no runs (nothing was ever published with it)")
    return state_root


def live_trees(installpath, software, modules, environ) -> tuple:
    """The live software and module roots: the options first, then EasyBuild's variables.

    An option beats every variable; among the variables, as in EasyBuild,
    ``EASYBUILD_INSTALLPATH_SOFTWARE``/``_MODULES`` beat ``EASYBUILD_INSTALLPATH``.
    """
    if software or modules:
        if not (software and modules):
            raise errors.UsageError("--installpath-software and --installpath-modules go together")
        return software, modules
    if installpath:
        return os.path.join(installpath, "software"), os.path.join(installpath, "modules")
    from_environment = environ.get("EASYBUILD_INSTALLPATH")
    trees = []
    for tree in ("software", "modules"):
        path = environ.get("EASYBUILD_INSTALLPATH_" + tree.upper())
        if not path and from_environment:
            path = os.path.join(from_environment, tree)
        if not path:
            raise errors.UsageError(
                f"no install path for {tree}: give --installpath DIR (or set EASYBUILD_INSTALLPATH)"
            )
        trees.append(path)
    return tuple(trees)


def resolve_eb(eb) -> str:
    """``eb`` as an absolute path when it names a file or is found on PATH."""
    return os.path.abspath(eb) if os.sep in eb else (shutil.which(eb) or eb)


def rebuild_request(
    *,
    software,
    modules,
    modules_requested,
    eb,
    eb_args=(),
    backend="auto",
    run_id=None,
    skip_live_check=False,
    allow_unrelocated=False,
    prepare=None,
    ledger_config=None,
    lock_timeout=0.0,
) -> dict:
    """The request a rebuild (or its dry run) works from, with absolute paths."""
    return {
        "software": os.path.abspath(software),
        "modules": os.path.abspath(modules),
        "modules_requested": list(modules_requested),
        "backend": backend,
        "eb": eb,
        "eb_args": list(eb_args),
        "run_id": run_id,
        "skip_live_check": skip_live_check,
        "allow_unrelocated": allow_unrelocated,
        "prepare": prepare,
        "ledger_config": os.path.abspath(ledger_config) if ledger_config else None,
        "lock_timeout": lock_timeout,
    }


def rebuild_if_changed(request, state_root, progress, env, dry_run=False) -> dict:
    """Rebuild unless every requested module is live from the same easyconfig and EasyBuild.

    The result has ``up_to_date``: each module with whether it matched and why not.
    """
    comparison = uptodate.compare(request)
    if all(entry["up_to_date"] for entry in comparison):
        rebuild.check_request(request)  # a refused request is refused whatever is live
        return {"changed": False, "state": "up_to_date", "dry_run": dry_run, "up_to_date": comparison}
    result = run_rebuild(request, state_root, progress, env, dry_run)
    result["up_to_date"] = comparison
    return result


def run_rebuild(request, state_root, progress, env, dry_run=False) -> dict:
    """Build and publish; with ``dry_run`` what it would do (``changed`` says whether it would)."""
    if dry_run:
        result = rebuild.dry_run(request)
        result["would_change"] = True
        return result
    return rebuild.rebuild(
        request, state_root_path(state_root, request["lock_timeout"]), faults_module.Faults(), progress, env
    )


def resume_runs(state_root, run_id, *, lock_timeout, progress, env, dry_run=False) -> dict:
    """Finish or reverse interrupted runs (one, or all); with ``dry_run`` only which would be."""
    state_root = existing_state_root(state_root, lock_timeout)
    if run_id:
        paths.check_run_id(run_id)  # before the lock: a refused request writes nothing
    if dry_run:
        runs = [journals.find(state_root, run_id)] if run_id else journals.run_journals(state_root)
        pending = [journal.run_id for journal in runs if journal.state in journals.INTERRUPTED]
        return {"changed": False, "dry_run": True, "would_change": bool(pending), "interrupted": pending}

    paths.prepare_state_root(state_root)

    def build_again(journal):
        trees = paths.Trees(**journal.data["trees"])
        return rebuild.build_and_publish(journal, trees, faults_module.Faults(), progress, env)

    with locking.StateLock(state_root, lock_timeout):
        runs = [journals.find(state_root, run_id)] if run_id else journals.run_journals(state_root)
        results = [
            resume.resume_run(
                journal,
                paths.Trees(**journal.data["trees"]) if "trees" in journal.data else None,
                build_again,
            )
            for journal in runs
        ]
    return {"changed": any(result["changed"] for result in results), "runs": results}


def roll_back(state_root, run_id, lock_timeout, dry_run=False) -> dict:
    """Put back what run ``run_id`` replaced (a tree, or a retired module file)."""
    state_root = existing_state_root(state_root, lock_timeout)
    paths.check_run_id(run_id)
    if dry_run:
        journal = journals.find(state_root, run_id)
        return {
            "changed": False,
            "dry_run": True,
            "run_id": run_id,
            "state": journal.state,
            # The real rollback's own checks: a refused one fails here as it would there.
            "would_change": (retire.check_rollback if journal.data["kind"] == "retire" else rollback.check)(
                journal
            ),
        }
    paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        journal = journals.find(state_root, run_id)
        if journal.data["kind"] == "retire":
            return retire.rollback_retire(journal)
        return rollback.rollback(journal, paths.Trees(**journal.data["trees"]), faults_module.Faults())


def retire_module(
    state_root, module_file, reason, *, lock_timeout=0.0, already_retired_ok=False, dry_run=False
) -> dict:
    """Move a module file out of MODULEPATH's way, journaled so that rollback puts it back.

    With ``already_retired_ok``, a file that a retire run of this state root moved away
    (and that is not back) gives that run's result with ``changed`` false, not an error.
    """
    state_root = state_root_path(state_root, lock_timeout)
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
        if journal.data.get("kind") == "retire" and journal.data.get("module_file") == module_file:
            if journal.state != "retired":
                return None
            return {
                "changed": False,
                "run_id": journal.run_id,
                "state": journal.state,
                "module_file": module_file,
                "retired_to": journal.data["retired_to"],
            }
    return None


def collect_garbage(state_root, grace_hours, lock_timeout, dry_run=False) -> dict:
    """Remove retired trees older than ``grace_hours``; ``dry_run`` lists them instead."""
    state_root = existing_state_root(state_root, lock_timeout)
    if not math.isfinite(grace_hours):
        raise errors.UsageError(f"--grace-hours must be a finite number of hours, not {grace_hours}")
    if grace_hours < 0:
        raise errors.UsageError("--grace-hours must not be negative")
    if dry_run:
        # Reads only: no lock (its files would be written) and no missing directories made.
        result = gc_module.gc(state_root, grace_hours=grace_hours, dry_run=True)
        result["would_change"] = bool(result["removed"])
        return result
    paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, lock_timeout):
        return gc_module.gc(state_root, grace_hours=grace_hours, dry_run=False)


def show_status(state_root, run_id=None) -> dict:
    """The runs of a state root, or one run in detail; reads only."""
    return status.status(existing_state_root(state_root), run_id)


def probe_host(path, eb, contention=None) -> dict:
    """The probe of ``path``; with ``contention`` (``lockprobe.contend``'s arguments) the lock's too."""
    result = {"changed": False, "probe": probe.probe(path, eb)}
    if contention is not None:
        if not contention.get("state_root"):
            raise errors.UsageError("the lock probe needs the state root (state_root)")
        result["lock"] = lockprobe.contend(**contention)
    return result
