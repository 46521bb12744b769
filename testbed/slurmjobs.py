"""What Slurm's own tools say about a job, and the private single-node Slurm of
``testbed/slurm-local.sh``; shared by the test harness and ``make demo``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localplay import ADMIN_PATH

SLURM_LOCAL = Path(__file__).resolve().parent / "slurm-local.sh"

# scontrol's job states after which nothing of the job runs any more.
FINISHED_STATES = frozenset(
    (
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    )
)


def slurm_local(action: str, cluster: Path, timeout: float) -> subprocess.CompletedProcess:
    """``testbed/slurm-local.sh ACTION CLUSTER`` with the daemons on PATH (a root shell's:
    munged, slurmctld and slurmd are in sbin); never raises: a timeout is an exit status 1
    whose stderr says so."""
    env = dict(os.environ, PATH=os.pathsep.join([os.environ.get("PATH", os.defpath), ADMIN_PATH]))
    try:
        return subprocess.run(
            ["bash", str(SLURM_LOCAL), action, str(cluster)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 1, "", f"slurm-local.sh {action} took more than {timeout} s")
