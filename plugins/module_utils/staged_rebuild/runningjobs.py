# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm jobs that are running, and since when: what gc's Slurm rule reads.

A job that started before a tree was swapped out may have resolved the old path (loaded its
module, opened a library) on any node, and may open more of it later. ``squeue`` knows every
running job of the cluster and when it started; when it answers, gc keeps a retired tree
exactly while such a job runs, instead of for a fixed grace period. When it does not answer
(no ``squeue``, no controller, an answer it cannot read) or may not show every job (a user
other than root where ``PrivateData`` hides other users' jobs), the grace period decides,
and the report says why.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import List, Mapping, Optional

from ..common import proc
from ..common.deadline import Deadline, DeadlineExceeded

# Suspended jobs keep their files open; completing ones may still have processes.
STATES = "RUNNING,SUSPENDED,COMPLETING"
FORMAT = "%i|%S|%u|%N"  # job id, start time, user, nodes
ANSWER_SECONDS = 30
# squeue prints times in the local time zone, without one (SLURM_TIME_FORMAT aside).
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


@dataclasses.dataclass(frozen=True)
class Job:
    job_id: str
    started: datetime.datetime
    user: str
    nodes: str

    def as_dict(self) -> dict:
        return {
            "job_id": self.job_id,
            "started": self.started.isoformat(),
            "user": self.user,
            "nodes": self.nodes,
        }


@dataclasses.dataclass(frozen=True)
class RunningJobs:
    """``jobs`` when Slurm answered for every job, else None and ``why`` not."""

    jobs: Optional[List[Job]]
    why: str = ""

    @property
    def known(self) -> bool:
        return self.jobs is not None

    def started_before(self, moment: datetime.datetime) -> List[Job]:
        return [job for job in self.jobs or () if job.started < moment]

    def summary(self) -> dict:
        if self.jobs is None:
            return {"answered": False, "why": self.why, "fallback": "grace period"}
        return {"answered": True, "running": len(self.jobs)}


NOT_ASKED = RunningJobs(None, "not asked (--no-squeue)")


def running_jobs(environ: Mapping[str, str]) -> RunningJobs:
    """Every running job, from ``squeue`` on ``environ``'s PATH, or why not."""
    path = environ.get("PATH", os.defpath)
    squeue = proc.find_program("squeue", path)
    if squeue is None:
        return RunningJobs(None, "squeue not found on PATH")
    env = dict(environ)
    env.pop("SLURM_TIME_FORMAT", None)  # the format parsed below
    hidden = _hides_other_users_jobs(path, env)
    if hidden:
        return RunningJobs(None, hidden)
    return _ask(squeue, env)


def _ask(squeue: str, env: Mapping[str, str]) -> RunningJobs:
    argv = [squeue, "--noheader", f"--states={STATES}", f"--format={FORMAT}"]
    try:
        answer = proc.run_child(argv, env=env, deadline=Deadline(ANSWER_SECONDS))
    except DeadlineExceeded:
        return RunningJobs(None, f"squeue did not answer within {ANSWER_SECONDS} s")
    except OSError as err:
        return RunningJobs(None, f"squeue cannot run: {err.strerror}")
    if answer.returncode != 0:
        said = proc.summary(answer.stderr) or "no message"
        return RunningJobs(None, f"squeue exited {answer.returncode}: {said}")
    try:
        return RunningJobs(parse(os.fsdecode(answer.stdout)))
    except ValueError as err:
        return RunningJobs(None, f"squeue's answer was not understood: {err}")


def parse(text: str) -> List[Job]:
    """``squeue --format=%i|%S|%u|%N`` lines as jobs; ValueError for a line that is not one."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 4:
            raise ValueError(f"{line!r} has {len(fields)} fields, not 4")
        job_id, started, user, nodes = fields
        try:
            moment = datetime.datetime.strptime(started, _TIME_FORMAT).astimezone()
        except ValueError:
            raise ValueError(f"job {job_id} started at {started!r}, not a time") from None
        jobs.append(Job(job_id, moment, user, nodes))
    return jobs


def _hides_other_users_jobs(path: str, env: Mapping[str, str]) -> str:
    """Why squeue would not show every job to this user, or "" when it would (as root, or
    without ``PrivateData=jobs``). An answer that cannot be had counts as hiding."""
    if os.geteuid() == 0:
        return ""
    scontrol = proc.find_program("scontrol", path)
    if scontrol is None:
        return "scontrol not found on PATH, so whether squeue shows other users' jobs is unknown"
    try:
        answer = proc.run_child([scontrol, "show", "config"], env=env, deadline=Deadline(ANSWER_SECONDS))
    except (DeadlineExceeded, OSError):
        return "scontrol show config did not answer, so whether squeue shows other users' jobs is unknown"
    for line in os.fsdecode(answer.stdout).splitlines():
        name, sep, value = line.partition("=")
        if (
            sep
            and name.strip() == "PrivateData"
            and "jobs" in [part.strip() for part in value.lower().split(",")]
        ):
            return f"PrivateData={value.strip()}: squeue shows uid {os.geteuid()} only its own jobs"
    if answer.returncode != 0:
        return f"scontrol show config exited {answer.returncode}"
    return ""
