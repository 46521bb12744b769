"""The launcher's layer: the site's settings laid over a task's environment, then the guard.

The site's timeout and verbosity are defaults a job's own values win over; a partition the
site switched off stays off whatever the job sets. Every task of every step runs this, so
the launcher must import nothing beyond what the cached-decision path imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache, emit, launcher
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard.decision import RELOAD, Decision

DISABLED = "disabled by EESSI_ARCH_GUARD=0"
RELOADED = Decision(
    RELOAD,
    "reloaded x86_64/intel/haswell->x86_64/amd/zen3",
    [
        ("EESSI_SOFTWARE_SUBDIR", "x86_64/amd/zen3"),
        ("EESSI_ARCH_GUARD_RELOADED", "x86_64/intel/haswell->x86_64/amd/zen3"),
    ],
    "eessi-arch-guard: reloaded EESSI for x86_64/amd/zen3 (job environment was x86_64/intel/haswell)",
)
# What the cache-hit path must not import (tests/integration/arch_guard/test_arch_guard_step.py).
SLOW_IMPORTS = (
    "os",
    "stat",
    "re",
    "json",
    "argparse",
    "subprocess",
    "signal",
    "hashlib",
    "shutil",
    "tempfile",
)
# The launcher as the role's template writes it, from a package directory given first.
LAUNCHER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from hpcstack_ops.arch_guard.launcher import run; "
    "raise SystemExit(run(timeout=7.0, verbose=True, disabled_partitions=['debug']))"
)
GUARD = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from hpcstack_ops.arch_guard.cli import main; raise SystemExit(main())"
)


def _loaded(**extra):
    """A task whose EESSI is loaded for a target whose archdetect is not there."""
    env = {
        "EESSI_SOFTWARE_SUBDIR": "x86_64/amd/zen3",
        "EESSI_PREFIX": "/nonexistent/eessi",
        "PATH": os.defpath,
    }
    env.update(extra)
    return env


# ------------------------------------------------------------------ site_environment


def test_the_site_s_timeout_and_verbosity_reach_a_job_that_sets_neither():
    laid = launcher.site_environment({"PATH": "/usr/bin"}, timeout=7.0, verbose=True)

    assert laid == {"PATH": "/usr/bin", "EESSI_ARCH_GUARD_TIMEOUT": "7.0", "EESSI_ARCH_GUARD_VERBOSE": "1"}


def test_a_job_s_own_timeout_and_verbosity_win_over_the_site_s():
    job = {"EESSI_ARCH_GUARD_TIMEOUT": "1", "EESSI_ARCH_GUARD_VERBOSE": "0"}

    assert launcher.site_environment(job, timeout=7.0, verbose=True) == job


@pytest.mark.parametrize("unusable", ["", "abc", "0", "-5", "90000", "nan"])
def test_a_job_s_timeout_the_guard_cannot_use_gives_the_site_s(unusable):
    laid = launcher.site_environment({"EESSI_ARCH_GUARD_TIMEOUT": unusable}, timeout=7.0)

    assert laid == {"EESSI_ARCH_GUARD_TIMEOUT": "7.0"}


def test_without_site_settings_the_job_s_environment_is_kept_as_it_is():
    job = _loaded(EESSI_ARCH_GUARD_VERBOSE="1", SLURM_JOB_PARTITION="debug")

    assert launcher.site_environment(job) == job
    assert launcher.site_environment(job, timeout=None, verbose=False, disabled_partitions=()) == job


def test_a_site_that_is_not_verbose_does_not_silence_a_verbose_job():
    laid = launcher.site_environment({"EESSI_ARCH_GUARD_VERBOSE": "1"}, verbose=False)

    assert laid["EESSI_ARCH_GUARD_VERBOSE"] == "1"


@pytest.mark.parametrize("job_switch", [None, "1", "on", "0"])
def test_in_a_disabled_partition_the_guard_is_off_whatever_the_job_sets(job_switch):
    job = _loaded(SLURM_JOB_PARTITION="debug")
    if job_switch is not None:
        job["EESSI_ARCH_GUARD"] = job_switch

    laid = launcher.site_environment(job, disabled_partitions=("gpu", "debug"))

    assert laid["EESSI_ARCH_GUARD"] == "0"


@pytest.mark.parametrize("partition", ["batch", "debug2", "DEBUG", None])
def test_other_partitions_keep_the_job_s_own_switch(partition):
    job = _loaded(EESSI_ARCH_GUARD="off")
    if partition is not None:
        job["SLURM_JOB_PARTITION"] = partition

    assert launcher.site_environment(job, disabled_partitions=("debug",)) == job


@pytest.mark.parametrize("partition", ["batch", None])
def test_other_partitions_get_no_switch_from_the_site(partition):
    job = _loaded() if partition is None else _loaded(SLURM_JOB_PARTITION=partition)

    assert "EESSI_ARCH_GUARD" not in launcher.site_environment(job, disabled_partitions=("debug",))


def test_the_task_s_environment_is_not_changed():
    job = _loaded(SLURM_JOB_PARTITION="debug")
    before = dict(job)

    launcher.site_environment(job, timeout=7.0, verbose=True, disabled_partitions=("debug",))

    assert job == before


# ------------------------------------------------------------------ run


@pytest.fixture
def task_env(monkeypatch):
    """Make the process a task: its environment, as ``lean_os.environ`` reads it, and its argv."""

    def set_to(env):
        monkeypatch.setattr(launcher.lean_os, "environ", lambda: dict(env))
        # As Slurm runs the launcher: no arguments (the role's launcher passes no argv).
        monkeypatch.setattr(sys, "argv", ["eessi-arch-guard"])

    return set_to


def test_run_gives_the_guard_the_process_s_environment_with_the_site_s_settings(task_env, monkeypatch):
    task_env(_loaded(SLURM_JOB_PARTITION="debug", EESSI_ARCH_GUARD_TIMEOUT="2"))
    calls = []
    monkeypatch.setattr(
        launcher.cli, "main", lambda argv=None, environ=None: calls.append((argv, environ)) or 0
    )

    status = launcher.run(timeout=7.0, verbose=True, disabled_partitions=["debug"], argv=["--json"])

    assert status == 0
    assert calls == [
        (
            ["--json"],
            _loaded(
                SLURM_JOB_PARTITION="debug",
                EESSI_ARCH_GUARD_TIMEOUT="2",
                EESSI_ARCH_GUARD_VERBOSE="1",
                EESSI_ARCH_GUARD="0",
            ),
        )
    ]


def test_run_in_a_disabled_partition_skips_and_says_why_when_verbose(task_env, capsysbinary):
    task_env(_loaded(SLURM_JOB_PARTITION="debug"))

    status = launcher.run(timeout=7.0, verbose=True, disabled_partitions=["debug"], argv=["--json"])

    out, err = capsysbinary.readouterr()
    assert status == 0
    assert json.loads(out) == {
        "action": "skip",
        "detail": DISABLED,
        "changes": [],
        "message": "",
        "mode": "prolog",
    }
    assert err == f"eessi-arch-guard: {DISABLED}\n".encode()


def test_run_with_a_job_that_is_not_verbose_writes_no_detail(task_env, capsysbinary):
    task_env(_loaded(SLURM_JOB_PARTITION="debug", EESSI_ARCH_GUARD_VERBOSE="0"))

    status = launcher.run(verbose=True, disabled_partitions=["debug"])

    assert (status, capsysbinary.readouterr()) == (0, (b"", b""))


def test_run_outside_the_disabled_partitions_decides_and_exits_0(task_env, capsysbinary):
    task_env(_loaded(SLURM_JOB_PARTITION="batch", SLURM_LOCALID="0"))

    status = launcher.run(timeout=7.0, disabled_partitions=["debug"])

    out, err = capsysbinary.readouterr()
    assert (status, err) == (0, b"")
    assert out.startswith(b"export EESSI_ARCH_GUARD_FAILED=x86_64/amd/zen3->archdetect-failed\n")
    assert b"\nprint eessi-arch-guard: could not detect this node's CPU" in out


# ------------------------------------------------------------------ the cached-decision path


def _step_env(tmp_path, **extra):
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "1",
        "SLURMD_NODENAME": "node001",
        "TMPDIR": str(tmp_path),
        "EESSI_SOFTWARE_SUBDIR": "x86_64/intel/haswell",
        "MODULEPATH": "/cvmfs/modules/all",
        "PATH": "/usr/bin:/bin",
    }
    env.update(extra)
    return env


def _imports(code, package_dir, env):
    """``python -IS -X importtime -c code``: its exit status, stdout and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-IS", "-X", "importtime", "-c", code, str(package_dir)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    return done.returncode, done.stdout, imported


