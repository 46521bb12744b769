"""The guard across CPU families, with the real guard, bash and Lmod, without Slurm.

A job from a login node of one CPU family runs on a node of another. The node's family is
what archdetect takes it to be (``EESSI_MACHINE_TYPE``): one machine runs one family, so the
testbed's compatibility layers simulate the others (``testbed/eessicompat.py``: a layer's
program started on a node of another family fails with ENOEXEC, as the kernel fails it, and
``EESSI_LIKE_COMPAT_RUNLOG`` records every start). The nodes' CPUs are EESSI's own cpuinfo
dumps (``eessilike.real_node_env``).

Each case compares the task, after the guard as the TaskProlog or by ``eval "$(guard
--shell)"``, with a fresh start of EESSI the same way on the node (EESSI's module, or
``init/lmod/bash``, whose Lmod is the layer's), and reads from the run log that no program of
the login node's family was started. The failures: a module that the node's family does not
have, and no compatibility layer for the node's family. ``test_arch_guard_slurm_families.py``
runs the acceptance through real Slurm.
"""

from __future__ import annotations

import shlex

import pytest

import eessicompat
import eessilike
from tests.integration.harness.families import (
    GRACE,
    ICELAKE,
    NEOVERSE_V1,
    NO_RISCV_LAYER,
    P550,
    STARTS,
    USER_MODULE,
    ZEN3,
    assert_like,
    build,
    job,
    lmod_init_start,
    logged,
    module_start,
    repaired,
    shell,
)
from tests.integration.harness.guard import GuardSite


@pytest.fixture(scope="module")
def site(tmp_path_factory, lmod, package_root) -> GuardSite:
    return GuardSite(
        prefix=build(tmp_path_factory.mktemp("eessi-families")), lmod=lmod, package_root=package_root
    )


# --------------------------------------------------------------------------- the reload


@pytest.mark.parametrize(
    "case",
    [
        ("init-lmod-bash", ZEN3, GRACE, "prolog"),
        ("init-lmod-bash", NEOVERSE_V1, ICELAKE, "shell"),
        ("module", ZEN3, NEOVERSE_V1, "shell"),
        ("module", ZEN3, P550, "prolog"),
    ],
    ids=lambda case: "-".join(part.rsplit("/", 1)[-1] for part in case),
)
def test_a_job_of_another_family_ends_as_a_fresh_start_on_the_node_and_runs_no_program_of_its_own(
    site, tmp_path, case
):
    start, login_target, node_target, mode = case
    login = shell(site, login_target, STARTS[start](site))
    runlog, readlog = tmp_path / "compat.log", tmp_path / "lmod-read.log"
    task_env = job(
        login,
        node_target,
        **{eessicompat.RUNLOG_VARIABLE: str(runlog), eessilike.LMOD_READLOG_VARIABLE: str(readlog)},
    )

    task = repaired(site, task_env, mode)

    fresh = shell(site, node_target, STARTS[start](site))
    node_family = node_target.split("/")[0]
    assert fresh["EESSI_CPU_FAMILY"] == node_family
    assert_like(task, fresh)
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{login_target}->{node_target}"
    assert eessicompat.foreign_starts(runlog) == []
    if start == "init-lmod-bash":
        # The job's Lmod was its layer's: the reload ran the node family's (a site's own Lmod,
        # with the module, is no layer's program).
        assert (node_family, node_family, "lua") in eessicompat.runlog(runlog)
    # The first Lmod call, which unloads the user's module, started with neither the login
    # target's lmodrc.lua files nor its SitePackage; no Lmod of the guard read them.
    login_lmod = str(site.prefix.software_subdir_path(login_target) / ".lmod")
    (unload,) = [line for line in logged(readlog) if line.startswith(f"unload {USER_MODULE} ")]
    assert "/.lmod" not in unload, unload
    assert not [line for line in logged(readlog) if login_lmod in line]


def test_after_the_reload_the_job_s_own_lmod_is_the_node_family_s_and_runs(site):
    login = shell(site, ZEN3, lmod_init_start(site))
    task = site.repaired(job(login, GRACE), "prolog")

    ran = eessilike.run_shell(
        site.lmod, dict(task, **eessilike.real_node_env(GRACE)), "module load UserB/2.0"
    )

    assert ran.returncode == 0, ran.stderr
    assert task["LMOD_CMD"] == str(site.prefix.layer("aarch64").lmod_cmd)
    assert ran.env["LOADEDMODULES"] == f"{site.prefix.module}:{USER_MODULE}:UserB/2.0"


def test_the_login_family_s_lmod_cannot_run_on_the_node_as_the_kernel_refuses_it(site, tmp_path):
    # What the guard replaces: the job's LMOD_CMD, started on the node, fails as a program of
    # another machine fails (the simulation the comparisons above rely on).
    x86_lmod = site.prefix.layer("x86_64").lmod_cmd
    runlog = tmp_path / "compat.log"
    env = dict(
        eessilike.real_node_env(GRACE), PATH="/usr/bin:/bin", **{eessicompat.RUNLOG_VARIABLE: str(runlog)}
    )

    ran = eessilike.run_shell(site.lmod, env, f"{shlex.quote(str(x86_lmod))} bash list")

    assert ran.returncode == 126
    assert "Exec format error" in ran.stderr
    assert eessicompat.foreign_starts(runlog) == [("aarch64", "x86_64", "lua")]


# --------------------------------------------------------------------------- the job's choices


