"""What Slurm's own tools say about a job, shared by the test harness and ``make demo``."""

from __future__ import annotations

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
