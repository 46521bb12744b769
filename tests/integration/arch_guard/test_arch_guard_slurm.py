"""eessi-arch-guard as the TaskProlog of a real Slurm cluster, on this machine's real CPU.

A user logged in on a node of another CPU target loads EESSI and two user modules and
submits from there; the job runs here, where archdetect reads the real ``/proc/cpuinfo``.
Slurm runs the guard for every task of every step (the batch step included): every task
must see what a login on this node sees, the guard's message must appear once per step
that it repaired (from local rank 0), and a job it need not touch must run exactly as it
does without the guard.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.harness.guard_slurm import SlurmGuard, job_output, write_env_file
from tests.integration.harness.slurm import SLURM

pytestmark = SLURM

BATCH_TASKS = [("0", 0), ("0", 1), ("0", 2), ("0", 3), ("1", 0), ("1", 1), ("1", 2), ("1", 3), ("batch", 0)]


@pytest.fixture(scope="module")
def node_view(slurm_guard: SlurmGuard) -> dict:
    """What ``task.sh`` prints on a fresh login on this node, marker aside."""
    here = slurm_guard.login_env(None)
    assert here["EESSI_SOFTWARE_SUBDIR"] == slurm_guard.node_target
    return {
        "EESSI_SOFTWARE_SUBDIR": slurm_guard.node_target,
        "MODULEPATH": here["MODULEPATH"],
        "PATH": here["PATH"],
        "modules": slurm_guard.module_list(here),
        "usera": slurm_guard.node_target,
    }


@pytest.fixture(scope="module")
def other_login(slurm_guard: SlurmGuard) -> dict:
    """The job environment: a login on the other target's node, its node variables gone."""
    env = slurm_guard.login_env(slurm_guard.other_target)
    assert env["EESSI_SOFTWARE_SUBDIR"] == slurm_guard.other_target
    return env


def reloaded(slurm_guard: SlurmGuard) -> str:
    return f"{slurm_guard.other_target}->{slurm_guard.node_target}"


def message(slurm_guard: SlurmGuard) -> str:
    return (
        f"eessi-arch-guard: reloaded EESSI for {slurm_guard.node_target} "
        f"(job environment was {slurm_guard.other_target})"
    )


def assert_every_task_sees_this_node(tasks: dict, expected_tasks: list, node_view: dict, marker: str) -> None:
    assert sorted(tasks) == sorted(expected_tasks)
    for task, view in tasks.items():
        assert view == dict(node_view, EESSI_ARCH_GUARD_RELOADED=marker), task


def assert_completed(job) -> None:
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output.text


def broken_python(root) -> dict:
    """PYTHONHOME and PYTHONPATH whose stdlib and packages raise as soon as they are imported."""
    home, path = root / "broken-python", root / "broken-pythonpath"
    stdlib = home / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for module in (
        stdlib / "os.py",
        stdlib / "encodings" / "__init__.py",
        path / "site.py",
        path / "encodings" / "__init__.py",
        path / "hpcstack_ops" / "__init__.py",
    ):
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(f'raise SystemExit("broken {module.name} of the job environment")\n')
    return {"PYTHONHOME": str(home), "PYTHONPATH": str(path)}


def without_slurm(env: dict) -> dict:
    """A task's environment without what Slurm sets per job and step (ids, ports, pids)."""
    return {name: value for name, value in env.items() if not name.startswith("SLURM_")}


@pytest.mark.host_cpu
@pytest.mark.parametrize("python_env", ["plain", "broken-python"])
def test_batch_job_is_repaired_once_and_every_task_of_every_step_sees_this_node(
    slurm_guard, node_view, other_login, python_env
):
    work = slurm_guard.workdir("batch")
    env = dict(other_login, TMPDIR=str(work / "tmp"))
    if python_env == "broken-python":
        env.update(broken_python(work))
        broken = subprocess.run([slurm_guard.python, "-c", "pass"], env=env, capture_output=True, check=False)
        assert broken.returncode != 0, "the job environment must break a Python that reads it"
    script = slurm_guard.batch_script(work)

    with slurm_guard.as_task_prolog():
        job = slurm_guard.sbatch(work, script, env)

    assert_completed(job)
    # The batch step is repaired; its srun steps inherit the repaired environment, find it
    # matching this node, and say nothing.
    assert_every_task_sees_this_node(job.output.tasks, BATCH_TASKS, node_view, reloaded(slurm_guard))
    assert job.output.messages == [("batch", None, message(slurm_guard))]


def test_each_step_that_starts_mismatched_is_repaired_with_one_message_from_local_rank_0(
    slurm_guard, node_view, other_login
):
    work = slurm_guard.workdir("relogin")
    relogin = write_env_file(work / "login-env.sh", other_login)
    script = slurm_guard.batch_script(work, relogin=relogin)

    with slurm_guard.as_task_prolog():
        job = slurm_guard.sbatch(work, script, dict(other_login, TMPDIR=str(work / "tmp")))

    assert_completed(job)
    assert_every_task_sees_this_node(job.output.tasks, BATCH_TASKS, node_view, reloaded(slurm_guard))
    text = message(slurm_guard)
    assert job.output.messages == [("batch", None, text), ("0", 0, text), ("1", 0, text)]


# Who submits, and how many tasks the step has.
SRUN_CASES = {"root": (False, 4), "unprivileged": (True, 4), "root-64-tasks": (False, 64)}