def test_the_job_s_cpu_family_override_is_respected_and_named_when_verbose(site):
    override = {"EESSI_CPU_FAMILY_OVERRIDE": "x86_64"}
    login = shell(site, ZEN3, module_start(site), **override)
    task_env = job(login, GRACE, EESSI_ARCH_GUARD_VERBOSE="1")

    run, task = site.as_prolog(task_env)

    fresh = shell(site, GRACE, module_start(site), **override)
    assert fresh["EPREFIX"] == str(site.prefix.layer("x86_64").eprefix)
    assert_like(task, fresh)
    assert task["EESSI_CPU_FAMILY_OVERRIDE"] == "x86_64"
    assert b"EESSI_CPU_FAMILY_OVERRIDE=x86_64 respected as the job's own choice" in run.stderr


def test_eessi_s_2026_settings_in_a_job_are_kept_the_site_tree_follows_the_node(site, tmp_path):
    site_root = tmp_path / "site-software"
    settings = {
        "EESSI_SITE_SOFTWARE_PREFIX": str(site_root),
        "EESSI_ACCEL_SOFTWARE_SUBDIR_OVERRIDE": ZEN3,
        "EESSI_VERSION_OVERRIDE": site.prefix.version,
    }
    login = shell(site, ZEN3, module_start(site), **settings)
    assert login["EESSI_SITE_SOFTWARE_PATH"].startswith(str(site_root))
    assert f"{login['EESSI_SITE_SOFTWARE_PATH']}/.lmod/lmodrc.lua" in login["LMOD_RC"].split(":")

    run, task = site.as_prolog(job(login, GRACE, EESSI_ARCH_GUARD_VERBOSE="1"))

    fresh = shell(site, GRACE, module_start(site), **settings)
    assert_like(task, fresh)
    assert fresh["EESSI_SITE_SOFTWARE_PATH"].endswith(GRACE)
    for name, value in settings.items():
        assert task[name] == value, name
    said = run.stderr.decode()
    assert (
        f"EESSI_ACCEL_SOFTWARE_SUBDIR_OVERRIDE={ZEN3}, EESSI_VERSION_OVERRIDE={site.prefix.version}" in said
    )


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("mode", ["prolog", "shell"])
def test_a_module_the_node_s_family_lacks_fails_as_one_another_target_lacks(site, mode):
    site.prefix.write_module(ZEN3, "OnlyOnX86/1.0", 'setenv("ONLY", "x86_64")\n')
    login = shell(site, ZEN3, f"{module_start(site)} && module load OnlyOnX86/1.0")
    task_env = job(login, GRACE, EESSI_ARCH_GUARD_VERBOSE="1", SLURM_LOCALID="0")

    task, said = _guarded(site, task_env, mode)

    assert task == dict(task_env, EESSI_ARCH_GUARD_FAILED=f"{ZEN3}->{GRACE}")
    assert "module OnlyOnX86/1.0 cannot be loaded for aarch64/nvidia/grace" in said


@pytest.mark.parametrize("mode", ["prolog", "shell"])
def test_no_compatibility_layer_for_the_node_s_family_is_one_failure_and_the_job_keeps_its_environment(
    site, tmp_path, mode
):
    login = shell(site, ZEN3, lmod_init_start(site, NO_RISCV_LAYER))
    assert login["EESSI_VERSION"] == NO_RISCV_LAYER
    runlog = tmp_path / "compat.log"
    task_env = job(login, P550, SLURM_LOCALID="0", **{eessicompat.RUNLOG_VARIABLE: str(runlog)})

    task, said = _guarded(site, task_env, mode)

    assert task == dict(task_env, EESSI_ARCH_GUARD_FAILED=f"{ZEN3}->no-compat-layer")
    assert "EESSI has no compatibility layer for this node's CPU family (riscv64)" in said
    assert "run the job on nodes of a CPU family that EESSI supports" in said
    assert eessicompat.foreign_starts(runlog) == []


def _guarded(site: GuardSite, task_env: dict, mode: str) -> tuple:
    """The task's environment after the guard in ``mode``, and what the guard said (the
    print line, or stderr in shell mode); the guard exits 0 and exports one marker."""
    if mode == "prolog":
        run, task = site.as_prolog(task_env)
        assert run.returncode == 0
        prints = [line for line in run.stdout.decode().splitlines() if line.startswith("print ")]
        assert len(prints) == 1
        assert [line for line in run.stdout.decode().splitlines() if line.startswith("export ")] == [
            f"export EESSI_ARCH_GUARD_FAILED={task['EESSI_ARCH_GUARD_FAILED']}"
        ]
        return task, prints[0]
    run = site.run(task_env, "--shell")
    assert run.returncode == 0
    (line,) = run.stdout.decode().splitlines()
    name, _equals, value = line[len("export ") :].partition("=")
    return dict(task_env, **{name: shlex.split(value)[0]}), run.stderr.decode()


def test_a_node_family_s_lmod_whose_init_sets_another_lmod_is_restore_failed(lmod, package_root, tmp_path):
    prefix = eessilike.build_prefix(tmp_path / "eessi", targets=(ZEN3, GRACE), accel={})
    prefix.layer("aarch64").lmod_init.write_text("export LMOD_CMD=/elsewhere/lmod\n")
    site = GuardSite(prefix=prefix, lmod=lmod, package_root=package_root)
    task_env = job(shell(site, ZEN3, lmod_init_start(site)), GRACE, EESSI_ARCH_GUARD_VERBOSE="1")

    run, task = site.as_prolog(task_env)

    assert run.returncode == 0
    assert task == dict(task_env, EESSI_ARCH_GUARD_FAILED=f"{ZEN3}->restore-failed")
    assert b"eessi-arch-guard: the restore helper exited 92: " in run.stderr
