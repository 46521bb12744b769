# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm jobs that are running, and since when: what gc's Slurm rule reads.

A job that started before a tree was swapped out may have resolved the old path (loaded its
module, opened a library) on any node, and may open more of it later. ``squeue`` knows every
running job of the cluster and when it started; when it answers for every job, gc keeps a
retired tree exactly while such a job runs, instead of for a fixed grace period.

squeue answers with its caller's view, so the question is put so that the view is the whole
cluster's, or not believed:

- ``--all``: jobs of hidden partitions and of partitions the caller's groups may not use are
  listed too (without it, slurmctld leaves them out for anyone but root, ``SlurmUser`` and
  Slurm's operators);
- an environment without the variables squeue and scontrol read as options
  (``client_environment``): ``SQUEUE_USERS``, ``SQUEUE_PARTITION``, ``SQUEUE_ACCOUNT``,
  ``SQUEUE_QOS``, ``SQUEUE_NAMES``, ``SQUEUE_LICENSES``, ``SQUEUE_STATES`` and
  ``SLURM_CLUSTERS`` filter the jobs, ``SQUEUE_FORMAT``, ``SQUEUE_FORMAT2`` and
  ``SLURM_TIME_FORMAT`` change what the parser reads; every ``SQUEUE_*``, ``SCONTROL_*`` and
  ``SLURM_*`` goes but ``SLURM_CONF``, which names the cluster. ``TZ`` is UTC, so that a start
  time, printed without a zone, means one moment (a local clock repeats an hour each autumn);
- a caller that is neither root nor the cluster's ``SlurmUser`` is believed only where
  ``scontrol show config`` says ``PrivateData`` does not hide other users' jobs, the one
  restriction ``--all`` does not lift (``visibility``).

When squeue does not answer (no ``squeue``, no controller, an answer it cannot read) or may
not show every job, the grace period decides, and the report says why.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from typing import Dict, List, Mapping, Optional

from ..common import proc
from ..common.deadline import Deadline, DeadlineExceeded

# Suspended jobs keep their files open; completing ones may still have processes.
STATES = "RUNNING,SUSPENDED,COMPLETING"
FORMAT = "%i|%S|%u|%N"  # job id, start time, user, nodes
ANSWER_SECONDS = 30
# squeue prints times in its time zone without naming it; it runs in UTC (client_environment).
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
_ZONE = "UTC0"
# What Slurm's clients read from the environment as options (squeue(1), scontrol(1)
# "ENVIRONMENT VARIABLES"), by prefix, so that a variable a later release adds goes too.
_CLIENT_PREFIXES = ("SQUEUE_", "SCONTROL_", "SLURM_")
_CLUSTER = "SLURM_CONF"  # which cluster: the caller's, kept
# ``SlurmUser = slurm(64030)`` in ``scontrol show config``.
_SLURM_USER = re.compile(r"\((\d+)\)\s*$")


def client_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` for squeue and scontrol: without a variable they read as an option (a
    filter, a format, another cluster) but ``SLURM_CONF``, and with ``TZ`` UTC."""
    env = {
        name: value
        for name, value in environ.items()
        if name == _CLUSTER or not name.startswith(_CLIENT_PREFIXES)
    }
    env["TZ"] = _ZONE
    return env


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
    """Every running job of the cluster, from ``squeue --all`` on ``environ``'s PATH, or why
    there is no such answer."""
    path = environ.get("PATH", os.defpath)
    squeue = proc.find_program("squeue", path)
    if squeue is None:
        return RunningJobs(None, "squeue not found on PATH")
    env = client_environment(environ)
    unseen = _why_not_every_job(path, env)
    if unseen:
        return RunningJobs(None, unseen)
    return _ask(squeue, env)


def _ask(squeue: str, env: Mapping[str, str]) -> RunningJobs:
    argv = [squeue, "--all", "--noheader", f"--states={STATES}", f"--format={FORMAT}"]
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


def squeue_rows(text: str, width: int) -> List[List[str]]:
    """The ``|``-separated fields of each line of squeue's ``--format`` answer, blank lines
    left out; ValueError for a line that has not ``width`` fields."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.strip().split("|")]
        if len(fields) != width:
            raise ValueError(f"{line.strip()!r} has {len(fields)} fields, not {width}")
        rows.append(fields)
    return rows


def parse(text: str) -> List[Job]:
    """``squeue --format=%i|%S|%u|%N`` lines, times in UTC, as jobs; ValueError for a line
    that is not one."""
    jobs = []
    for job_id, started, user, nodes in squeue_rows(text, 4):
        try:
            moment = datetime.datetime.strptime(started, _TIME_FORMAT).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            raise ValueError(f"job {job_id} started at {started!r}, not a time") from None
        jobs.append(Job(job_id, moment, user, nodes))
    return jobs


def _why_not_every_job(path: str, env: Mapping[str, str]) -> str:
    """Why ``squeue --all`` may not show this process every job, or "" when it does: as
    root without asking, else as ``scontrol show config`` says (``visibility``). An answer
    that cannot be had counts as not every job."""
    euid = os.geteuid()
    if euid == 0:
        return ""
    scontrol = proc.find_program("scontrol", path)
    if scontrol is None:
        return _unknown("scontrol not found on PATH", euid)
    try:
        answer = proc.run_child([scontrol, "show", "config"], env=env, deadline=Deadline(ANSWER_SECONDS))
    except (DeadlineExceeded, OSError):
        return _unknown("scontrol show config did not answer", euid)
    if answer.returncode != 0:
        said = proc.summary(answer.stderr) or "no message"
        return _unknown(f"scontrol show config exited {answer.returncode} ({said})", euid)
    return visibility(os.fsdecode(answer.stdout), euid)


def _unknown(problem: str, euid: int) -> str:
    return f"{problem}, so whether squeue shows uid {euid} every job is unknown"


def visibility(config: str, euid: int) -> str:
    """Why ``squeue --all`` may not show uid ``euid`` every job, from the text of ``scontrol
    show config``, or "" when it does.

    ``--all`` lifts the hiding of hidden partitions and of partitions closed to the caller's
    groups; what it does not lift is ``PrivateData=jobs``, under which slurmctld shows a user
    only its own jobs (and those of accounts it coordinates), unless the user is root,
    ``SlurmUser`` or an operator. Operators are known to the accounting database only, so an
    operator other than ``SlurmUser`` is not believed: the grace period then decides.
    """
    settings = {}
    for line in config.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            settings[name.strip()] = value.strip()
    owner = _SLURM_USER.search(settings.get("SlurmUser", ""))
    if owner is not None and int(owner.group(1)) == euid:
        return ""
    private = settings.get("PrivateData")
    if private is None:
        return _unknown("scontrol show config names no PrivateData", euid)
    if "jobs" in [part.strip() for part in private.lower().split(",")]:
        return (
            f"PrivateData={private}: squeue shows uid {euid} (neither root nor SlurmUser) only its own jobs"
        )
    return ""