@pytest.mark.parametrize("case", SRUN_CASES)
def test_plain_srun_repairs_all_its_tasks_with_one_decision_and_one_message(
    slurm_guard, node_view, other_login, unprivileged_user, case
):
    unprivileged, tasks = SRUN_CASES[case]
    owner = (unprivileged_user.uid, unprivileged_user.gid) if unprivileged else None
    work = slurm_guard.workdir("srun", owner)
    runlog = work / "archdetect-runs"
    env = dict(
        other_login,
        SLURM_CONF=str(slurm_guard.cluster.conf),
        TMPDIR=str(work / "tmp"),
        EESSI_ARCHDETECT_STANDIN_RUNLOG=str(runlog),
    )
    if owner is not None:
        env.update(HOME="/", USER=unprivileged_user.name, LOGNAME=unprivileged_user.name)
    argv = ["srun", "--overcommit", f"-n{tasks}", "--label", str(work / "task.sh"), str(work)]

    with slurm_guard.as_task_prolog():
        done = slurm_guard.srun(argv, env, work, unprivileged_user if unprivileged else None)

    assert done.returncode == 0, done.stdout + done.stderr
    out = job_output(done.stdout, first="0")
    ranks = [("0", rank) for rank in range(tasks)]
    assert_every_task_sees_this_node(out.tasks, ranks, node_view, reloaded(slurm_guard))
    assert out.messages == [("0", 0, message(slurm_guard))]
    # One decision for all tasks: the guard's two archdetect runs (cpupath, accelpath) and
    # the two of the EESSI module the restore helper loads again; tasks deciding each on
    # their own would make four per task.
    assert len(runlog.read_text().splitlines()) == 4, runlog.read_text()
    cache = [path for path in (work / "tmp").iterdir() if not path.name.endswith(".lock")]
    assert len(cache) == 1, cache
    info = cache[0].lstat()
    expected_uid = unprivileged_user.uid if owner else 0
    assert (info.st_uid, info.st_mode & 0o777) == (expected_uid, 0o600)


def run_with_and_without_guard(slurm_guard, env: dict, *args: str):
    """The same batch job twice, from the same directory and TMPDIR: no-op prolog, then guard."""
    shared = slurm_guard.workdir("shared")
    env = dict(env, TMPDIR=str(shared / "tmp"))
    jobs = []
    for with_guard in (False, True):
        work = slurm_guard.workdir("guarded" if with_guard else "unguarded")
        script = slurm_guard.batch_script(work)
        if with_guard:
            with slurm_guard.as_task_prolog():
                jobs.append(slurm_guard.sbatch(work, script, env, *args, cwd=shared))
        else:
            jobs.append(slurm_guard.sbatch(work, script, env, *args, cwd=shared))
    return jobs


def assert_unchanged(without, with_guard) -> None:
    assert_completed(without)
    assert_completed(with_guard)
    assert "eessi-arch-guard" not in with_guard.output.text
    assert with_guard.output.messages == []
    assert sorted(with_guard.output.text.splitlines()) == sorted(without.output.text.splitlines())
    plain, guarded = without.env_dumps(), with_guard.env_dumps()
    assert sorted(guarded) == sorted(f"{step}.{rank}" for step, rank in BATCH_TASKS)
    assert sorted(plain) == sorted(guarded)
    for task in guarded:
        assert without_slurm(guarded[task]) == without_slurm(plain[task]), task


def test_job_with_export_none_runs_as_without_the_guard_and_the_guard_says_nothing(slurm_guard, other_login):
    without, with_guard = run_with_and_without_guard(slurm_guard, other_login, "--export=NONE")

    assert_unchanged(without, with_guard)
    assert all(view["EESSI_SOFTWARE_SUBDIR"] == "" for view in with_guard.output.tasks.values())


def test_job_whose_environment_matches_this_node_runs_as_without_the_guard(slurm_guard, node_view):
    here = slurm_guard.login_env(None)

    without, with_guard = run_with_and_without_guard(slurm_guard, here)

    assert_unchanged(without, with_guard)
    assert_every_task_sees_this_node(with_guard.output.tasks, BATCH_TASKS, node_view, "")


def test_a_tmpdir_the_job_user_cannot_write_does_not_stop_the_repair(
    slurm_guard, node_view, other_login, unprivileged_user
):
    """A TMPDIR carried from the login node that exists here but is not the user's to write
    (slurmstepd itself then falls back to /tmp for local task 0): the guard must still find a
    place for the restore helper's work directory, as it does when TMPDIR does not exist.
    """
    work = slurm_guard.workdir("foreign-tmpdir", (unprivileged_user.uid, unprivileged_user.gid))
    foreign = slurm_guard.workdir("root-owned")  # root's, mode 0755
    env = dict(
        other_login,
        SLURM_CONF=str(slurm_guard.cluster.conf),
        TMPDIR=str(foreign),
        HOME="/",
        USER=unprivileged_user.name,
        LOGNAME=unprivileged_user.name,
    )
    argv = ["srun", "--overcommit", "-n4", "--label", str(work / "task.sh"), str(work)]

    with slurm_guard.as_task_prolog():
        done = slurm_guard.srun(argv, env, work, unprivileged_user)

    assert done.returncode == 0, done.stdout + done.stderr
    out = job_output(done.stdout, first="0")
    assert out.messages == [("0", 0, message(slurm_guard))]
    assert_every_task_sees_this_node(
        out.tasks, [("0", rank) for rank in range(4)], node_view, reloaded(slurm_guard)
    )
