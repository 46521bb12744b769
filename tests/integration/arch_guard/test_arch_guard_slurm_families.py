"""The guard across CPU families as the TaskProlog of the session's real Slurm cluster.

A user started EESSI with ``init/lmod/bash`` on a login node of one family (its Lmod: the
compatibility layer's of that family) and loaded a module; the job runs on a node of another
family. The node is this machine, made a node of the other family as archdetect takes it
(``EESSI_MACHINE_TYPE``, EESSI's real cpuinfo dump of its CPU): the compatibility layers of
the testbed (``testbed/eessicompat.py``) refuse a program of another family there as the
kernel does, and record every start in the run log (``EESSI_LIKE_COMPAT_RUNLOG``).

Each job runs ``task.sh`` in its batch step, then in one ``srun -n2`` step. In prolog mode the
guard is the TaskProlog; in shell mode the batch script runs ``eval "$(guard --shell)"`` first
and no TaskProlog is set. Every task must see what a fresh start of EESSI on the node sees,
the reload is decided once (one message), and the run log holds no start of a program of
the login node's family. One Slurm start serves every case (the session's cluster).
"""

from __future__ import annotations

import shlex
import shutil

import pytest

import checkout
import eessicompat
import eessilike
from tests.integration.harness.families import (
    COMPARED,
    GRACE,
    ICELAKE,
    NEOVERSE_V1,
    P550,
    ZEN3,
    build,
    lmod_init_start,
    shell,
)
from tests.integration.harness.guard import GuardSite
from tests.integration.harness.guard_slurm import SlurmGuard, readable_by_all
from tests.integration.harness.slurm import SLURM

pytestmark = SLURM

CASES = [(ZEN3, NEOVERSE_V1), (ZEN3, GRACE), (NEOVERSE_V1, ICELAKE), (ZEN3, P550)]
TASKS = [("batch", 0), ("0", 0), ("0", 1)]
# The names task.sh prints that a fresh start gives too (the marker and the module list aside).
PRINTED = ("EESSI_SOFTWARE_SUBDIR", "MODULEPATH", "PATH", "usera")


@pytest.fixture(scope="module")
def families(slurm_guard: SlurmGuard) -> GuardSite:
    """The cross-family prefix in the cluster's world-readable directory, and the guard's copy."""
    root = slurm_guard.root / "eessi-families"
    prefix = build(root)
    readable_by_all(root)
    return GuardSite(prefix=prefix, lmod=slurm_guard.lmod, package_root=slurm_guard.package_root)


def batch_script(families: GuardSite, work, mode: str):
    """``task.sh`` in the batch step and in one two-task step; in shell mode the guard's eval first."""
    task = f"{shlex.quote(str(work / 'task.sh'))} {shlex.quote(str(work))}"
    srun = f"{shlex.quote(shutil.which('srun') or 'srun')} --quiet --overcommit -n2 --label {task}"
    lines = ["#!/bin/bash"]
    if mode == "shell":
        guard = " ".join(
            map(shlex.quote, checkout.guard_argv(families.python, families.package_root, "--shell"))
        )
        lines.append(f'eval "$({guard})"')
    lines += [task, "echo '== step 0'", srun]
    script = work / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("mode", ["prolog", "shell"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(part.rsplit("/", 1)[-1] for part in case))
def test_a_job_from_another_family_s_login_gets_the_node_s_whole_eessi_through_slurm(
    slurm_guard, families, case, mode
):
    login_target, node_target = case
    login = shell(families, login_target, lmod_init_start(families))
    fresh = shell(families, node_target, lmod_init_start(families))
    work = slurm_guard.workdir(f"families-{mode}")
    runlog = work / "compat.log"
    env = dict(
        login,
        **eessilike.real_node_env(node_target),
        TMPDIR=str(work / "tmp"),
        **{eessicompat.RUNLOG_VARIABLE: str(runlog)},
    )
    script = batch_script(families, work, mode)

    if mode == "prolog":
        with slurm_guard.as_task_prolog():
            job = slurm_guard.sbatch(work, script, env)
    else:
        job = slurm_guard.sbatch(work, script, env)

    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output.text
    assert sorted(job.output.tasks) == sorted(TASKS), job.output.text
    for task, view in job.output.tasks.items():
        assert view["EESSI_SOFTWARE_SUBDIR"] == node_target, task
        assert view["usera"] == node_target, task
        assert view["MODULEPATH"] == fresh["MODULEPATH"], task
        assert view["PATH"] == fresh["PATH"], task
        assert view["EESSI_ARCH_GUARD_RELOADED"] == f"{login_target}->{node_target}", task
    for name, dumped in job.env_dumps().items():
        for compared in COMPARED:
            assert dumped.get(compared) == fresh.get(compared), (name, compared)
    # Decided once: the batch step reloads, the step inherits a matching environment.
    message = f"eessi-arch-guard: reloaded EESSI for {node_target} (job environment was {login_target})"
    if mode == "prolog":
        assert job.output.messages == [("batch", None, message)]
    assert eessicompat.foreign_starts(runlog) == []
    node_family = node_target.split("/")[0]
    assert (node_family, node_family, "lua") in eessicompat.runlog(runlog)
