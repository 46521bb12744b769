"""`make demo` builds the demo tree with real EasyBuild and shows its modules."""

from __future__ import annotations

import os
import subprocess
import sys

import checkout


def _demo(tree):
    env = dict(os.environ, HPCSTACK_DEMO_DIR=str(tree))
    return subprocess.run(
        [sys.executable, str(checkout.REPO / "tools" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_demo_builds_the_live_tree_and_lists_its_modules(tmp_path):
    first = _demo(tmp_path / "demo")

    assert first.returncode == 0, first.stdout + first.stderr
    assert "Build succeeded for 2 out of 2" in first.stdout
    avail = first.stdout.split("module avail")[1]
    assert "TinyApp/1.0" in avail
    assert "TinyLib/1.0" in avail
    assert first.stdout.rstrip().endswith("hello from TinyLib 1.0")
    assert (tmp_path / "demo" / "software" / "TinyApp" / "1.0" / "bin" / "tinyapp").is_file()


def test_demo_run_twice_leaves_the_installed_tree_alone(tmp_path):
    assert _demo(tmp_path / "demo").returncode == 0
    install = tmp_path / "demo" / "software" / "TinyApp" / "1.0"
    inode = install.stat().st_ino
    mtime = (install / "bin" / "tinyapp").stat().st_mtime_ns

    second = _demo(tmp_path / "demo")

    assert second.returncode == 0, second.stdout + second.stderr
    assert "TinyApp/1.0 is already installed" in second.stdout
    assert install.stat().st_ino == inode
    assert (install / "bin" / "tinyapp").stat().st_mtime_ns == mtime
