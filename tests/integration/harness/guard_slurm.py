"""``eessi-arch-guard`` as the TaskProlog of the session's real Slurm cluster.

The node is this machine, unsimulated: the job environment is what a login shell on a node
of another CPU target exported after loading EESSI and two user modules, with the variables
that simulate a node (``EESSI_PROC_CPUINFO``, ``EESSI_MACHINE_TYPE``,
``EESSI_LIKE_GPU_COMPUTE_CAP``) removed, so that archdetect, in the guard and in Lmod's
EESSI module alike, reads the real ``/proc/cpuinfo``. The prefix's targets are the one the
archdetect stand-in gives for that real CPU and one that CPU cannot use
(``eessilike.target_elsewhere``).

Slurm runs the guard the way a node without an installation would: an executable file
``#!<python> -IS`` whose body puts a COPY of ``plugins/module_utils`` (as ``hpcstack_ops``)
on ``sys.path``. Everything a job touches lives in a world-readable directory: jobs may run
as another user, and pytest's own temp dirs are private to root.

Each task of a job runs ``task.sh``, which prints one line per item the tests compare
(``task step=<step> rank=<rank> NAME=value``) and dumps its whole environment to
``<dir>/env.<step>.<rank>``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

import checkout
import eessilike
import slurmjobs
import stackenv
from tests.integration.harness.slurm import SlurmCluster

JOB_TIMEOUT = 180
POLL_SECONDS = 0.1
# ``modules`` is ``module -t list`` on one line; ``usera`` what the user module's command says.
TASK_SCRIPT = """#!/bin/bash
# One task's view of its environment. $1: the directory for the environment dump.
tag="task step=${SLURM_STEP_ID:-batch} rank=${SLURM_PROCID:-?}"
modules=
if [ -n "${LMOD_CMD:-}" ]; then
    modules=$("$LMOD_CMD" bash -t list 2>&1 >/dev/null | /usr/bin/paste -sd ' ' -)
fi
echo "$tag EESSI_SOFTWARE_SUBDIR=${EESSI_SOFTWARE_SUBDIR-}"
echo "$tag MODULEPATH=${MODULEPATH-}"
echo "$tag PATH=${PATH-}"
echo "$tag modules=$modules"
echo "$tag EESSI_ARCH_GUARD_RELOADED=${EESSI_ARCH_GUARD_RELOADED-}"
echo "$tag usera=$(usera 2>/dev/null || echo none)"
/usr/bin/env -0 >"$1/env.${SLURM_STEP_ID:-batch}.${SLURM_PROCID:-0}"
"""
_TASK_LINE = re.compile(r"^(?: *(\d+): )?task step=(\S+) rank=(\d+) (\w+)=(.*)$")
_GUARD_LINE = re.compile(r"^(?: *(\d+): )?(eessi-arch-guard: .*)$")
_STEP_MARK = re.compile(r"^== step (\S+)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# bash's own bookkeeping, not part of a saved login environment.
_SHELL_OWNED = {"PWD", "OLDPWD", "SHLVL", "_"}


def readable_by_all(root: Path) -> None:
    """``u=rwX,go=rX`` on ``root`` and everything under it: jobs of any user read it."""
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if path.is_symlink():
            continue
        path.chmod((mode & 0o700) | (0o055 if path.is_dir() or mode & 0o100 else 0o044))


def job_workdir(root: Path, name: str, task_script: str, owner: tuple[int, int] | None = None) -> Path:
    """A fresh directory under ``root`` for one job: ``task.sh`` (``task_script``), the dumps,
    the job's TMPDIR; readable by all, and owned by ``owner`` if given."""
    path = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=root))
    (path / "tmp").mkdir()
    task = path / "task.sh"
    task.write_text(task_script)
    task.chmod(0o755)
    readable_by_all(path)
    if owner is not None:
        for item in (path, path / "tmp", task):
            os.chown(item, *owner)
    return path


