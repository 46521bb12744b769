"""Fixtures the module tests share: a host without the modules' variables, and a site."""

from __future__ import annotations

import pytest

from tests.support.module_runner import APP
from tests.support.staged import StagedSite

# What the modules, the command and the test builder read from the host when no option says.
# Spelled out: this conftest loads before the session makes ``ansible_collections`` importable.
HOST_VARIABLES = (
    "EB_STAGED_REBUILD_STATE_ROOT",
    "EB_STAGED_REBUILD_EB",
    "EB_STAGED_REBUILD_GRACE_HOURS",
    "EB_STAGED_REBUILD_CRASH_AT",
    "EASYBUILD_INSTALLPATH",
    "EASYBUILD_INSTALLPATH_SOFTWARE",
    "EASYBUILD_INSTALLPATH_MODULES",
    "FAKE_EB_ARGS_LOG",
)


@pytest.fixture
def empty_site(tmp_path, monkeypatch, package_dir) -> StagedSite:
    """A site with nothing installed yet. The command runs as its own process from this
    checkout's code (``package_dir``)."""
    # The modules fall back to the host's variables; none may leak in from the caller's.
    for name in HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=package_dir)


@pytest.fixture
def site(empty_site) -> StagedSite:
    """APP installed live by the test builder; no state root yet."""
    empty_site.install(APP)
    return empty_site
