# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``gc``: remove retired trees once no job can still be running from them.

Only the hidden sibling that a directory-swap journal recorded (``<software>/<Name>/
.<version>.<run_id>``) is ever removed, and only when no process of this node uses it
(``inuse``: an open file, a mapping, a working directory, a root, an executable or an
environment that names it) and the grace period (default 144 h: a 120-hour walltime plus
24 hours; set it to the site's limit) counted from the run's last change of state has
passed. A process that uses it keeps the tree whatever the grace period says. The stable
path is never removed. A retired module's software directory is reported, never deleted:
``keep`` while a tracked module file still resolves inside it or the grace period runs,
then ``manual``. Deleting it from a retire record would let one wrong journal entry remove
a directory a job outside this tool still has open.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Set

from ..common import errors
from ..common.printable import is_unicode
from . import dependants, fsutil, inuse, modulefile, runningjobs, settings
from . import journal as journals
from .journal import RunKind, RunState, StepKind

# The steps that exchange a tree with its sibling: a job that started before the last of them
# may hold the tree that is the sibling now.
_EXCHANGES = frozenset(
    (
        StepKind.SWAP,
        StepKind.FALLBACK_LIVE_TO_HOLD,
        StepKind.FALLBACK_STAGED_TO_LIVE,
        StepKind.FALLBACK_HOLD_TO_STAGED,
        StepKind.ROLLBACK_SWAP,
    )
)


def _parse(stamp):
    return datetime.datetime.fromisoformat(stamp)


def grace_ends(journal, grace_hours) -> datetime.datetime:
    """When the grace period of ``journal``'s run ends: ``grace_hours`` after its last change
    of state."""
    return _parse(journal.run.changed_since) + datetime.timedelta(hours=grace_hours)


def _is_recorded_sibling(entry, run_id, software):
    """The retired path must be the run's hidden sibling of a stable path ``<software>/Name/version``."""
    retired, stable = os.path.normpath(entry.retired_path), os.path.normpath(entry.stable_path)
    return (
        os.path.dirname(retired) == os.path.dirname(stable)
        and os.path.dirname(os.path.dirname(stable)) == os.path.normpath(software)
        and os.path.basename(retired) == f".{os.path.basename(stable)}.{run_id}"
    )


def _tracked_roots(runs):
    """Install dirs that tracked module files resolve to: live modules of publish runs and
    the original path of any retire that was rolled back or interrupted."""
    files: Set[str] = set()
    for journal in runs:
        if journal.run.kind is RunKind.PUBLISH:
            files.update(entry.module_file for entry in journal.modules)
        elif journal.state in (RunState.ROLLED_BACK, RunState.RETIRING):
            files.add(journal.run.module_file)
    roots = set()
    for path in files:
        try:
            root = modulefile.parse_root(modulefile.read_text(path))
        except (OSError, errors.UsageError):
            continue
        if root:
            roots.add(os.path.normpath(root))
    return roots


# A queued run may be built by its job at any moment, and a staged run's stage is what
# ``publish`` puts live: gc keeps both, and lists them.
WAITING = frozenset({RunState.QUEUED, RunState.STAGED})


def _collectable(runs) -> List[journals.Journal]:
    return [
        journal
        for journal in runs
        if journal.run.kind is RunKind.PUBLISH
        and journal.state not in journals.INTERRUPTED
        and journal.state not in WAITING
    ]


def _waiting(journal) -> Dict[str, Any]:
    run_id = journal.run_id
    if journal.state is RunState.STAGED:
        why = f"staged: 'eb-staged-rebuild publish {run_id}' or 'eb-staged-rebuild discard {run_id}'"
    else:
        why = "queued: waiting for its job to start"
    return {"run_id": run_id, "state": journal.state.value, "why": why}


def retired_trees(runs) -> List[str]:
    """The old trees gc may remove: every recorded sibling of a finished publish run that exists."""
    siblings = (entry.retired_path for journal in _collectable(runs) for entry in journal.modules)
    return [sibling for sibling in siblings if os.path.lexists(sibling)]


def in_use_reason(processes, where: str = "") -> str:
    """``in use[ on <where>] by 2 processes (pids 12, 34; users alice, bob; jobs 4242)``, the
    jobs where the processes' environments name them. A ``SLURM_JOB_ID`` that is not of a
    job id's form (its owner set it to anything) is counted, not quoted: the ``processes``
    of the report hold it as it was."""
    pids = ", ".join(str(process.pid) for process in processes)
    users = ", ".join(sorted({process.user for process in processes}))
    claimed = {process.job_id for process in processes if process.job_id}
    jobs = sorted(job for job in claimed if inuse.is_job_id(job))
    noun = "process" if len(processes) == 1 else "processes"
    on = f" on {where}" if where else ""
    of_jobs = f"; jobs {', '.join(jobs)}" if jobs else ""
    others = len(claimed) - len(jobs)
    if others:
        values = "SLURM_JOB_ID that is not a job id" if others == 1 else "SLURM_JOB_IDs that are not job ids"
        of_jobs += f"; {others} {values}"
    return f"in use{on} by {len(processes)} {noun} (pids {pids}; users {users}{of_jobs})"


def _kept_in_use(path, run_id, users, where: str = "") -> Dict[str, Any]:
    """A tree kept by ``users``, ``(host, process)`` pairs: this host's (``where`` "") or
    other hosts' (``where`` names them)."""
    return {
        "path": path,
        "run_id": run_id,
        "why": in_use_reason([process for _host, process in users], where),
        "processes": [dict(dataclasses.asdict(process), host=host) for host, process in users],
    }


def _here(processes) -> list:
    """This host's processes as ``(host, process)`` pairs, named by its node name."""
    node = os.uname().nodename
    return [(node, process) for process in processes]


def _kept_elsewhere(path, run_id, fleet) -> Optional[Dict[str, Any]]:
    """The kept entry of a tree that the fleet's answers keep, or None: any host that did not
    answer keeps every tree, a host whose answer does not cover the tree keeps it (its scan
    ran before the tree was swapped out); else the processes that use it on other hosts do."""
    if fleet.unanswered:
        return {
            "path": path,
            "run_id": run_id,
            "why": f"no answer from {', '.join(fleet.unanswered)}: every tree is kept",
            "unanswered": list(fleet.unanswered),
        }
    if not is_unicode(path):
        # The other hosts are asked through Ansible, whose strings are Unicode: such a path
        # reaches them escaped (``unicode_result``), names nothing there, and so proves nothing.
        return {
            "path": path,
            "run_id": run_id,
            "why": "its path is not UTF-8, so the other hosts cannot be asked about it: it is kept",
        }
    not_asked = fleet.not_asked(path)
    if not_asked:
        return {
            "path": path,
            "run_id": run_id,
            "why": f"not asked of {', '.join(not_asked)} (their scans ran before it was a candidate)",
            "not_asked": not_asked,
        }
    found = fleet.users.get(path)
    if not found:
        return None
    return _kept_in_use(path, run_id, found, where=", ".join(sorted({host for host, _process in found})))


def _collect_siblings(journal, old_enough, *, dry_run, report, usage, running, fleet):
    """Remove (or, in a dry run, list) the hidden siblings one publish run recorded."""
    software = journal.trees.software
    kept_any = False
    for entry in journal.modules:
        sibling = entry.retired_path
        if not os.path.lexists(sibling):
            continue
        if not _is_recorded_sibling(entry, journal.run_id, software) or os.path.islink(sibling):
            raise errors.JournalError(
                f"run {journal.run_id} records {sibling}, which is not a hidden sibling of "
                f"{entry.stable_path}; gc stops"
            )
        fsutil.refuse_symlink_components(sibling, stop_at=software)
        _require_left_by_the_run(journal, entry)
        kept = _why_kept(journal, entry, old_enough, usage, running, fleet)
        if kept is not None:
            report["kept"].append(kept)
            kept_any = True
            continue
        if not dry_run:
            # A fault point (``faults.Faults``) before each removal, as before every write of a run.
            journal.faults.before("gc remove " + os.path.relpath(sibling, software))
            fsutil.remove_tree(sibling, root=software)
        report["removed"].append({"path": sibling, "run_id": journal.run_id})
    generation = journal.trees.generation(journal.run_id)
    if usage.users.get(generation):
        if os.path.isdir(generation):
            report["kept"].append(_kept_in_use(generation, journal.run_id, _here(usage.users[generation])))
        return
    may_go = not kept_any and (old_enough or running.known)
    if may_go and not dry_run and os.path.isdir(generation) and not os.path.islink(generation):
        journal.faults.before("gc remove " + os.path.relpath(generation, software))
        fsutil.remove_tree(generation, root=software)
    if may_go and not dry_run:
        _remove_easyconfig_copies(journal)


def _remove_easyconfig_copies(journal):
    """A stack rebuild's copies of its dependants' easyconfigs (``dependants.take_copies``):
    only its build read them, and a resume of that build; a finished run's go with its build
    area. The journal, the module-file backups and the build log stay: ``status`` reads them."""
    chain = journal.run.request.chain if journal.run.request is not None else None
    if chain is None:
        return
    run_dir = journal.run_dir
    for copies in sorted({os.path.dirname(path) for path in dependants.copy_paths(chain, run_dir)}):
        found = fsutil.lstat_below(copies, run_dir)
        if found is None:
            continue
        if not stat.S_ISDIR(found.st_mode):
            raise errors.JournalError(f"run {journal.run_id}: {copies} is not a directory; gc stops")
        journal.faults.before("gc remove " + os.path.relpath(copies, journal.state_root))
        fsutil.remove_tree(copies, root=run_dir)


def _why_kept(journal, entry, old_enough, usage, running, fleet):  # noqa: PLR0917 - one sibling's facts
    """The kept entry of a sibling that stays, or None when it may go: a process of this node
    uses it; else one of another host of the fleet (when asked), or a host did not answer;
    else, when Slurm answered, a running job started before it was swapped out; else, when
    Slurm did not, the grace period."""
    users = usage.users.get(entry.retired_path)
    if users:
        return _kept_in_use(entry.retired_path, journal.run_id, _here(users))
    if fleet is not None:
        elsewhere = _kept_elsewhere(entry.retired_path, journal.run_id, fleet)
        if elsewhere is not None:
            return elsewhere
    if running.known:
        swapped = retired_at(journal, entry.module)
        jobs = running.started_before(swapped) if swapped is not None else []
        if not jobs:
            return None
        return {
            "path": entry.retired_path,
            "run_id": journal.run_id,
            "why": _jobs_reason(jobs),
            "jobs": [job.as_dict() for job in jobs],
        }
    if not old_enough:
        return {"path": entry.retired_path, "run_id": journal.run_id, "why": "grace period"}
    return None


def retired_at(journal, module):
    """When ``module``'s sibling last changed places with the live tree (a swap, the fallback's
    renames, a rollback's swap back), or None when it never did (it holds an unpublished stage)."""
    moments = [
        _parse(step.at)
        for step in journal.run.steps
        if step.step.module == module and step.step.kind in _EXCHANGES
    ]
    return max(moments) if moments else None


def _jobs_reason(jobs) -> str:
    """``2 running jobs started before the swap (4242, 4243)``."""
    noun = "job" if len(jobs) == 1 else "jobs"
    return f"{len(jobs)} running {noun} started before the swap ({', '.join(job.job_id for job in jobs)})"


def _require_left_by_the_run(journal, entry):
    """The sibling must be the directory the run itself left there: the old live tree after
    a swap (``live_ino``), the stage when none happened or it was reversed (``stage_ino``).
    Its name alone is the journal's word: a journal whose trees and entries were all moved,
    consistently, to another tree would otherwise hand gc that tree's hidden directory."""
    recorded = {ino for ino in (entry.live_ino, entry.stage_ino) if ino is not None}
    found = fsutil.lstat_below(entry.retired_path, journal.trees.software)  # no link on the way
    if found is None or found.st_ino not in recorded:
        raise errors.JournalError(
            f"run {journal.run_id} records {entry.retired_path}, which is not the tree the run left "
            "there (neither the live nor the staged inode it recorded); gc stops"
        )


def _report_retired(journal, roots, now, grace_hours, report):
    """A retired module's software directory: ``keep`` or ``manual``, never deleted."""
    software_dir = os.path.normpath(journal.run.software_dir)
    in_use = any(root == software_dir or root.startswith(software_dir + "/") for root in roots)
    if in_use or now < grace_ends(journal, grace_hours):
        why = "a tracked module file uses it" if in_use else "grace period"
        report["kept"].append({"path": software_dir, "run_id": journal.run_id, "why": why})
    else:
        why = "retired; no tracked module uses it: delete it by hand when sure"
        report["manual"].append({"path": software_dir, "run_id": journal.run_id, "why": why})


def gc(  # noqa: PLR0917 - the command line's options
    state_root,
    grace_hours=settings.DEFAULT_GRACE_HOURS,
    dry_run=False,
    now=None,
    trees=None,
    ask_slurm: Callable[[], runningjobs.RunningJobs] = lambda: runningjobs.NOT_ASKED,
    fleet=None,
):
    """Collect the runs of ``state_root``; ``trees`` (when given) are the only trees they may
    name; ``ask_slurm`` gives Slurm's answer (``runningjobs.running_jobs``), or why there is
    none; ``fleet`` (``inuse.Fleet``), what the other hosts' scans answered.

    Slurm and this node's processes are asked after the journals are read, and the caller
    holds the state-root lock (a dry run aside): no swap can come between the journals and
    the answers, so a job the answer does not list started after every swap the journals
    record, and one that started before is listed. Asked before the lock, the answer would
    miss a job that started while a rebuild held it and then swapped that job's tree out.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    runs = journals.run_journals(state_root)
    for journal in runs:
        journal.check_trees(trees)
    running = ask_slurm()
    report: Dict[str, Any] = {
        "removed": [],
        "kept": [],
        "manual": [],
        "interrupted": [],
        # Run directories without a journal: never loaded, never removed by gc (nothing in
        # them was published); the administrator removes them.
        "incomplete": journals.incomplete(state_root),
        # Runs waiting for their job, or staged for ``publish``: kept whole.
        "staged": [],
        "queued": [],
    }
    candidates = retired_trees(runs)
    # Each run's build area too: it goes with the run's siblings unless a process uses it.
    usage = inuse.scan(
        candidates + [journal.trees.generation(journal.run_id) for journal in _collectable(runs)]
    )
    report["candidates"] = candidates
    report["processes"] = usage.summary()
    report["slurm"] = running.summary()
    if fleet is not None:
        report["fleet"] = {"unanswered": list(fleet.unanswered)}
    for journal in runs:
        if journal.state in journals.INTERRUPTED:
            command = "rollback " + journal.run_id if journal.run.kind is RunKind.RETIRE else "resume"
            report["interrupted"].append(
                {
                    "run_id": journal.run_id,
                    "state": journal.state.value,
                    "why": f"interrupted: 'eb-staged-rebuild {command}'",
                }
            )
        elif journal.state in WAITING:
            report[journal.state.value].append(_waiting(journal))
        elif journal.run.kind is RunKind.PUBLISH:
            _collect_siblings(
                journal,
                now >= grace_ends(journal, grace_hours),
                dry_run=dry_run,
                report=report,
                usage=usage,
                running=running,
                fleet=fleet,
            )
    roots = _tracked_roots(runs)
    for journal in runs:
        if journal.run.kind is RunKind.RETIRE and journal.state is RunState.RETIRED:
            _report_retired(journal, roots, now, grace_hours, report)
    report.update(
        {"changed": bool(report["removed"]) and not dry_run, "dry_run": dry_run, "grace_hours": grace_hours}
    )
    return report
