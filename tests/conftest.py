"""Test-wide set-up: make the collection importable as ``ansible_collections.hpcstack.ops``;
count each test's CPU seconds (``tests/support/cputime.py``).

Ansible imports collection code through that name. A temporary directory holds the name as
a symlink to this checkout, so nothing is written into the repository and the tests import
exactly the files under review.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import checkout
from tests.support import cputime

_import_roots = []


def pytest_addoption(parser):
    cputime.pytest_addoption(parser)


def pytest_configure(config):
    config.pluginmanager.register(cputime.CpuTime(config), "hpcstack-cputime")
    root = checkout.link_collection(Path(tempfile.mkdtemp(prefix="hpcstack-collections-")))
    sys.path.insert(0, str(root))
    _import_roots.append(root)


def pytest_unconfigure(config):
    for root in _import_roots:
        if str(root) in sys.path:
            sys.path.remove(str(root))
        shutil.rmtree(root, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    # Every test here runs on the CI machine: a skip means a component or a fixture went
    # missing, and the run must say so by failing rather than pass with less tested.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"{len(skipped)} test(s) skipped; tests must not skip (see -rs above)", red=True)
        session.exitstatus = 1
