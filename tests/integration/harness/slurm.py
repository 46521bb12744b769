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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

import checkout

SCRIPT = checkout.REPO / "testbed" / "slurm-local.sh"

# Usage: ``pytestmark = SLURM`` in a test module.
SLURM = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

NOOP_PROLOG = "#!/bin/sh\nexit 0\n"
START_TIMEOUT = 240  # the script waits up to 60 s for idle, after up to 180 s for its lock
STOP_TIMEOUT = 90
RUN_TIMEOUT = 60


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


def slurm_local(action: str, root: Path, timeout: float) -> subprocess.CompletedProcess:
    """``testbed/slurm-local.sh ACTION ROOT``; never raises on a non-zero exit."""
    return subprocess.run(
        ["bash", str(SCRIPT), action, str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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
