# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rebuild submitted as Slurm jobs: one job per CPU target, and a last one that publishes
them together.

``JobRequest`` holds the options of a submission (EasyBuild's ``--job``, ``--job-cores``,
``--job-max-walltime``; the site file and its targets; ``--publish each|together``); the
command line and the ``staged_rebuild`` module both take them from its fields. A submission
is planned first (``plan_jobs``, pure: what a dry run and check mode list), then made
(``submit``):

1. every target's request is resolved and checked on this host (the trees are on a shared
   filesystem), before any journal is written: a refusal leaves nothing behind;
2. each target's run is queued (its journal in state ``queued``, in the target's state
   root, under one run id for the whole submission);
3. each target's job is submitted; with ``--publish together`` the publish job last, held
   until every target's job ended well (``afterok``) and cancelled by Slurm when one did not.

When sbatch refuses a job, the jobs of this submission already in Slurm are cancelled and
every run it queued ends ``failed`` with sbatch's message: a submission goes in whole or not
at all.

A target job runs ``eb-staged-rebuild job-start RUN_ID --state-root DIR``; for a target of a
site file with ``--targets-file FILE``, so that the job checks, on its node, that archdetect
names the target's CPU (``node_check``) before it builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..common import errors, proc
from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import setting
from . import journal as journals
from . import locking, paths, rebuild, settings, slurmjob, targets
from . import request as request_module
from .journal import RunState
from .records import AbsPath
from .settings import option

EACH, TOGETHER = "each", "together"
COMMAND_VARIABLE = "EB_STAGED_REBUILD_COMMAND"
# The path the build_host role installs the command at: what a job runs when nothing else says.
INSTALLED_COMMAND = "/usr/local/bin/eb-staged-rebuild"
# A job's run waits this long for its state root's lock (a gc, the submission recording its
# job id) unless the submission said longer: a job that gave up at once would waste its place
# in the queue. The submission's own wait for the lock is the same (the request holds one).
JOB_LOCK_WAIT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """How a rebuild is submitted to Slurm; ``job`` False: it runs here, as always."""

    job: bool = option(
        False,
        help="submit the rebuild as a Slurm batch job (one per --target) and return with its job id",
    )
    job_cores: Optional[int] = option(help="cores of each job (sbatch --cpus-per-task)", metavar="N")
    job_max_walltime: Optional[float] = option(
        help="hours each job may run (sbatch --time); SBATCH_* variables reach sbatch as well",
        metavar="HOURS",
    )
    targets_file: Optional[AbsPath] = option(  # noqa: RUF009 - option() is dataclasses.field()
        help=f"the site file of CPU targets (default: ${targets.TARGETS_VARIABLE})",
        variable=targets.TARGETS_VARIABLE,
        metavar="FILE",
    )
    target: List[str] = option(  # noqa: RUF009 - option() is dataclasses.field()
        [],
        help="with --job: rebuild the tree of this target of the site file, on a node of it; "
        "repeatable; all: every target",
        metavar="NAME",
    )
    publish: str = option(
        EACH,
        help="with --job: each (every target publishes when its build is done) or together "
        "(a last job publishes every target, or none)",
        choices=(EACH, TOGETHER),
        metavar="each|together",
    )

    @property
    def job_options(self) -> slurmjob.JobOptions:
        return slurmjob.JobOptions(self.job_cores, self.job_max_walltime)

    @property
    def together(self) -> bool:
        return self.publish == TOGETHER


def resolve(values: Mapping[str, Any], environ: Mapping[str, str]) -> JobRequest:
    """The submission options of ``values`` (options by name), checked; UsageError otherwise."""
    given = {
        name: values.get(name)
        for name in ("job", "job_cores", "job_max_walltime", "targets_file", "target", "publish")
    }
    request = JobRequest(
        job=bool(given["job"]),
        job_cores=_cores(given["job_cores"]),
        job_max_walltime=None if given["job_max_walltime"] is None else _hours(given["job_max_walltime"]),
        targets_file=targets.site_file(given["targets_file"], environ),
        target=list(given["target"] or []),
        publish=given["publish"] or EACH,
    )
    if request.publish not in (EACH, TOGETHER):
        raise errors.UsageError(f"{setting('publish')} {request.publish} is not one of {EACH}, {TOGETHER}")
    if not request.job:
        # ``each`` is what a run without a job does anyway: only ``together`` needs jobs.
        for name, value in (
            ("target", request.target),
            ("job_cores", request.job_cores),
            ("job_max_walltime", request.job_max_walltime),
            ("publish", request.together),
        ):
            if value:
                raise errors.UsageError(f"{setting(name)} goes with {setting('job')}")
    if request.target and request.targets_file is None:
        raise errors.UsageError(
            f"{setting('target')} needs a site file: {setting('targets_file')} FILE "
            f"or ${targets.TARGETS_VARIABLE}"
        )
    request.job_options  # noqa: B018 - checks the values (JobOptions refuses what is out of range)
    return request


