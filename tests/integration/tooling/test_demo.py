"""`make demo` builds the demo tree with real EasyBuild and shows its modules."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import checkout
import eessilike


def _demo(tree):
    env = dict(os.environ, HPCSTACK_DEMO_DIR=str(tree))
    return subprocess.run(
        [sys.executable, str(checkout.REPO / "testbed" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


# One demo run serves the tests of what it printed; the last test runs it a second time. The
# group keeps them on one xdist worker, so the run is made once.
DEMO_TREE = pytest.mark.xdist_group("demo_tree")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo, run once into a fresh tree: ``(tree, finished process)``."""
    tree = tmp_path_factory.mktemp("demo-run") / "demo"
    return tree, _demo(tree)


@DEMO_TREE
def test_demo_builds_the_live_tree_and_lists_its_modules(demo_run):
    tree, first = demo_run

    assert first.returncode == 0, first.stdout + first.stderr
    assert "Build succeeded for 2 out of 2" in first.stdout
    avail = first.stdout.split("module avail")[1]
    assert "TinyApp/1.0" in avail
    assert "TinyLib/1.0" in avail
    assert "tinyapp: hello from TinyLib 1.0" in first.stdout
    assert first.stdout.rstrip().endswith(
        "EESSI_ARCH_GUARD_RELOADED=x86_64/amd/zen3 no accel->x86_64/intel/icelake accel/nvidia/cc80"
    )
    assert (tree / "software" / "TinyApp" / "1.0" / "bin" / "tinyapp").is_file()


@DEMO_TREE
def test_demo_rebuilds_through_the_staged_path_rolls_back_and_collects(demo_run):
    tree, done = demo_run

    assert done.returncode == 0, done.stdout + done.stderr
    live = tree / "software" / "TinyApp" / "1.0"
    # The tool's own text, indented under the demo's lines (probe, rebuild, rollback, gc),
    # with a value or a command too long for its line put on the next one.
    out = re.sub(r" \\\n +", " ", done.stdout)

    def shown(label, value):
        return re.search(rf"^ +{re.escape(label)}:\s+{re.escape(str(value))}$", out, re.M) is not None

    assert shown("Backend", "auto picks bwrap")  # this machine has bubblewrap
    (published,) = re.findall(
        r"^   Published run (\S+): 1 module swapped in \(backend bwrap, sandboxed\)\.$", out, re.M
    )
    assert shown("Undo", f"eb-staged-rebuild --state-root {tree / '.eb-staged-rebuild'} rollback {published}")
    ((after, before),) = re.findall(r"^     Inode: +(\d+), was (\d+)$", out, re.M)
    assert before != after
    assert shown("Live", live)
    retired = live.parent / f".1.0.{published}"
    assert shown("Previous", retired)
    assert f"\n   Rolled back run {published}: the previous trees are live again.\n" in out
    assert shown("Inode", f"{before} again, was {after}")
    assert live.stat().st_ino == int(before)
    assert f"\n   removed  {retired}\n" in out
    assert "\n   1 removed, 0 kept, 0 to remove by hand.\n" in out
    assert [p.name for p in live.parent.iterdir()] == ["1.0"]
    assert out.count("tinyapp: hello from TinyLib 1.0") == 3


@DEMO_TREE
def test_demo_runs_the_rebuild_rollback_and_gc_playbooks_against_localhost(demo_run):
    tree, done = demo_run

    assert done.returncode == 0, done.stdout + done.stderr
    lines = [
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("demo (ansible): ")
    ]
    counts = [line.split(": ", 1)[1] for line in lines if line.endswith("failed=0")]
    # Up to date first; the edited easyconfig rebuilds; rollback and gc, each then a no-op.
    assert (
        counts
        == ["changed=0, failed=0", "changed=1, failed=0"] + ["changed=1, failed=0", "changed=0, failed=0"] * 2
    )
    assert "localhost: up to date, nothing rebuilt (TinyApp/1.0)" in lines
    live = tree / "software" / "TinyApp" / "1.0"
    inodes = next(line for line in lines if line.startswith(f"{live}: inode ") and "->" in line)
    before, after = inodes.split("inode ")[1].split(" -> ")
    assert before != after
    assert f"{live}: inode {before}, the previous directory again" in lines
    assert live.stat().st_ino == int(before)
    assert [p.name for p in live.parent.iterdir()] == ["1.0"]


