"""Fixtures for the unit tests that run a child as another user or in another namespace, or
in a strict UTF-8 locale."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

import checkout
from tests.support.deep import deep_scratch
from tests.support.locales import en_us_utf8
from tests.support.users import unprivileged_user

__all__ = ["deep_scratch", "en_us_utf8", "package_dir", "unprivileged_user"]


@pytest.fixture(scope="session")
def package_dir():
    """``hpcstack_ops`` -> this checkout's module_utils, in a directory every user can read."""
    path = Path(tempfile.mkdtemp(prefix="hpcstack-pkg-"))
    path.chmod(0o755)
    checkout.link_package(path)
    yield path
    shutil.rmtree(path)
