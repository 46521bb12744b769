"""The two ways the code ships: `pip install .` and `ansible-galaxy collection build`."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import checkout


def test_pip_install_provides_the_core_as_hpcstack_ops(tmp_path):
    target = tmp_path / "site"

    done = checkout.pip_install(target, tmp_path)
    assert done.returncode == 0, done.stderr

    imported = subprocess.run(
        [sys.executable, "-c", "import hpcstack_ops.staged_rebuild.fsutil as m; print(m.__file__)"],
        env=dict(os.environ, PYTHONPATH=str(target)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == str(target / "hpcstack_ops" / "staged_rebuild" / "fsutil.py")


def test_galaxy_build_leaves_out_tests_venvs_and_caches(tmp_path):
    source = checkout.copy_to(tmp_path / "ansible_collections" / "hpcstack" / "ops")
    # What a working tree accumulates; none of it may reach the tarball.
    for junk in (
        ".venv/bin/python",
        "plugins/module_utils/__pycache__/x.pyc",
        ".pytest_cache/v",
        ".ruff_cache/x",
        "demo/software/x",
        "tests/output/x",
    ):
        (source / junk).parent.mkdir(parents=True, exist_ok=True)
        (source / junk).write_text("junk")

    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-galaxy"),
            "collection",
            "build",
            "--output-path",
            str(tmp_path / "out"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    (tarball,) = (tmp_path / "out").glob("hpcstack-ops-*.tar.gz")
    with tarfile.open(tarball) as tar:
        members = tar.getnames()
    assert "MANIFEST.json" in members
    assert "plugins/module_utils/staged_rebuild/fsutil.py" in members
    assert "LICENSE" in members
    excluded = (
        "tests",
        ".venv",
        ".pytest_cache",
        ".ruff_cache",
        "demo",
        "tools",
        "testbed",
        "benchmarks",
        ".ci",
        "requirements",
    )
    leaked = [name for name in members if name.split("/")[0] in excluded or "__pycache__" in name]
    assert leaked == []
