"""A real single-node Slurm cluster for the whole test session: ``testbed/slurm-local.sh``.

One cluster serves every test marked with ``SLURM``. Under pytest-xdist those tests share a
worker (``--dist loadgroup``): the cluster is a session fixture, and a session is per worker.
pytest is pinned below 9.2, which ignores ``xdist_group`` (pytest-xdist issue 1386); were the
grouping lost, each worker would start a cluster of its own, in its own directory and on its
own ports: slower, still correct.

The cluster's directory is world-searchable (pytest's own temp dirs are private to root), so
munged accepts its socket path and jobs can run as any user.

The cluster's TaskProlog is a file the tests replace; Slurm reads it afresh for every task,
so no reconfiguration is needed between tests. A test that changes it puts the no-op prolog
back (``reset_task_prolog``) when it is done.

``RunningJob`` is a ``sleep`` job of that cluster, of root or of another user, in a partition
and a working directory of the test's choosing. ``slurm_partitions`` adds, for one test, the
partitions a user may not see jobs of: ``hidden`` (``Hidden=YES``) and ``restricted``
(``AllowGroups`` the attacker user's group alone). They are made with ``scontrol create`` and
deleted afterwards, so slurm.conf and every other test's view of the cluster stay as they
are. ``private_data_jobs`` sets ``PrivateData=jobs`` for one test (slurm.conf and
``scontrol reconfigure``, which also drops partitions made at run time) and puts it back.
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

from slurmjobs import slurm_local
from tests.support.users import UnprivilegedUser

# Usage: ``pytestmark = SLURM`` in a test module.
SLURM = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

NOOP_PROLOG = "#!/bin/sh\nexit 0\n"
START_TIMEOUT = 240  # the script waits up to 60 s for idle, after up to 180 s for its lock
STOP_TIMEOUT = 90
RUN_TIMEOUT = 60
JOB_TIMEOUT = 60
HIDDEN = "hidden"
RESTRICTED = "restricted"


@dataclass(frozen=True)
class SlurmCluster:
    """The running cluster: its directory, its slurm.conf, and how to talk to it."""

    root: Path
    conf: Path

    @property
    def task_prolog(self) -> Path:
        return self.root / "task_prolog"

    def env(self) -> dict:
        """A copy of this process's environment pointing Slurm's clients at the cluster."""
        env = os.environ.copy()
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, args: list[str], *, timeout: float = RUN_TIMEOUT, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client (srun, sbatch, sinfo...); never raises on a non-zero exit."""
        kw.setdefault("env", self.env())
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        check = kw.pop("check", False)
        return subprocess.run(args, check=check, timeout=timeout, **kw)

    def set_task_prolog(self, text: str) -> None:
        """Replace the TaskProlog in one rename.

        A task starting while the file is rewritten in place would run half a script, or fail
        with ETXTBSY; after the rename it runs either the old file or the new one.
        """
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".task_prolog.")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            # Executable by slurmstepd, which runs it as the job's user.
            os.chmod(tmp, 0o755)  # noqa: S103
            os.replace(tmp, self.task_prolog)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def reset_task_prolog(self) -> None:
        self.set_task_prolog(NOOP_PROLOG)


