"""The compile gate holds plugins/ to Python 3.8, with the real interpreters of the machine."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import checkout
import pythons

GATE = checkout.REPO / "tools" / "compile_check.py"


@pytest.fixture
def repo_copy(tmp_path):
    shutil.copytree(checkout.REPO / "plugins", tmp_path / "plugins")
    return tmp_path


def _gate(repo):
    return subprocess.run([sys.executable, str(GATE), str(repo)], capture_output=True, text=True, check=False)


def test_python_3_8_is_on_this_machine():
    # The floor is only checked where a 3.8 interpreter exists; the CI machine has one.
    assert pythons.find("3.8") is not None


def test_the_tree_as_it_is_passes_on_every_python_found(repo_copy):
    done = _gate(repo_copy)
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("compiled plugins/ with Python 3.8, ")


def test_syntax_that_needs_python_3_9_fails_the_gate_on_3_8(repo_copy):
    fsutil = repo_copy / "plugins" / "module_utils" / "staged_rebuild" / "fsutil.py"
    with fsutil.open("a") as handle:
        handle.write(
            "\n\ndef _needs_39(a, b):\n    with (open(a) as x, open(b) as y):\n        return x, y\n"
        )

    done = _gate(repo_copy)

    assert done.returncode == 1
    assert f"{fsutil}:" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("FAILED on 3.8")


def test_an_api_missing_on_3_8_fails_the_import_check(repo_copy):
    # Compiles everywhere, breaks at import on 3.8: functools.cache arrived in 3.9.
    fsutil = repo_copy / "plugins" / "module_utils" / "staged_rebuild" / "fsutil.py"
    with fsutil.open("a") as handle:
        handle.write("\nimport functools\n\n_cached = functools.cache\n")

    done = _gate(repo_copy)

    assert done.returncode == 1
    assert "import hpcstack_ops.staged_rebuild.fsutil: AttributeError" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("FAILED on 3.8")