def test_the_launcher_imports_nothing_beyond_the_cached_decision_path(package_dir, tmp_path):
    env = _step_env(tmp_path)
    cache.StepCache(cache.path_for(env, emit.PROLOG)).publish(RELOADED)

    status, out, imported = _imports(LAUNCHER, package_dir, env)
    guard_status, guard_out, guard_imported = _imports(GUARD, package_dir, env)

    # Task 1 of a step whose decision is cached: the directives, not the message.
    assert (status, out) == (0, emit.prolog_output(RELOADED, "1"))
    assert (guard_status, guard_out) == (0, out)
    assert imported - guard_imported == {"hpcstack_ops.arch_guard.launcher"}
    assert "hpcstack_ops.arch_guard.cache" in imported
    assert "hpcstack_ops.arch_guard.decide" not in imported
    assert not imported & set(SLOW_IMPORTS)


def test_a_disabled_partition_wins_over_a_cached_decision(package_dir, tmp_path):
    env = _step_env(tmp_path, SLURM_JOB_PARTITION="debug", EESSI_ARCH_GUARD_VERBOSE="0")
    cache.StepCache(cache.path_for(env, emit.PROLOG)).publish(RELOADED)

    status, out, imported = _imports(LAUNCHER, package_dir, env)

    assert (status, out) == (0, b"")
    assert "hpcstack_ops.arch_guard.cache" not in imported
