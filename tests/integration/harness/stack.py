"""Fixtures for the real Lmod and EasyBuild, and the tiny packages they build."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import stackenv
import tinypkgs

EB_TIMEOUT = 600


@pytest.fixture(scope="session")
def lmod() -> stackenv.Lmod:
    """The machine's Lmod. Missing Lmod fails the test: the CI machine has it."""
    try:
        return stackenv.find_lmod()
    except stackenv.StackError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="session")
def tiny_packages(tmp_path_factory) -> tinypkgs.TinyPackages:
    """TinyLib/1.0 and TinyApp/1.0 (which depends on TinyLib): sources and easyconfigs."""
    return tinypkgs.write_packages(tmp_path_factory.mktemp("tinypkgs"))


@dataclass(frozen=True)
class EasyBuild:
    """The real ``eb`` from .venv, configured for Lmod, Lua module files and no downloads."""

    eb: Path
    lmod: stackenv.Lmod
    packages: tinypkgs.TinyPackages

    def env(self, installpath: Path, state: Path) -> dict:
        return stackenv.easybuild_env(
            self.lmod,
            prefix=state,
            installpath=installpath,
            sources=self.packages.sources,
            easyconfigs=self.packages.easyconfigs,
        )

    def build(self, installpath: Path, *args: str, state: Path | None = None) -> subprocess.CompletedProcess:
        """Run ``eb --robot ARGS`` into ``installpath``; EasyBuild's state goes to ``state``."""
        state = state or installpath.parent / (installpath.name + ".eb-state")
        return subprocess.run(
            [str(self.eb), "--robot", *args],
            env=self.env(installpath, state),
            capture_output=True,
            text=True,
            timeout=EB_TIMEOUT,
            check=False,
        )


@pytest.fixture(scope="session")
def easybuild(lmod, tiny_packages) -> EasyBuild:
    try:
        return EasyBuild(eb=stackenv.find_eb(), lmod=lmod, packages=tiny_packages)
    except stackenv.StackError as err:
        pytest.fail(str(err))
