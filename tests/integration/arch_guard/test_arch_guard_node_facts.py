"""Facts EESSI keeps about the node it ran on are detected again on the node the task runs on.

EESSI's SitePackage detects the CUDA version of the node's driver once, when a GPU module is
loaded, and keeps it in ``EESSI_CUDA_DRIVER_VERSION``; while that is set it never detects
again, and unloading the GPU module does not unset it (``testbed/eessi_like/SitePackage.lua``
does the same with the fake ``nvidia-smi``, whose driver says
``EESSI_LIKE_CUDA_DRIVER_VERSION``). A job from a login node carries the login node's answer.
After the guard's reload the task must hold what a fresh ``module load`` of its modules on
this node gives, as the TaskProlog and in a job script: the node's driver version on a GPU
node, none on a node without GPU.
"""

from __future__ import annotations

import pytest

import eessilike
from tests.integration.harness.guard import GPU, GuardSite

FACT = "EESSI_CUDA_DRIVER_VERSION"
HASWELL_GPU = ("x86_64/intel/haswell", GPU)
ICELAKE_GPU = ("x86_64/intel/icelake", GPU)
ZEN3 = ("x86_64/amd/zen3", None)
GPU_MODULES = (*eessilike.USER_MODULES, eessilike.GPU_MODULE[0])
COMPARED = (FACT, "EESSI_SOFTWARE_SUBDIR", "EESSI_ACCEL_SUBDIR", "MODULEPATH", "PATH", "LOADEDMODULES")


@pytest.fixture(scope="module")
def site(tmp_path_factory, lmod, package_root) -> GuardSite:
    """Two GPU nodes of different CPUs (each with GpuKit) and one node without GPU."""
    prefix = eessilike.build_prefix(
        tmp_path_factory.mktemp("eessi-facts"),
        targets=(HASWELL_GPU[0], ICELAKE_GPU[0], ZEN3[0]),
        accel={HASWELL_GPU[0]: GPU, ICELAKE_GPU[0]: GPU},
    )
    return GuardSite(prefix=prefix, lmod=lmod, package_root=package_root)


def _node(site: GuardSite, node, driver: str | None = None) -> dict:
    node_vars = site.prefix.node_env(*node)
    if driver is not None:
        node_vars[eessilike.CUDA_DRIVER_VARIABLE] = driver
    return node_vars


def _login(site: GuardSite, node, driver: str, modules, script: str = "true") -> dict:
    """A login shell's environment on ``node`` (its driver says ``driver``) after loading
    ``modules`` and running ``script``, without the variables that simulate the node."""
    env = eessilike.login_environment(
        site.lmod, site.prefix, _node(site, node, driver), (site.prefix.module, *modules)
    )
    ran = eessilike.run_shell(site.lmod, env, script)
    assert ran.returncode == 0, ran.stderr
    return {name: value for name, value in ran.env.items() if name not in eessilike.NODE_VARIABLES}


def _fresh(site: GuardSite, node, driver: str | None, modules) -> dict:
    return eessilike.fresh_load(
        site.lmod, site.prefix, _node(site, node, driver), (site.prefix.module, *modules)
    )


def _assert_like(task: dict, fresh: dict) -> None:
    for name in COMPARED:
        assert task.get(name) == fresh.get(name), name


@pytest.mark.parametrize("mode", ["prolog", "shell"])
def test_a_gpu_job_from_a_login_node_with_an_old_driver_gets_this_node_s_driver_version(site, mode):
    login = _login(site, HASWELL_GPU, "11.4", GPU_MODULES)
    assert login[FACT] == "11.4"
    job = dict(login, **_node(site, ICELAKE_GPU, "12.2"))

    task = site.repaired(job, mode)

    fresh = _fresh(site, ICELAKE_GPU, "12.2", GPU_MODULES)
    assert fresh[FACT] == "12.2"
    _assert_like(task, fresh)
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{HASWELL_GPU[0]}->{ICELAKE_GPU[0]}"


@pytest.mark.parametrize("mode", ["prolog", "shell"])
def test_a_job_from_a_gpu_node_onto_a_node_without_gpu_loses_the_driver_version(site, mode):
    # GpuKit loaded and unloaded again on the GPU node: the driver version stays behind.
    login = _login(site, ICELAKE_GPU, "12.2", GPU_MODULES, "module unload GpuKit/1.0")
    assert login[FACT] == "12.2"
    assert "GpuKit/1.0" not in login["LOADEDMODULES"]
    job = dict(login, **_node(site, ZEN3))

    task = site.repaired(job, mode)

    fresh = _fresh(site, ZEN3, None, eessilike.USER_MODULES)
    assert FACT not in fresh
    _assert_like(task, fresh)
    assert FACT not in task


def test_without_the_guard_the_job_keeps_the_login_node_s_driver_version(site):
    # What the guard repairs: a reload by hand that keeps the facts re-detects nothing.
    login = _login(site, HASWELL_GPU, "11.4", GPU_MODULES)
    job = dict(login, **_node(site, ICELAKE_GPU, "12.2"))
    modules = " ".join(reversed(login["LOADEDMODULES"].split(":")))

    ran = eessilike.run_shell(
        site.lmod, job, f"module unload {modules} && module load {login['LOADEDMODULES'].replace(':', ' ')}"
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.env["EESSI_SOFTWARE_SUBDIR"] == ICELAKE_GPU[0]
    assert ran.env[FACT] == "11.4"


def test_a_job_whose_node_matches_keeps_its_facts_untouched(site):
    # No reload, no change: the guard does not touch a job that is right for this node.
    login = _login(site, ICELAKE_GPU, "12.2", GPU_MODULES)
    job = dict(login, **_node(site, ICELAKE_GPU, "12.2"))

    run = site.run(job)

    assert (run.returncode, run.stdout) == (0, b"")
