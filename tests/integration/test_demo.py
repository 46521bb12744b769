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
    assert "tinyapp: hello from TinyLib 1.0" in first.stdout
    assert first.stdout.rstrip().endswith(
        "EESSI_ARCH_GUARD_RELOADED=x86_64/amd/zen3 no accel->x86_64/intel/icelake accel/nvidia/cc80"
    )
    assert (tmp_path / "demo" / "software" / "TinyApp" / "1.0" / "bin" / "tinyapp").is_file()


def test_demo_rebuilds_through_the_staged_path_rolls_back_and_collects(tmp_path):
    done = _demo(tmp_path / "demo")

    assert done.returncode == 0, done.stdout + done.stderr
    live = tmp_path / "demo" / "software" / "TinyApp" / "1.0"
    published = [line for line in done.stdout.splitlines() if "is now a new directory" in line]
    assert len(published) == 1
    before, after = published[0].split("(inode ")[1].rstrip(")").split(" -> ")
    assert before != after
    # This machine has bubblewrap, so auto picks the bwrap backend, and says so.
    assert "--backend auto picks bwrap" in done.stdout
    assert "built with backend bwrap (live trees read-only during the build)" in done.stdout
    assert f"(inode {before}) for jobs still running from it" in done.stdout
    assert f"{live} is the previous directory again (inode {before})" in done.stdout
    assert live.stat().st_ino == int(before)
    assert "removed " + str(live.parent / ".1.0.") in done.stdout
    assert [p.name for p in live.parent.iterdir()] == ["1.0"]
    assert done.stdout.count("tinyapp: hello from TinyLib 1.0") == 3


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


def test_guard_demo_shows_the_wrong_build_then_the_right_one(tmp_path):
    done = subprocess.run(
        [sys.executable, str(checkout.REPO / "tools" / "demo_guard.py")],
        env=dict(os.environ, HPCSTACK_DEMO_DIR=str(tmp_path / "demo")),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    before, prolog, after = done.stdout.split("demo: ")[3:6]
    assert "usera runs the build for x86_64/amd/zen3" in before
    assert "print eessi-arch-guard: reloaded EESSI for x86_64/intel/icelake accel/nvidia/cc80" in prolog
    assert "EESSI_SOFTWARE_SUBDIR=x86_64/intel/icelake" in after
    assert "usera runs the build for x86_64/intel/icelake" in after
