"""Live trees made from EasyBuild's own test material, and the two module tools that load them.

The material is the ``test/framework/`` of EasyBuild's source distribution of the pinned
version (the bootstrap fetches it into ``.venv/test-material``): the toy, libtoy and toy-app
easyconfigs, the sandbox's sources, and the sandbox's easyblocks (``EB_toy`` and friends),
which EasyBuild takes with ``--include-easyblocks``. ``ToyMaterial`` stands where the
``tinypkgs`` packages stand for ``EbSite`` (``sources``, ``easyconfigs``, ``easyconfig``).

Environment Modules 5 is the Debian package unpacked beside Lmod (it conflicts with lmod),
its ``modulecmd.tcl`` run by the system's ``tclsh``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import stackenv

MATERIAL_VARIABLE = "HPCSTACK_TEST_MATERIAL"
TCLSH = "/usr/bin/tclsh"
MODULE_TIMEOUT = 60
EB_TIMEOUT = 300


def material_dir() -> Path:
    """Where the bootstrap put the material: ``$HPCSTACK_TEST_MATERIAL``, else beside .venv's eb."""
    given = os.environ.get(MATERIAL_VARIABLE)
    return Path(given) if given else Path(stackenv.find_eb()).parent.parent / "test-material"


@dataclass(frozen=True)
class ToyMaterial:
    """EasyBuild's ``test/framework``: easyconfigs, sources and easyblocks of the toy packages."""

    framework: Path

    @property
    def sources(self) -> Path:
        return self.framework / "sandbox" / "sources"

    @property
    def easyconfigs(self) -> Path:
        return self.framework / "easyconfigs" / "test_ecs"

    def easyconfig(self, name: str, version: str = "0.0") -> Path:
        return self.easyconfigs / name[0].lower() / name / f"{name}-{version}.eb"

    @property
    def easyblocks(self) -> str:
        """``EASYBUILD_INCLUDE_EASYBLOCKS``: the sandbox's easyblocks (EB_toy is one of them)."""
        blocks = self.framework / "sandbox" / "easybuild" / "easyblocks"
        return f"{blocks}/*.py,{blocks}/*/*.py"

    def env(self) -> dict:
        return {"EASYBUILD_INCLUDE_EASYBLOCKS": self.easyblocks}


@dataclass(frozen=True)
class EnvironmentModules:
    """Environment Modules 5's ``modulecmd.tcl``, run with the system's tclsh."""

    modulecmd: Path

    def shell_command(self, script: str) -> list[str]:
        """``bash -c`` with a ``module`` function of Environment Modules, for a script that uses it."""
        define = f'module() {{ eval "$({TCLSH} {self.modulecmd} bash "$@")"; }}'
        return ["bash", "--noprofile", "--norc", "-c", f"{define}; {script}"]


@pytest.fixture(scope="session")
def toy_material() -> ToyMaterial:
    framework = material_dir() / "easybuild-framework" / "test" / "framework"
    if not (framework / "easyconfigs" / "test_ecs" / "t" / "toy" / "toy-0.0.eb").is_file():
        pytest.fail(f"EasyBuild's test material is missing at {framework}; run tools/bootstrap.sh test")
    return ToyMaterial(framework)


@pytest.fixture(scope="session")
def environment_modules() -> EnvironmentModules:
    found = sorted((material_dir() / "environment-modules").rglob("modulecmd.tcl"))
    if not found or not os.access(TCLSH, os.X_OK):
        pytest.fail(f"Environment Modules or {TCLSH} is missing; run tools/bootstrap.sh test")
    return EnvironmentModules(found[0])


def install(site, material: ToyMaterial, *modules: str, eb_args=()) -> None:
    """Build ``modules`` (``name/version``) straight into ``site``'s live tree with plain ``eb``."""
    easyconfigs = [str(material.easyconfig(*module.split("/"))) for module in modules]
    done = subprocess.run(
        site.as_owner([str(site.eb), *eb_args, *easyconfigs]),
        cwd=site.root,
        env=site.eb_env(material, **material.env()),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EB_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def counting_eb(site) -> tuple[Path, Path]:
    """An ``eb`` that records each start in a file, then runs the real one: ``(eb, record)``.

    A refusal made before the build leaves the record absent.
    """
    record = site.root / "eb-started"
    wrapper = site.root / "counting-eb"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {record}\nexec {site.eb} "$@"\n')
    wrapper.chmod(0o755)
    site.give(wrapper)
    return wrapper, record


def load_with_lmod(site, module: str, command: str) -> subprocess.CompletedProcess:
    return site.module_shell(f"module load {module} && {command}")


def load_with_environment_modules(
    site, tool: EnvironmentModules, module: str, command: str
) -> subprocess.CompletedProcess:
    env = dict(site.base_env(), MODULEPATH=str(site.modules_all))
    return subprocess.run(
        site.as_owner(tool.shell_command(f"module load {module} && {command}")),
        cwd=site.root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=MODULE_TIMEOUT,
        check=False,
    )
