# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's side of a rebuild run as a job: the sbatch command, the batch script, and the
job's state as Slurm reports it.

A job is submitted as EasyBuild's ``--job`` submits its own: ``sbatch --parsable`` with the
options built here, the script written to sbatch's stdin (no ``--wrap``: the script
``exec``s the tool, so scancel's SIGTERM reaches the tool itself and not a shell that would
die first), and every ``SBATCH_*`` variable of the caller left for sbatch to read. A job that
depends on others is held with ``--dependency=afterok:A:B`` and ``--kill-on-invalid-dep=yes``,
so that Slurm cancels it, instead of keeping it pending for ever, when one of them fails.

A job's state is asked of ``squeue --all`` with an environment that has no filter of the
caller's (``runningjobs.client_environment``: squeue's view is the caller's otherwise); a job
squeue no longer lists (it ended a while ago) is asked of ``scontrol show job -o``, which
knows finished jobs for ``MinJobAge``; after that the state is ``unknown``. Every call has a
deadline; Slurm not answering is a state too (``unknown``, with why), never an exception:
``status`` shows the journals whatever Slurm says.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import socket
from typing import Dict, List, Mapping, Optional, Sequence

from ..common import errors, proc
from ..common.deadline import Deadline, DeadlineExceeded
from .runningjobs import client_environment, squeue_rows

SUBMIT_SECONDS = 60
ASK_SECONDS = 30
JOB_NAME_PREFIX = "eb-staged-rebuild"
# squeue --format: job id, state (long), nodes, reason.
SQUEUE_FORMAT = "%i|%T|%N|%r"
UNKNOWN = "unknown"
FINISHED = "finished"  # why a job is unknown: Slurm keeps no record of it any more
# The states of a job that has not ended (squeue(1) "JOB STATE CODES").
ALIVE = frozenset(
    (
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "RESV_DEL_HOLD",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
    )
)
# sbatch --parsable prints "<job id>" or "<job id>;<cluster>".
_PARSABLE = re.compile(r"^([0-9]+)(;[A-Za-z0-9_.-]+)?\Z")
# Slurm's job ids are decimal integers; a bound keeps a hand-edited journal's from being prose.
JOB_ID = re.compile(r"^[0-9]{1,20}\Z")
# One field of ``scontrol show job -o``: a value runs to the next blank.
_SCONTROL_FIELD = r"(?:^|\s){}=(\S*)"


class SubmitError(errors.HpcstackError):
    """sbatch refused or could not run: nothing of that submission is queued."""

    exit_code = errors.EXIT_WARNINGS
    kind = "submit_failed"


def this_node(env: Mapping[str, str]) -> str:
    """The node a job runs on, as Slurm names it (``SLURMD_NODENAME``), else the host's name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname()


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """EasyBuild's job options: ``--job-cores`` and ``--job-max-walltime`` (hours)."""

    cores: Optional[int] = None
    max_walltime_hours: Optional[float] = None

    def __post_init__(self) -> None:
        if self.cores is not None and self.cores < 1:
            raise errors.UsageError(f"{errors.setting('job_cores')} must be 1 or more, not {self.cores}")
        hours = self.max_walltime_hours
        if hours is not None and (not math.isfinite(hours) or hours <= 0):
            raise errors.UsageError(
                f"{errors.setting('job_max_walltime')} must be a number of hours above 0, not {hours}"
            )


def sbatch_options(
    name: str,
    output: str,
    options: JobOptions,
    *,
    constraint: Optional[str] = None,
    partition: Optional[str] = None,
) -> List[str]:
    """sbatch's options for one job (without the dependency, known only once the others run)."""
    argv = ["--parsable", f"--job-name={name}", f"--output={output}"]
    if options.cores is not None:
        argv.append(f"--cpus-per-task={options.cores}")
    if options.max_walltime_hours is not None:
        # Whole minutes, rounded up: a limit never shorter than the one asked for.
        argv.append(f"--time={math.ceil(options.max_walltime_hours * 60)}")
    if constraint is not None:
        argv.append(f"--constraint={constraint}")
    if partition is not None:
        argv.append(f"--partition={partition}")
    return argv


def dependency_options(after: Sequence[str]) -> List[str]:
    """Held until every job of ``after`` ended well; cancelled by Slurm when one did not."""
    if not after:
        return []
    return [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]


def job_name(run_id: str, target: Optional[str]) -> str:
    return f"{JOB_NAME_PREFIX}:{run_id}:{target or ''}".rstrip(":")


def script(command: Sequence[str]) -> str:
    """The batch script: ``exec`` of ``command``, so that the job's signals reach it."""
    return f"#!/bin/sh\nexec {shlex.join(command)}\n"


def submit(sbatch: str, options: Sequence[str], text: str, env: Mapping[str, str], deadline: Deadline) -> str:
    """Submit the batch script ``text`` with ``options``; the job id, or SubmitError with
    sbatch's own message."""
    argv = [sbatch, *options]
    try:
        done = proc.run_child(argv, env=env, deadline=deadline, input_bytes=text.encode())
    except DeadlineExceeded:
        raise SubmitError(f"sbatch did not answer within {deadline.seconds:g} s") from None
    except OSError as err:
        raise SubmitError(f"sbatch cannot run: {err.strerror}") from None
    if done.returncode != 0:
        said = proc.summary(done.stderr) or proc.summary(done.stdout) or "no message"
        raise SubmitError(f"sbatch exited {done.returncode}: {said}")
    return parse_parsable(os.fsdecode(done.stdout))


