"""The cross-family cases' prefix, logins and comparisons, for the guard's tests with and
without Slurm (``test_arch_guard_families.py``, ``test_arch_guard_slurm_families.py``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import eessilike
from tests.integration.harness.guard import GuardSite

ZEN3 = "x86_64/amd/zen3"
ICELAKE = "x86_64/intel/icelake"
NEOVERSE_V1 = "aarch64/neoverse_v1"
GRACE = "aarch64/nvidia/grace"
P550 = "riscv64/sifive/p550"
TARGETS = (ZEN3, ICELAKE, NEOVERSE_V1, GRACE, P550)
# A version of the prefix with software for riscv64 and no compatibility layer for it.
NO_RISCV_LAYER = "2025.06"
USER_MODULE = "UserA/1.0"
# What a fresh start sets and a repaired task must have alike: EESSI's, the compatibility
# layer's, and Lmod's own (its program, its settings files, its state).
COMPARED = (
    "EESSI_SOFTWARE_SUBDIR",
    "EESSI_SOFTWARE_PATH",
    "EESSI_MODULEPATH",
    "EESSI_SITE_SOFTWARE_PATH",
    "EESSI_SITE_MODULEPATH",
    "EESSI_CPU_FAMILY",
    "EPREFIX",
    "EESSI_EPREFIX",
    "MODULEPATH",
    "PATH",
    "LOADEDMODULES",
    "_LMFILES_",
    "LMOD_CMD",
    "LMOD_DIR",
    "LMOD_PKG",
    "LMOD_RC",
    "LMOD_PACKAGE_PATH",
)


def build(root: Path) -> eessilike.EessiPrefix:
    """The prefix of every target here, and a second version without the riscv64 layer."""
    prefix = eessilike.build_prefix(root, targets=TARGETS, accel={})
    eessilike.build_prefix(
        root, version=NO_RISCV_LAYER, targets=(ZEN3, P550), accel={}, families=("x86_64", "aarch64")
    )
    return prefix


def module_start(site: GuardSite, version: str | None = None) -> str:
    """EESSI's module loaded by the site's Lmod, then the user's module."""
    module = f"EESSI/{version}" if version else site.prefix.module
    return eessilike.load_script(site.prefix, (module, USER_MODULE))


def lmod_init_start(site: GuardSite, version: str | None = None) -> str:
    """EESSI's ``init/lmod/bash`` (its Lmod: the layer's of the node's family), then the module."""
    pin = f"export EESSI_VERSION={shlex.quote(version)} && " if version else ""
    return f"{pin}. {shlex.quote(str(site.prefix.init_lmod_bash))} && module load {USER_MODULE}"


STARTS = {"module": module_start, "init-lmod-bash": lmod_init_start}


def shell(site: GuardSite, target: str, script: str, **settings: str) -> dict:
    """What a shell on a node of ``target`` exports after ``script``, from a clean login
    with ``settings``, without the node's variables."""
    env = eessilike.login_base(site.prefix, site.lmod)
    env.update(eessilike.real_node_env(target), **settings)
    ran = eessilike.run_shell(site.lmod, env, script)
    assert ran.returncode == 0, ran.stderr
    return {name: value for name, value in ran.env.items() if name not in eessilike.NODE_VARIABLES}


def job(login: dict, target: str, **extra: str) -> dict:
    """The login's environment as a task on a node of ``target`` gets it."""
    return dict(login, **eessilike.real_node_env(target), **extra)


def assert_like(task: dict, fresh: dict, names=COMPARED) -> None:
    for name in names:
        assert task.get(name) == fresh.get(name), name


def logged(path: Path) -> list:
    return path.read_text().splitlines() if path.exists() else []


def repaired(site: GuardSite, env: dict, mode: str) -> dict:
    """The task's environment after the guard: as the TaskProlog, or by ``eval "$(guard
    --shell)"`` in a job script that, as a real one, starts with the ``module`` function and
    the ``LMOD_CMD`` the job inherited (not this machine's Lmod sourced first)."""
    if mode == "prolog":
        return site.repaired(env, mode)
    guard = " ".join(shlex.quote(part) for part in site.guard_argv("--shell"))
    script = eessilike.run_shell(site.lmod, env, f'eval "$({guard})"', lmod_init=False)
    assert script.returncode == 0, script.stderr
    return script.env
