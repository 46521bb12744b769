"""The guard needs nothing but the module_utils folder: a copy run by Python 3.8 in isolated
mode writes byte for byte what the command installed with ``pip install .`` writes."""

from __future__ import annotations

import os
import subprocess

import pytest

import checkout
import pythons
from tests.integration.harness.guard import GPU, GuardSite

HASWELL = ("x86_64/intel/haswell", None)
ICELAKE_GPU = ("x86_64/intel/icelake", GPU)
# The module's tests run on one xdist worker (--dist loadgroup), which makes the installed and
# the copied guard once: spread over both workers, each would make them.
pytestmark = pytest.mark.xdist_group("arch_guard_install")
ZEN3 = ("x86_64/amd/zen3", None)


@pytest.fixture(scope="module")
def installed_guard(tmp_path_factory):
    """``eessi-arch-guard`` from ``pip install --target`` of a copy of this checkout."""
    root = tmp_path_factory.mktemp("installed")
    target = root / "site"
    done = checkout.pip_install(target, root)
    assert done.returncode == 0, done.stderr
    command = target / "bin" / "eessi-arch-guard"
    assert os.access(command, os.X_OK)
    return command, target


@pytest.fixture(scope="module")
def copied_guard(tmp_path_factory, eessi_prefix, lmod):
    """The module_utils folder alone, copied as ``hpcstack_ops``, run by Python 3.8 with -IS."""
    python38 = pythons.find("3.8")
    assert python38, "Python 3.8 is needed: the guard must run on nodes whose python3 is 3.8"
    root = tmp_path_factory.mktemp("copied")
    checkout.copy_package(root)
    return GuardSite(prefix=eessi_prefix, lmod=lmod, package_root=root, python=python38)


def run_installed(installed_guard, env: dict, *args: str) -> subprocess.CompletedProcess:
    command, target = installed_guard
    return subprocess.run(
        [str(command), *args],
        env=dict(env, PYTHONPATH=str(target)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )


CASES = {
    "reload": (HASWELL, ZEN3, {}),
    "reload-to-gpu": (ZEN3, ICELAKE_GPU, {}),
    "failure": (HASWELL, ("x86_64/generic", None), {}),
    "match-verbose": (ZEN3, ZEN3, {"EESSI_ARCH_GUARD_VERBOSE": "1"}),
    "disabled": (HASWELL, ZEN3, {"EESSI_ARCH_GUARD": "off", "EESSI_ARCH_GUARD_VERBOSE": "1"}),
}


@pytest.mark.parametrize(
    "args", [(), ("--shell",), ("--json",), ("--bogus",)], ids=["prolog", "shell", "json", "bad-argument"]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_copy_run_by_python38_writes_what_the_installed_command_writes(
    installed_guard, copied_guard, case, args
):
    login, compute, extra = CASES[case]
    job = copied_guard.job_env(login, compute, SLURM_LOCALID="0", PYTHONPATH="", **extra)

    copy = copied_guard.run(job, *args)
    installed = run_installed(installed_guard, job, *args)

    assert (copy.returncode, installed.returncode) == (0, 0)
    assert copy.stdout == installed.stdout
    assert copy.stderr == installed.stderr
    assert copy.stdout or copy.stderr


def test_copy_is_immune_to_the_jobs_python_variables(copied_guard, tmp_path):
    broken = tmp_path / "broken"
    (broken / "encodings").mkdir(parents=True)
    (broken / "encodings" / "__init__.py").write_text("raise SystemExit('broken stdlib')\n")
    job = copied_guard.job_env(HASWELL, ZEN3, PYTHONHOME=str(broken), PYTHONPATH=str(broken))

    run, task = copied_guard.as_prolog(job)

    assert run.returncode == 0
    assert task["EESSI_SOFTWARE_SUBDIR"] == ZEN3[0]