def parse_parsable(output: str) -> str:
    """The job id in ``sbatch --parsable``'s answer; SubmitError for anything else."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    found = _PARSABLE.match(lines[-1]) if lines else None
    if found is None:
        raise SubmitError(f"sbatch answered {proc.summary(output.encode())!r}, not a job id")
    return found.group(1)


def find_sbatch(env: Mapping[str, str]) -> str:
    found = proc.find_program("sbatch", env.get("PATH", os.defpath))
    if found is None:
        raise errors.UsageError(
            "sbatch not found on PATH: --job submits to Slurm from a host with its commands"
        )
    return found


@dataclasses.dataclass(frozen=True)
class JobState:
    """What Slurm says of one job: ``state`` as Slurm spells it (PENDING, RUNNING, COMPLETED,
    CANCELLED...) or ``unknown`` with ``why``; ``node`` once it has one; ``reason`` while pending."""

    job_id: str
    state: str
    node: Optional[str] = None
    reason: Optional[str] = None
    why: Optional[str] = None

    def as_dict(self) -> Dict[str, Optional[str]]:
        return dataclasses.asdict(self)


def parse_squeue(text: str) -> Dict[str, JobState]:
    """``squeue --format=%i|%T|%N|%r`` lines as job states by job id; ValueError for a line
    that is not one."""
    found = {}
    for job_id, state, node, reason in squeue_rows(text, 4):
        if not JOB_ID.match(job_id) or not state:
            raise ValueError(f"{'|'.join((job_id, state, node, reason))!r} is not a job id and a state")
        found[job_id] = JobState(
            job_id, state, node or None, None if reason in ("", "None", "(null)") else reason
        )
    return found


def parse_scontrol(job_id: str, text: str) -> Optional[JobState]:
    """``scontrol show job -o ID``'s line for ``job_id`` as its state, or None when it has none."""
    for line in text.splitlines():
        if _field(line, "JobId") != job_id:
            continue
        state = _field(line, "JobState")
        if not state:
            return None
        node, reason = _field(line, "NodeList"), _field(line, "Reason")
        return JobState(
            job_id,
            state,
            None if node in (None, "", "(null)") else node,
            None if reason in (None, "", "None", "(null)") else reason,
        )
    return None


def _field(line: str, name: str) -> Optional[str]:
    found = re.search(_SCONTROL_FIELD.format(name), line)
    return None if found is None else found.group(1)


def job_states(job_ids: Sequence[str], environ: Mapping[str, str]) -> Dict[str, JobState]:
    """Every job of ``job_ids`` as Slurm reports it now (``unknown`` with why where it does not)."""
    wanted = [job_id for job_id in dict.fromkeys(job_ids) if JOB_ID.match(job_id)]
    if not wanted:
        return {}
    path = environ.get("PATH", os.defpath)
    env = client_environment(environ)
    squeue = proc.find_program("squeue", path)
    if squeue is None:
        return {job_id: JobState(job_id, UNKNOWN, why="squeue not found on PATH") for job_id in wanted}
    listed, why = _ask_squeue(squeue, wanted, env)
    scontrol = proc.find_program("scontrol", path)
    states = {}
    for job_id in wanted:
        if job_id in listed:
            states[job_id] = listed[job_id]
        elif scontrol is None:
            states[job_id] = JobState(job_id, UNKNOWN, why=why or "not listed by squeue; no scontrol")
        else:
            states[job_id] = _ask_scontrol(scontrol, job_id, env)
    return states


def _ask_squeue(squeue: str, job_ids: Sequence[str], env: Mapping[str, str]):
    """The jobs squeue lists, and why none are when it did not answer."""
    argv = [squeue, "--all", "--noheader", f"--jobs={','.join(job_ids)}", f"--format={SQUEUE_FORMAT}"]
    try:
        done = proc.run_child(argv, env=env, deadline=Deadline(ASK_SECONDS))
    except DeadlineExceeded:
        return {}, f"squeue did not answer within {ASK_SECONDS} s"
    except OSError as err:
        return {}, f"squeue cannot run: {err.strerror}"
    # squeue exits 1 when a job of the list is one it no longer knows: scontrol is asked then.
    try:
        return parse_squeue(os.fsdecode(done.stdout)), ""
    except ValueError as err:
        return {}, f"squeue's answer was not understood: {err}"


def _ask_scontrol(scontrol: str, job_id: str, env: Mapping[str, str]) -> JobState:
    try:
        done = proc.run_child(
            [scontrol, "show", "job", "-o", job_id], env=env, deadline=Deadline(ASK_SECONDS)
        )
    except DeadlineExceeded:
        return JobState(job_id, UNKNOWN, why=f"scontrol did not answer within {ASK_SECONDS} s")
    except OSError as err:
        return JobState(job_id, UNKNOWN, why=f"scontrol cannot run: {err.strerror}")
    if done.returncode != 0:
        said = proc.summary(done.stderr) or "no message"
        # Slurm's words for a job it no longer keeps (older than MinJobAge).
        gone = "Invalid job id" in said
        return JobState(
            job_id, UNKNOWN, why="finished" if gone else f"scontrol exited {done.returncode}: {said}"
        )
    return parse_scontrol(job_id, os.fsdecode(done.stdout)) or JobState(job_id, UNKNOWN, why="finished")


def job_alive(job_id: str, environ: Mapping[str, str]) -> Optional[bool]:
    """Whether the job may still run (pending, running...): True; it ended, or Slurm keeps
    no record of it: False; Slurm did not answer: None (``resume`` then leaves its run)."""
    state = job_states([job_id], environ).get(job_id)
    if state is None:
        return False  # not a job id: no job of Slurm's
    if state.state == UNKNOWN:
        return False if state.why == FINISHED else None
    return state.state in ALIVE