@dataclass
class JobOutput:
    """``tasks``: (step, rank) -> {item: value}; ``messages``: (section, rank label, text)."""

    text: str
    tasks: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)


def job_output(text: str, first: str = "batch") -> JobOutput:
    """Split a job's output into the tasks' reports and the guard's messages.

    A message belongs to the step whose ``== step N`` mark came last before it, or to
    ``first`` before any mark (a batch job's batch step: its prolog prints before the
    script starts). ``srun --label`` puts the task's rank in front of each line of a step.
    """
    out = JobOutput(text=text)
    section = first
    for line in text.splitlines():
        mark = _STEP_MARK.match(line)
        task = _TASK_LINE.match(line)
        guard = _GUARD_LINE.match(line)
        if mark:
            section = mark.group(1)
        elif task:
            label, step, rank, name, value = task.groups()
            out.tasks.setdefault((step, int(rank)), {})[name] = value
        elif guard:
            label, message = guard.groups()
            out.messages.append((section, None if label is None else int(label), message))
    return out


@dataclass(frozen=True)
class Job:
    job_id: str
    state: str
    exit_code: str
    output: JobOutput
    dumps: Path

    def env_dumps(self) -> dict:
        """``"<step>.<rank>"`` -> that task's environment, as ``task.sh`` dumped it."""
        return {
            path.name[len("env.") :]: eessilike.parse_env0(path.read_bytes())
            for path in sorted(self.dumps.glob("env.*"))
        }