def _text(data) -> str:
    # TimeoutExpired carries bytes even when the run asked for text.
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _output(done) -> str:
    code = getattr(done, "returncode", "timeout")
    return f"exit {code}\n--- stdout\n{_text(done.stdout)}--- stderr\n{_text(done.stderr)}"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the session's cluster; stop it, by pid, when the session ends.

    A cluster that does not start fails the test: the CI machine has Slurm, so a skip would
    only hide a broken set-up.
    """
    root = Path(tempfile.mkdtemp(prefix="hpcstack-slurm-", dir="/tmp"))
    root.chmod(0o755)  # job users and munge clients must reach the socket
    try:
        started = slurm_local("start", root, START_TIMEOUT)
    except subprocess.TimeoutExpired as err:
        slurm_local("stop", root, STOP_TIMEOUT)
        pytest.fail(f"testbed/slurm-local.sh start {root} timed out after {err.timeout} s: {_output(err)}")
    if started.returncode != 0:
        # The script stops what it started when it fails; stop again in case it was killed.
        slurm_local("stop", root, STOP_TIMEOUT)
        pytest.fail(f"testbed/slurm-local.sh start {root} failed: {_output(started)}")
    try:
        yield SlurmCluster(root=root, conf=root / "slurm.conf")
    finally:
        stopped = slurm_local("stop", root, STOP_TIMEOUT)
        if stopped.returncode != 0:
            pytest.fail(f"testbed/slurm-local.sh stop {root} failed: {_output(stopped)}")
        shutil.rmtree(root, ignore_errors=True)


class RunningJob:
    """A ``sleep`` job of the session's cluster, running until ``cancel``: root's, or
    ``user``'s; in ``partition`` (the default one when None); working in ``workdir``."""

    def __init__(
        self,
        cluster: SlurmCluster,
        workdir: Path,
        *,
        user: Optional[UnprivilegedUser] = None,
        partition: Optional[str] = None,
    ) -> None:
        self.cluster = cluster
        argv = ["sbatch", "--parsable", "--output=/dev/null", f"--chdir={workdir}"]
        if partition is not None:
            argv.append(f"--partition={partition}")
        argv += ["--wrap", "exec sleep 600"]
        env = None
        if user is not None:
            argv = user.command(argv)
            env = dict(user.env(), SLURM_CONF=str(cluster.conf))
        submitted = cluster.run(argv, env=env or cluster.env(), cwd="/")
        assert submitted.returncode == 0, submitted.stderr
        self.job_id = submitted.stdout.strip().split(";")[0]
        deadline = time.monotonic() + JOB_TIMEOUT
        while self.state() != "RUNNING":
            if time.monotonic() > deadline:
                self.cancel()
                pytest.fail(f"job {self.job_id} never ran")
            time.sleep(0.1)

    def state(self) -> str:
        listed = self.cluster.run(["squeue", "--all", "--noheader", "--jobs", self.job_id, "--format=%T"])
        return listed.stdout.strip()

    def cancel(self) -> None:
        self.cluster.run(["scancel", self.job_id])
        deadline = time.monotonic() + JOB_TIMEOUT
        while self.state() and time.monotonic() < deadline:
            time.sleep(0.1)


def _wait_for(what: str, ready) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster never {what}")
        time.sleep(0.1)


def _partitions(cluster: SlurmCluster) -> str:
    return cluster.run(["scontrol", "--all", "--oneliner", "show", "partition"]).stdout


@pytest.fixture
def slurm_partitions(slurm_cluster: SlurmCluster, attacker_user: UnprivilegedUser) -> Iterator[SlurmCluster]:
    """The cluster with ``hidden`` (``Hidden=YES``) and ``restricted`` (``AllowGroups`` the
    attacker user's group) beside its default partition, for one test."""
    group = grp.getgrgid(attacker_user.gid).gr_name
    added = {HIDDEN: "Hidden=YES", RESTRICTED: f"AllowGroups={group}"}
    try:
        for name, rule in added.items():
            made = slurm_cluster.run(
                [
                    "scontrol",
                    "create",
                    f"PartitionName={name}",
                    "Nodes=ALL",
                    "MaxTime=INFINITE",
                    "State=UP",
                    rule,
                ]
            )
            assert made.returncode == 0, made.stderr
        yield slurm_cluster
    finally:
        # A partition with jobs cannot be deleted.
        slurm_cluster.run(["scancel", f"--partition={HIDDEN},{RESTRICTED}"])
        _wait_for(
            "ended the jobs of the test's partitions",
            lambda: (
                not slurm_cluster.run(
                    ["squeue", "--all", "--noheader", f"--partition={HIDDEN},{RESTRICTED}", "--format=%i"]
                ).stdout.strip()
            ),
        )
        for name in added:
            slurm_cluster.run(["scontrol", "delete", f"PartitionName={name}"])
        left = [name for name in added if f"PartitionName={name} " in _partitions(slurm_cluster)]
        assert left == [], f"partitions {left} were not deleted"


def _private_data(cluster: SlurmCluster) -> str:
    for line in cluster.run(["scontrol", "show", "config"]).stdout.splitlines():
        name, _sep, value = line.partition("=")
        if name.strip() == "PrivateData":
            return value.strip()
    return ""


@pytest.fixture
def private_data_jobs(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with ``PrivateData=jobs`` for one test: users see only their own jobs."""
    original = slurm_cluster.conf.read_text()
    try:
        slurm_cluster.conf.write_text(original + "PrivateData=jobs\n")
        done = slurm_cluster.run(["scontrol", "reconfigure"])
        assert done.returncode == 0, done.stderr
        _wait_for("said PrivateData=jobs", lambda: _private_data(slurm_cluster) == "jobs")
        yield slurm_cluster
    finally:
        slurm_cluster.conf.write_text(original)
        slurm_cluster.run(["scontrol", "reconfigure"])
        _wait_for("said PrivateData=none", lambda: _private_data(slurm_cluster) == "none")
