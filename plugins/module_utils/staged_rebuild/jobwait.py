# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for a submission's Slurm jobs, and what each target's run came to.

``rebuild --job`` returns once its jobs are submitted; the ``staged_rebuild`` module waits
for them (``wait``): until every target's run has ended (its journal says so) or its job
has ended before the run did (cancelled while pending: the run stays ``queued``), and, with
``--publish together``, until the last job has ended too. The journals, on the shared
filesystem, say what each run came to; Slurm says what became of each job. ``report`` puts
both in one entry per target, and one line per target for a person.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..common import errors, lockwait
from ..common.deadline import Deadline
from . import journal as journals
from . import slurmjob

# Slurm's states of a job that has not ended (squeue's long names).
_RUNNING = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "RESV_DEL_HOLD",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
        "STOPPED",
        "SUSPENDED",
    }
)
# A run in one of these states waits for its job, or its job is still working on it.
_ACTIVE = frozenset({journals.RunState.QUEUED}) | journals.INTERRUPTED
POLL_SECONDS = 2.0


class WaitTimeout(errors.HpcstackError):
    """The jobs had not ended when the wait's time was up (they go on in Slurm)."""

    exit_code = errors.EXIT_WARNINGS
    kind = "wait_timeout"


def job_ended(state: Optional[slurmjob.JobState]) -> bool:
    """Whether Slurm is done with a job: an end state, or a job it no longer knows."""
    return state is not None and state.state not in _RUNNING


def _runs(submitted: Mapping[str, Any]) -> List[Any]:
    run_id = submitted["run_id"]
    return [journals.find(job["state_root"], run_id) for job in submitted["jobs"]]


def _done(runs: List[Any], states: Mapping[str, slurmjob.JobState], publish_job: Optional[str]) -> bool:
    for journal, job_id in runs:
        if journal.state in _ACTIVE and not job_ended(states.get(job_id)):
            return False
    return publish_job is None or job_ended(states.get(publish_job))


def wait(
    submitted: Mapping[str, Any], environ: Mapping[str, str], timeout: float
) -> Dict[str, slurmjob.JobState]:
    """Wait until ``submitted``'s jobs (``rebuild --job``'s result) are over; their last
    states. Raises ``WaitTimeout`` after ``timeout`` seconds. Slurm tells no one when a job
    ends: its answer is asked again every ``POLL_SECONDS``, with lockwait's poll, the one
    waiting loop of the code."""
    job_ids = [str(job["job_id"]) for job in submitted["jobs"]]
    publish_job = submitted.get("publish_job")
    if publish_job is not None:
        job_ids.append(str(publish_job))
    last: Dict[str, slurmjob.JobState] = {}

    def ended() -> bool:
        last.clear()
        last.update(slurmjob.job_states(job_ids, environ))
        runs = list(zip(_runs(submitted), job_ids))
        return _done(runs, last, None if publish_job is None else str(publish_job))

    if not lockwait.poll(ended, Deadline(timeout), first_pause=POLL_SECONDS, longest_pause=POLL_SECONDS):
        raise WaitTimeout(f"the jobs of run {submitted['run_id']} had not ended after {timeout:g} s")
    return dict(last)


def report(
    submitted: Mapping[str, Any],
    states: Mapping[str, slurmjob.JobState],
    tool: str,
    targets_file: Optional[str] = None,
) -> Dict[str, Any]:
    """One entry per target (job id, node, Slurm's state, the run's state, published or not,
    the reason of a failure), one line per target, and the commands that finish what is
    staged (``tool publish RUN`` and ``tool discard RUN``, naming ``targets_file``'s targets
    whose runs are staged)."""
    run_id = submitted["run_id"]
    entries = []
    for job, journal in zip(submitted["jobs"], _runs(submitted)):
        run = journal.run
        job_id = str(job["job_id"])
        slurm = states.get(job_id)
        entries.append(
            {
                "target": job["target"],
                "state_root": job["state_root"],
                "job_id": job_id,
                "node": run.job.node if run.job is not None else None,
                "job_state": slurm.state if slurm is not None else slurmjob.UNKNOWN,
                "state": run.state.value,
                "published": run.state is journals.RunState.PUBLISHED,
                "cancelled": bool(run.cancelled),
                "reason": run.error,
            }
        )
    publish_job = submitted.get("publish_job")
    result: Dict[str, Any] = {
        "run_id": run_id,
        "publish_job": None if publish_job is None else str(publish_job),
        "publish_job_state": None,
        "targets": entries,
        "lines": [_line(entry) for entry in entries],
        "next": [],
    }
    if publish_job is not None:
        slurm = states.get(str(publish_job))
        result["publish_job_state"] = slurm.state if slurm is not None else slurmjob.UNKNOWN
    if any(entry["state"] == journals.RunState.STAGED.value for entry in entries):
        # The staged runs alone: publish refuses a set with a run that is not staged.
        targets = [entry["target"] for entry in entries if entry["target"] and entry["state"] == "staged"]
        if targets and targets_file is not None:
            chosen = [
                "--targets-file",
                targets_file,
                *(word for name in targets for word in ("--target", name)),
            ]
        else:
            chosen = ["--state-root", entries[0]["state_root"]]
        result["next"] = [
            " ".join([tool, "publish", run_id, *chosen]),
            " ".join([tool, "discard", run_id, *chosen]),
        ]
    return result


def _line(entry: Mapping[str, Any]) -> str:
    where = f" on {entry['node']}" if entry["node"] else ""
    name = entry["target"] or "the trees given"
    words = f"{name}: {entry['state']}, job {entry['job_id']}{where} {entry['job_state']}"
    if entry["published"]:
        return f"{words}, published"
    words += ", not published"
    if entry["cancelled"]:
        words += ", cancelled"
    if entry["reason"]:
        words += f": {entry['reason']}"
    return words


def failed(result: Mapping[str, Any], together: bool) -> Optional[str]:
    """Why a waited submission did not do what it was asked (one line), or None when it did:
    every target published."""
    entries = result["targets"]
    if all(entry["published"] for entry in entries):
        return None
    not_published = [entry["target"] or "the trees given" for entry in entries if not entry["published"]]
    first = next((entry for entry in entries if entry["reason"]), None)
    why = f": {first['target'] or 'the trees given'}: {first['reason']}" if first is not None else ""
    what = "published none of its targets" if together else f"did not publish {', '.join(not_published)}"
    return f"run {result['run_id']} {what}{why}"