def _cores(value: Any) -> Optional[int]:
    if value is None:
        return None
    text = str(value).strip()
    if not text.isdigit():
        raise errors.UsageError(f"{setting('job_cores')} {value!r} is not a whole number")
    return int(text)


def _hours(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise errors.UsageError(f"{setting('job_max_walltime')} {value!r} is not a number of hours") from None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one build of a submission goes: its target (None: the trees given, no check),
    its state root, and the Slurm constraint or partition that reaches its nodes."""

    target: Optional[str]
    state_root: str
    constraint: Optional[str] = None
    partition: Optional[str] = None

    @classmethod
    def of(cls, target: targets.Target) -> Placement:
        return cls(target.name, target.state_root, target.constraint, target.partition)


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """One sbatch of a submission: its options and script, and the targets whose jobs it
    waits for (the publish job's ``after``; their job ids are known once they are submitted)."""

    target: Optional[str]
    state_root: Optional[str]
    options: List[str]
    script: str
    after: List[Optional[str]] = dataclasses.field(default_factory=list)

    @property
    def publishes(self) -> bool:
        """The last job of ``--publish together``, not a target's build."""
        return bool(self.after)

    def shown(self, sbatch: str = "sbatch") -> List[str]:
        """The sbatch command as a dry run shows it: a job id not known yet is ``<job of T>``."""
        waits = [f"<job of {target or 'the build'}>" for target in self.after]
        return [sbatch, *self.options, *slurmjob.dependency_options(waits)]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "target": self.target,
            "state_root": self.state_root,
            "publish": self.publishes,
            "sbatch": self.shown(),
            "script": self.script,
        }


def plan_jobs(
    run_id: str,
    placements: Sequence[Placement],
    job_options: slurmjob.JobOptions,
    tool: Sequence[str],
    *,
    together: bool,
    targets_file: Optional[str] = None,
    lock_timeout: float = 0.0,
) -> List[PlannedJob]:
    """The sbatch commands a submission makes, in order: each placement's job, then with
    ``together`` the job that publishes them all. Pure: nothing is asked or written. A
    target's job waits for its lock as its run's request says (``job_lock_timeout``)."""
    waits = ["--lock-timeout", f"{job_lock_timeout(lock_timeout):g}"]
    planned = []
    for placement in placements:
        command = [*tool, "job-start", run_id, "--state-root", placement.state_root]
        if placement.target is not None and targets_file is not None:
            command += ["--targets-file", targets_file]
        planned.append(
            PlannedJob(
                placement.target,
                placement.state_root,
                slurmjob.sbatch_options(
                    slurmjob.job_name(run_id, placement.target),
                    _output(placement.state_root, run_id),
                    job_options,
                    constraint=placement.constraint,
                    partition=placement.partition,
                ),
                slurmjob.script(command),
            )
        )
    if together and placements:
        planned.append(_publish_job(run_id, placements, tool, waits, targets_file))
    return planned


def _publish_job(run_id, placements, tool, waits, targets_file) -> PlannedJob:
    """The last job: any node that reaches the first target's trees reaches the shared
    filesystem every target's tree is on, so it goes where the first target's jobs go."""
    first = placements[0]
    if targets_file is not None and all(placement.target for placement in placements):
        command = [*tool, *waits, "publish", run_id, "--targets-file", targets_file]
        for placement in placements:
            command += ["--target", placement.target]
    else:
        command = [*tool, *waits, "publish", run_id, "--state-root", first.state_root]
    options = slurmjob.sbatch_options(
        slurmjob.job_name(run_id, "publish"),
        _output(first.state_root, run_id),
        slurmjob.JobOptions(),
        constraint=first.constraint,
        partition=first.partition,
    )
    return PlannedJob(
        None, None, options, slurmjob.script(command), [placement.target for placement in placements]
    )


def job_lock_timeout(given: float) -> float:
    return max(given, JOB_LOCK_WAIT_SECONDS)


def _output(state_root: str, run_id: str) -> str:
    """The job's output beside its journal: ``%j`` is the job id, which sbatch fills in."""
    return os.path.join(state_root, "runs", run_id, "job-%j.out")


def tool_command(environ: Mapping[str, str], running: Sequence[str]) -> List[str]:
    """What a job runs: ``$EB_STAGED_REBUILD_COMMAND`` (one path), else ``running`` (how this
    process was started, absolute), else the path the build_host role installs."""
    given = environ.get(COMMAND_VARIABLE)
    if given:
        if not os.path.isabs(given):
            raise errors.UsageError(f"{COMMAND_VARIABLE}={given!r} is not an absolute path")
        return [given]
    return list(running) or [INSTALLED_COMMAND]


@dataclasses.dataclass
class Queued:
    """A target's run, queued: its journal (the engine's), and its job once submitted."""

    placement: Placement
    journal: Any
    job_id: Optional[str] = None


def submit(
    sbatch: str,
    planned: Sequence[PlannedJob],
    queued: Sequence[Queued],
    env: Mapping[str, str],
) -> Dict[str, Any]:
    """Submit ``planned`` (``plan_jobs``' order: ``queued`` first, then the publish job) and
    record each target's job id in its journal; on sbatch's refusal cancel what went in and
    end every queued run ``failed`` (``SubmitError`` then, exit 1)."""
    publish_job = None
    try:
        for job, entry in zip(planned, queued):
            entry.job_id = slurmjob.submit(
                sbatch, job.options, job.script, env, Deadline(slurmjob.SUBMIT_SECONDS)
            )
            record_job(entry, entry.job_id)
        for job in planned[len(queued) :]:
            waits = [entry.job_id for entry in queued if entry.job_id]
            publish_job = slurmjob.submit(
                sbatch,
                [*job.options, *slurmjob.dependency_options(waits)],
                job.script,
                env,
                Deadline(slurmjob.SUBMIT_SECONDS),
            )
    except slurmjob.SubmitError as err:
        _cancel([entry.job_id for entry in queued if entry.job_id], env)
        for entry in queued:
            end_queued(entry, str(err))
        raise
    run_ids = {entry.journal.run_id for entry in queued}
    return {
        "changed": True,
        "run_id": run_ids.pop() if len(run_ids) == 1 else None,
        "jobs": [
            {
                "target": entry.placement.target,
                "job_id": entry.job_id,
                "state_root": entry.placement.state_root,
            }
            for entry in queued
        ],
        "publish_job": publish_job,
    }


def _cancel(job_ids: Sequence[str], env: Mapping[str, str]) -> None:
    """scancel the jobs of a submission that failed half-way; a job that already started is
    reversed by the SIGTERM, one still pending never runs."""
    scancel = proc.find_program("scancel", env.get("PATH", os.defpath))
    if scancel is None or not job_ids:
        return
    # Their runs are ended failed anyway: a job that starts later finds nothing queued.
    with contextlib.suppress(OSError, DeadlineExceeded):
        proc.run_child([scancel, *job_ids], env=env, deadline=Deadline(slurmjob.SUBMIT_SECONDS))


def node_check(site_path: Optional[str], state_root: str, env: Mapping[str, str]) -> Callable[[Any], None]:
    """What ``job-start`` checks before it builds a run (``rebuild.start_queued``'s
    ``check_node``): for a run of a target, that archdetect on this node names the target's
    CPU (``targets.check_cpu``), with the site file the job was given; a run without a
    target is not checked."""

    def check(journal: Any) -> None:
        job = journal.run.job
        name = None if job is None else job.target
        if name is None:
            return
        if site_path is None:
            raise errors.PublishError(
                f"run {journal.run_id} is of target {name}, but its job was given no site file "
                "to check this node with: nothing was built"
            )
        site = targets.load(site_path)
        target = site.targets.get(name)
        if target is None or os.path.normpath(state_root) != target.state_root:
            raise errors.PublishError(
                f"{site_path} has no target {name} with state root {state_root}: nothing was built"
            )
        targets.check_cpu(site, target, env, Deadline(targets.ARCHDETECT_SECONDS))

    return check


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A submission resolved and checked, nothing written yet: one run id, and for each
    placement the request its job builds."""

    run_id: str
    placements: List[Placement]
    requests: List[Any]


def prepare(
    values: Mapping[str, Any],
    environ: Mapping[str, str],
    eb_args: List[str],
    jobs: JobRequest,
    state_root: Optional[str],
) -> Prepared:
    """Each target's request (its trees from the site file; without ``--target`` the trees
    given, in ``state_root``), resolved and checked as ``rebuild`` checks it: a refusal of
    any target refuses the whole submission before anything is written."""
    run_id = paths.check_run_id(values.get("run_id") or request_module.new_run_id())
    common = dict(
        values,
        run_id=run_id,
        lock_timeout=job_lock_timeout(settings.lock_timeout(values)),
    )
    if not jobs.target:
        if state_root is None:
            raise errors.UsageError(f"no state root for {setting('job')} without {setting('target')}")
        placements = [Placement(None, state_root)]
        requests = [_for_job(request_module.resolve(common, environ, eb_args), jobs)]
        return Prepared(run_id, placements, requests)
    if jobs.targets_file is None:  # resolve() refused it already; the type checker does not know
        raise errors.UsageError(f"{setting('target')} needs a site file")
    chosen = targets.select(targets.load(jobs.targets_file), jobs.target)
    placements, requests = [], []
    for target in chosen:
        values_of_target = dict(
            common,
            installpath=None,
            installpath_software=target.trees.software,
            installpath_modules=target.trees.modules,
        )
        placements.append(Placement.of(target))
        requests.append(_for_job(request_module.resolve(values_of_target, environ, eb_args), jobs))
    return Prepared(run_id, placements, requests)


def _for_job(request: Any, jobs: JobRequest) -> Any:
    return dataclasses.replace(request, publish_together=jobs.together)


def submit_rebuild(
    prepared: Prepared, planned: Sequence[PlannedJob], env: Mapping[str, str]
) -> Dict[str, Any]:
    """Queue every run of ``prepared`` and submit ``planned``: the result ``--json`` prints."""
    sbatch = slurmjob.find_sbatch(env)  # before any journal: a refusal leaves nothing behind
    queued: List[Queued] = []
    try:
        for placement, request in zip(prepared.placements, prepared.requests):
            journal = rebuild.queue(request, placement.state_root, target=placement.target)
            queued.append(Queued(placement, journal))
    except errors.HpcstackError as err:
        for entry in queued:
            end_queued(entry, f"not submitted: {err}")
        raise
    return submit(sbatch, planned, queued, env)


@contextlib.contextmanager
def _still_queued(entry: Queued):
    """The entry's journal read again under its state lock, if its run is still queued;
    None when the lock is held (its job started and holds it) or the run moved on."""
    state_root, run_id = entry.placement.state_root, entry.journal.run_id
    try:
        with locking.StateLock(state_root, 0.0):
            fresh = journals.find(state_root, run_id)
            yield fresh if fresh.state is RunState.QUEUED else None
    except errors.LockHeld:
        yield None


def record_job(entry: Queued, job_id: str) -> None:
    """The job id into the queued run's journal, read again under its lock: the job may
    have started already (Slurm starts one within a second on an idle cluster), and a copy
    read before would undo what the job wrote. A job that started first records its own id
    (``rebuild.start_queued``)."""
    with _still_queued(entry) as journal:
        if journal is not None and journal.run.job is not None and journal.run.job.job_id is None:
            rebuild.record_job(journal, job_id)


def end_queued(entry: Queued, message: str) -> None:
    """A queued run of a submission that failed ends ``failed`` with ``message``; one whose
    job started meanwhile is that job's (cancelled: scancel's SIGTERM reverses it)."""
    with _still_queued(entry) as journal:
        if journal is not None:
            rebuild.end_failed(
                journal, journal.trees.generation(journal.run_id), slurmjob.SubmitError(message)
            )


# A run in one of these states has a job that matters now: waiting, or building.
_LIVE_STATES = {"queued"} | {state.value for state in journals.INTERRUPTED}


def with_job_states(result: Dict[str, Any], environ: Mapping[str, str]) -> Dict[str, Any]:
    """``status``'s result with, for each run still queued or building, its job as Slurm
    reports it (``job.slurm``): one squeue for all of them."""
    runs = result["runs"] if "runs" in result else [result["run"]]
    asking = [
        run for run in runs if run.get("job") and run["state"] in _LIVE_STATES and run["job"].get("job_id")
    ]
    states = slurmjob.job_states([run["job"]["job_id"] for run in asking], environ)
    for run in asking:
        found = states.get(run["job"]["job_id"])
        if found is not None:
            run["job"]["slurm"] = found.as_dict()
    return result
