"""Every variable ``squeue(1)`` and ``scontrol(1)`` list under "ENVIRONMENT VARIABLES"
(Slurm 22.05), with a value that changes the answer gc reads: fewer jobs, another cluster,
another format. gc's question to Slurm must come out the same whatever of these its caller
has set.
"""

from __future__ import annotations

CLIENT_VARIABLES = {
    "SQUEUE_USERS": "root",  # only root's jobs
    "SQUEUE_PARTITION": "debug",  # only one partition's
    "SQUEUE_ACCOUNT": "none",
    "SQUEUE_QOS": "none",
    "SQUEUE_NAMES": "none",
    "SQUEUE_LICENSES": "none",
    "SQUEUE_STATES": "PENDING",  # a line for a pending job has no start time
    "SQUEUE_FORMAT": "%i",  # another format than the parser's
    "SQUEUE_FORMAT2": "JobID",
    "SQUEUE_SORT": "-S",
    "SQUEUE_ALL": "1",
    "SQUEUE_ARRAY": "1",
    "SQUEUE_ARRAY_UNIQUE": "1",
    "SQUEUE_FEDERATION": "1",
    "SQUEUE_LOCAL": "1",
    "SQUEUE_PRIORITY": "1",
    "SQUEUE_SIB": "1",
    "SQUEUE_SIBLING": "1",
    "SLURM_CLUSTERS": "elsewhere",  # another cluster's jobs
    "SLURM_TIME_FORMAT": "relative",  # "Ystday 13:00" instead of a time
    "SLURM_BITSTR_LEN": "8",
    "SLURM_DEBUG_FLAGS": "Protocol",
    "SCONTROL_ALL": "1",
    "SCONTROL_FEDERATION": "1",
    "SCONTROL_FUTURE": "1",
    "SCONTROL_LOCAL": "1",
    "SCONTROL_SIBLING": "1",
    "SLURM_JOB_ID": "4242",  # a job's own variables: not options, but not needed either
}