@DEMO_TREE
def test_demo_run_twice_leaves_the_installed_tree_alone(demo_run):
    tree, first = demo_run
    assert first.returncode == 0
    install = tree / "software" / "TinyApp" / "1.0"
    inode = install.stat().st_ino
    mtime = (install / "bin" / "tinyapp").stat().st_mtime_ns

    second = _demo(tree)

    assert second.returncode == 0, second.stdout + second.stderr
    assert "TinyApp/1.0 is already installed" in second.stdout
    assert install.stat().st_ino == inode
    assert (install / "bin" / "tinyapp").stat().st_mtime_ns == mtime


def _sections(stdout: str) -> list[str]:
    """The demo's output cut before each ``demo: `` line, that prefix removed."""
    return [part for part in re.split(r"^demo: ", stdout, flags=re.MULTILINE) if part]


def _section(stdout: str, start: str) -> str:
    found = [part for part in _sections(stdout) if part.startswith(start)]
    assert len(found) == 1, stdout
    return found[0]


def _processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(f"{proc.name} {argv}")
    return found


@pytest.mark.parametrize("user", [pytest.param("root", marks=pytest.mark.host_cpu), "unprivileged"])
def test_guard_demo_shows_the_wrong_build_then_the_right_one(
    tmp_path, unprivileged_user, user_tmp_path, user
):
    """Only testbed/demo_guard.py (no EasyBuild): a real Slurm job as root, one line without root."""
    if user == "root":
        env = dict(os.environ, HPCSTACK_DEMO_DIR=str(tmp_path / "demo"))
        done = subprocess.run(
            [sys.executable, str(checkout.REPO / "testbed" / "demo_guard.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    else:
        env = dict(unprivileged_user.env(), HPCSTACK_DEMO_DIR=str(user_tmp_path / "demo"))
        done = unprivileged_user.run(
            [sys.executable, str(checkout.REPO / "testbed" / "demo_guard.py")], env=env, timeout=300
        )

    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    if user == "root":
        compatible = eessilike.cpupath()
        here = compatible[0]
        node = _section(out, "this machine is now a real Slurm node")
        assert node.rstrip().endswith(f"archdetect says its CPU is {here}")
        other = re.match(r"on a login node whose CPU is (\S+),", _section(out, "on a login node")).group(1)
        assert other not in compatible
        without = _section(out, "without the guard (Slurm's TaskProlog does nothing)")
        assert f"EESSI_SOFTWARE_SUBDIR={other}\n" in without
        assert f"usera runs the build for {other}\n" in without
        assert "EESSI_ARCH_GUARD_RELOADED=(not set)" in without
        assert "eessi-arch-guard" not in without
        guarded = _section(out, "with eessi-arch-guard as Slurm's TaskProlog")
        assert f"eessi-arch-guard: reloaded EESSI for {here} (job environment was {other})" in guarded
        assert f"EESSI_SOFTWARE_SUBDIR={here}\n" in guarded
        assert f"usera runs the build for {here}\n" in guarded
        assert f"EESSI_ARCH_GUARD_RELOADED={other}->{here}" in guarded
        assert "the demo's Slurm daemons are stopped\n" in _sections(out)
        cluster = node.split("testbed/slurm-local.sh start ")[1].split(")")[0]
        assert _processes_naming(cluster) == []
        assert not Path(cluster).exists()
    else:
        assert (
            "demo: no real Slurm job in this demo: starting slurmd needs root (run make demo as root)\n"
            in out
        )
        assert "real Slurm node" not in out
        assert "sbatch" not in out
    before = _section(out, "the job runs on a x86_64/intel/icelake node with a GPU")
    prolog = _section(out, "as Slurm's TaskProlog, eessi-arch-guard writes")
    after = _section(out, 'in a job script, eval "$(eessi-arch-guard --shell)"')
    assert "usera runs the build for x86_64/amd/zen3" in before
    assert "print eessi-arch-guard: reloaded EESSI for x86_64/intel/icelake accel/nvidia/cc80" in prolog
    assert "EESSI_SOFTWARE_SUBDIR=x86_64/intel/icelake" in after
    assert "usera runs the build for x86_64/intel/icelake" in after
