"""`make demo` builds the demo tree with real EasyBuild, shows its modules, repairs a
mismatched job with the guard on a real Slurm, and leaves that Slurm and demo.env for the
how-tos (whose tests, test_howto_*.py, share the same run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import checkout
import demo_site
import eessilike
from tests.integration.harness.demo import DEMO_TREE, run_demo


@DEMO_TREE
def test_demo_builds_the_live_tree_and_lists_its_modules(demo_run):
    tree, first = demo_run.tree, demo_run.done

    assert first.returncode == 0, first.stdout + first.stderr
    assert "Build succeeded for 2 out of 2" in first.stdout
    avail = first.stdout.split("module avail")[1]
    assert "TinyApp/1.0" in avail
    assert "TinyLib/1.0" in avail
    assert "tinyapp: hello from TinyLib 1.0" in first.stdout
    assert (tree / "software" / "TinyApp" / "1.0" / "bin" / "tinyapp").is_file()
    assert first.stdout.endswith(
        f"   . {tree / 'demo.env'}\n"
        "demo: its single-node Slurm keeps running for them; make demo-stop stops it\n"
    )


@DEMO_TREE
def test_demo_stop_stops_its_slurm_and_a_second_demo_leaves_the_tree_alone(demo_run):
    tree, first = demo_run.tree, demo_run.done
    assert first.returncode == 0
    install = tree / "software" / "TinyApp" / "1.0"
    inode = install.stat().st_ino
    mtime = (install / "bin" / "tinyapp").stat().st_mtime_ns
    cluster = Path(demo_run.exported("SLURM_CONF")).parent

    stopped = run_demo(tree, "stop")

    assert (stopped.returncode, stopped.stdout) == (0, "demo: the demo's Slurm daemons are stopped\n")
    assert _processes_naming(str(cluster)) == []
    assert not cluster.exists()

    second = run_demo(tree)

    assert second.returncode == 0, second.stdout + second.stderr
    assert "TinyApp/1.0 is already installed" in second.stdout
    assert install.stat().st_ino == inode
    assert (install / "bin" / "tinyapp").stat().st_mtime_ns == mtime
    # Slurm is up again for the how-tos that run after this test, on the same slurm.conf.
    assert _processes_naming(str(cluster))
    assert f"export SLURM_CONF={cluster / 'slurm.conf'}\n" in (tree / "demo.env").read_text()


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


@DEMO_TREE
@pytest.mark.host_cpu
def test_demo_repairs_a_real_slurm_job_and_leaves_that_slurm_running(demo_run):
    tree, done = demo_run.tree, demo_run.done
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
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
    cluster = Path(node.split("testbed/slurm-local.sh start ")[1].split(")")[0])
    assert cluster == Path(demo_run.exported("SLURM_CONF")).parent
    # Left running for the how-tos, with the TaskProlog that does nothing back.
    assert {"munged", "slurmctld", "slurmd"} <= {
        argv.split()[1].rsplit("/", 1)[-1] for argv in _processes_naming(str(cluster))
    }
    assert (cluster / "task_prolog").read_text() == "#!/bin/sh\nexit 0\n"
    env_file = (tree / "demo.env").read_text()
    assert f"export DEMO_CPU_TARGET={here}\n" in env_file
    assert f"export DEMO_OTHER_TARGET={other}\n" in env_file


def test_guard_demo_without_root_says_why_there_is_no_slurm_job(unprivileged_user, user_tmp_path):
    """Only testbed/demo_guard.py (no EasyBuild), as a user: one line instead of the real job,
    then the simulated nodes."""
    env = dict(unprivileged_user.env(), HPCSTACK_DEMO_DIR=str(user_tmp_path / "demo"))
    done = unprivileged_user.run(
        [sys.executable, str(checkout.REPO / "testbed" / "demo_guard.py")], env=env, timeout=300
    )

    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "demo: no real Slurm job in this demo: starting slurmd needs root (run make demo as root)\n" in out
    assert "real Slurm node" not in out
    assert "sbatch" not in out
    before = _section(out, "the job runs on a x86_64/intel/icelake node with a GPU")
    prolog = _section(out, "as Slurm's TaskProlog, eessi-arch-guard writes")
    after = _section(out, 'in a job script, eval "$(eessi-arch-guard --shell)"')
    assert "usera runs the build for x86_64/amd/zen3" in before
    assert "print eessi-arch-guard: reloaded EESSI for x86_64/intel/icelake accel/nvidia/cc80" in prolog
    assert "EESSI_SOFTWARE_SUBDIR=x86_64/intel/icelake" in after
    assert "usera runs the build for x86_64/intel/icelake" in after


@pytest.mark.parametrize("planted", ["another user's directory", "a link to root's directory"])
def test_a_slurm_directory_planted_under_the_demo_s_name_is_neither_used_nor_stopped(
    tmp_path, unprivileged_user, planted
):
    """The demo's Slurm directory has a name anyone can work out (/tmp/hpcstack-demo-<hash of
    the tree's path>). What another user put there first is refused in one line, and
    ``make demo-stop`` leaves it alone (a pid file there would name the processes to kill)."""
    tree = tmp_path / "demo"
    root = demo_site.slurm_root(tree)
    target = tmp_path / "roots-own"
    target.mkdir()
    if planted == "another user's directory":
        made = unprivileged_user.run(["mkdir", "-m", "0755", str(root)])
        assert made.returncode == 0, made.stderr
    else:
        made = unprivileged_user.run(["ln", "-s", str(target), str(root)])
        assert made.returncode == 0, made.stderr
    try:
        with pytest.raises(demo_site.DemoSiteError) as refused:
            demo_site.make_slurm_root(tree)
        assert str(refused.value) == (
            f"{root} exists and is not a directory of this user's that only it can write; remove it"
        )
        assert demo_site.stop_slurm(tree) is None
        assert os.path.lexists(root)
        assert list(target.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", "--", str(root)], check=True)
