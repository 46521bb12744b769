"""What ``plugins/module_utils/__init__.py`` promises: the two commands are the public API, the
rest is private to the collection, and ``common.version.VERSION`` is the collection's version,
which both commands print with ``--version``."""

from __future__ import annotations

import importlib
import io
import os
import re
import subprocess
import sys

import pytest
import yaml

import checkout
from ansible_collections.hpcstack.ops.plugins import module_utils
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cli as guard_cli
from ansible_collections.hpcstack.ops.plugins.module_utils.common.version import VERSION
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli as rebuild_cli

if sys.version_info >= (3, 11):
    import tomllib

# "``eb-staged-rebuild`` (entry point ``staged_rebuild.cli:main``)", across a line break too.
ENTRY_POINT = re.compile(r"``([\w-]+)``\s+\(entry\s+point\s+``([\w.]+):(\w+)``\)")


def _pyproject() -> dict:
    with open(checkout.REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def test_the_package_states_its_public_api_and_that_the_rest_is_private():
    statement = " ".join(module_utils.__doc__.split())
    assert "Public API: two commands, not Python names." in statement
    assert "is private to the collection" in statement
    assert "--json" in statement


def test_the_entry_points_the_statement_names_are_the_installed_commands():
    named = {
        command: f"hpcstack_ops.{module}:{function}"
        for command, module, function in ENTRY_POINT.findall(module_utils.__doc__)
    }
    assert named == _pyproject()["project"]["scripts"]
    assert set(named) == {"eb-staged-rebuild", "eessi-arch-guard"}
    for target in named.values():
        module, function = target.removeprefix("hpcstack_ops.").split(":")
        imported = importlib.import_module(f"{module_utils.__name__}.{module}")
        assert callable(getattr(imported, function)), target


def test_the_version_is_galaxy_yml_s():
    with open(checkout.REPO / "galaxy.yml", encoding="utf-8") as handle:
        assert yaml.safe_load(handle)["version"] == VERSION


def test_the_pip_package_takes_its_version_from_the_package():
    project = _pyproject()
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    dynamic = project["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "hpcstack_ops.common.version.VERSION"}


# eb-staged-rebuild --version


def _rebuild_command(package_dir, *args):
    """``eb-staged-rebuild ARGS`` as its console script runs it, from ``package_dir``."""
    return subprocess.run(
        [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli", *args],
        env=dict(os.environ, PYTHONPATH=str(package_dir)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("args", [["--version"], ["--json", "--version"], ["--version", "status"]])
def test_eb_staged_rebuild_prints_its_name_and_version_and_exits_0(package_dir, args):
    # --version is the same line with --json: it answers who is asking, not a command.
    done = _rebuild_command(package_dir, *args)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"eb-staged-rebuild {VERSION}\n", "")


def test_eb_staged_rebuild_help_lists_version():
    assert "--version" in rebuild_cli.build_parser().format_help()


# eessi-arch-guard --version


def _guard_main(argv):
    """``guard_cli.main`` with in-memory streams: ``(status, stdout, stderr)``."""
    stdout, stderr = io.BytesIO(), io.BytesIO()
    status = guard_cli.main(argv, environ={}, stdout=stdout, stderr=stderr)
    return status, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize("args", [["--version"], ["--json", "--version"]])
def test_eessi_arch_guard_prints_its_name_and_version_and_exits_0(args):
    assert _guard_main(args) == (0, f"eessi-arch-guard {VERSION}\n".encode(), b"")


def test_eessi_arch_guard_version_in_shell_mode_goes_to_stderr():
    # In shell mode stdout is code that eval runs.
    assert _guard_main(["--shell", "--version"]) == (0, b"", f"eessi-arch-guard {VERSION}\n".encode())


def test_eessi_arch_guard_version_as_a_node_runs_it(package_dir):
    done = subprocess.run(
        checkout.guard_argv(sys.executable, package_dir, "--version"),
        env={"PATH": os.defpath},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"eessi-arch-guard {VERSION}\n".encode(), b"")


def test_eessi_arch_guard_help_lists_version():
    assert "--version" in guard_cli.build_parser().format_help()


def test_eessi_arch_guard_imports_the_version_only_for_version(package_dir):
    # Every task of a step imports the guard's CLI: the version module is for --version alone.
    probe = (
        f"import sys; sys.path.insert(0, {str(package_dir)!r}); import hpcstack_ops.arch_guard.cli; "
        "print('hpcstack_ops.common.version' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-IS", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "False\n", "")