@dataclass
class SlurmGuard:
    """The cluster, an EESSI-like prefix for this node and another target, and the guard."""

    cluster: SlurmCluster
    lmod: stackenv.Lmod
    prefix: eessilike.EessiPrefix
    root: Path
    package_root: Path
    node_target: str
    other_target: str
    python: str = sys.executable

    @contextlib.contextmanager
    def as_task_prolog(self) -> Iterator[None]:
        """The guard is the cluster's TaskProlog inside the block; the no-op one after it."""
        self.cluster.set_task_prolog(checkout.guard_task_prolog(self.python, self.package_root))
        try:
            yield
        finally:
            self.cluster.reset_task_prolog()

    def login_env(self, target: str | None, **extra: str) -> dict:
        """What a login shell on a node of ``target`` exports after ``module load EESSI/...
        UserA/1.0 UserB/2.0``, without the variables that simulate that node; ``None``
        logs in on this machine itself. ``extra`` is laid over it."""
        node_vars = self.prefix.node_env(target) if target else {}
        env = eessilike.login_environment(self.lmod, self.prefix, node_vars)
        for name in eessilike.NODE_VARIABLES:
            env.pop(name, None)
        env.update(extra)
        return env

    def module_list(self, env: dict) -> str:
        """``module -t list`` of ``env`` on one line, as ``task.sh`` prints it."""
        ran = eessilike.run_shell(self.lmod, env, "module -t list")
        assert ran.returncode == 0, ran.stderr
        return " ".join(ran.stderr.split())

    def workdir(self, name: str, owner: tuple[int, int] | None = None) -> Path:
        """A fresh directory for one job: ``task.sh``, the dumps, the job's TMPDIR."""
        return job_workdir(self.root, name, TASK_SCRIPT, owner)

    def batch_script(self, work: Path, relogin: Path | None = None) -> Path:
        """The batch script: the batch task's report, then two ``srun -n4`` steps.

        With ``relogin``, each srun step starts from that file's environment (sourced in a
        subshell), as a script that restores a saved login environment would.
        """
        task = f"{shlex.quote(str(work / 'task.sh'))} {shlex.quote(str(work))}"
        # Absolute: with --export=NONE the batch script has no PATH of the user's. --quiet: the
        # job's output file also takes srun's stderr, where a step that waits for the previous
        # one's cleanup says "step creation temporarily disabled, retrying".
        srun = f"{shlex.quote(shutil.which('srun') or 'srun')} --quiet --overcommit -n4 --label {task}"
        if relogin is not None:
            srun = f"( . {shlex.quote(str(relogin))} && {srun} )"
        lines = ["#!/bin/bash", task]
        for step in (0, 1):
            lines += [f"echo '== step {step}'", srun]
        script = work / "job.sh"
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        return script

    def sbatch(self, work: Path, script: Path, env: dict, *args: str, cwd: Path | None = None) -> Job:
        """Submit ``script`` with ``env`` (plus SLURM_CONF) from ``cwd`` (default ``work``),
        four tasks on the node's two cores; wait until the job has finished."""
        output = work / "job.out"
        submitted = self.cluster.run(
            ["sbatch", "--parsable", "--overcommit", "-n4", f"--output={output}", *args, str(script)],
            env=dict(env, SLURM_CONF=str(self.cluster.conf)),
            cwd=cwd or work,
        )
        if submitted.returncode != 0:
            pytest.fail(f"sbatch failed (exit {submitted.returncode}): {submitted.stderr}")
        job_id = submitted.stdout.strip().split(";")[0]
        state, exit_code = self.wait(job_id)
        text = output.read_text(errors="replace") if output.exists() else ""
        return Job(job_id, state, exit_code, job_output(text), work)

    def srun(self, argv: list[str], env: dict, cwd: Path, user=None) -> subprocess.CompletedProcess:
        """Run ``argv`` (an srun) as ``user`` (an UnprivilegedUser) or root, then wait until the
        cluster has no job left: srun returns while its job may still be COMPLETING (often, on
        a busy machine), and the next test expects an idle node."""
        if user is None:
            done = self.cluster.run(argv, env=env, cwd=cwd, timeout=JOB_TIMEOUT)
        else:
            done = user.run(argv, env=env, cwd=cwd, timeout=JOB_TIMEOUT)
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            listed = self.cluster.run(["squeue", "--noheader", "--format=%A %T"])
            if listed.returncode == 0 and not listed.stdout.strip():
                return done
            if time.monotonic() > deadline:
                pytest.fail(f"jobs still listed {JOB_TIMEOUT} s after srun returned: {listed.stdout}")
            time.sleep(POLL_SECONDS)

    def wait(self, job_id: str) -> tuple[str, str]:
        """Poll ``scontrol show job`` until the job has finished: (JobState, ExitCode)."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            shown = self.cluster.run(["scontrol", "show", "job", "--oneliner", job_id])
            fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
            if fields.get("JobState") in slurmjobs.FINISHED_STATES:
                return fields["JobState"], fields.get("ExitCode", "")
            if time.monotonic() > deadline:
                self.cluster.run(["scancel", job_id])
                pytest.fail(f"job {job_id} did not finish in {JOB_TIMEOUT} s: {shown.stdout} {shown.stderr}")
            time.sleep(POLL_SECONDS)


def write_env_file(path: Path, env: dict) -> Path:
    """``env`` as ``export NAME=value`` lines for ``.``; names a shell cannot set are left out."""
    lines = [
        f"export {name}={shlex.quote(value)}"
        for name, value in sorted(env.items())
        if _NAME.match(name) and name not in _SHELL_OWNED
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)
    return path


@pytest.fixture(scope="session")
def slurm_guard(slurm_cluster, lmod) -> Iterator[SlurmGuard]:
    """The prefix (this node's target and one it cannot use), the guard's package copy, in one
    world-readable directory that goes when the session ends."""
    node, other = eessilike.node_and_elsewhere()
    root = Path(tempfile.mkdtemp(prefix="hpcstack-guard-slurm-", dir="/tmp"))
    try:
        prefix = eessilike.build_prefix(root / "eessi", targets=(node, other), accel={})
        package_root = checkout.copy_package(root / "package")
        readable_by_all(root)
        yield SlurmGuard(
            cluster=slurm_cluster,
            lmod=lmod,
            prefix=prefix,
            root=root,
            package_root=package_root,
            node_target=node,
            other_target=other,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
