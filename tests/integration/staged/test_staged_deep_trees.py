"""Trees with a chain of thousands of nested directories: gc removes them, a failed rebuild
discards its stage, and resume rebuilds a run whose stage holds one.

A chain that deep is what a build (or a user who can write into an install) can leave in a
tree; the removal walks it with its own stack and a few descriptors (``common/dirfd.py``'s
``_Removal``), where it once recursed once per level and died with ``RecursionError``, every
time: gc could never collect the tree, and a failed rebuild stayed ``building`` with resume
dying the same way. The real command runs each case; the site lives in a scratch directory that ``rm -rf``
removes whatever the test left (``deep_scratch``).
"""

from __future__ import annotations

import json
import resource
import subprocess

import pytest

from tests.integration.harness.staged_checks import run_tool, tool_command, tool_env
from tests.support.deep import depth_of, nest
from tests.support.staged import TOOL_TIMEOUT, StagedSite

APP = "TinyApp/1.0"
DEPTH = 5_000


@pytest.fixture
def site(deep_scratch, package_root) -> StagedSite:
    built = StagedSite(
        installpath=deep_scratch / "apps", state_root=deep_scratch / "state", package_root=package_root
    )
    built.install(APP)
    return built


def _journal(site, run_id) -> dict:
    return json.loads((site.state_root / "runs" / run_id / "journal.json").read_text())


def _generation(site, run_id):
    return site.software / ".eb-staged-rebuild" / run_id


def test_gc_removes_a_retired_tree_that_holds_a_chain_5000_directories_deep(site):
    published = run_tool(site, site.rebuild_args(APP, extra=("--run-id", "r1")))
    assert published.returncode == 0, published.stderr
    retired = site.software / "TinyApp" / ".1.0.r1"
    nest(retired, DEPTH, files=False)
    assert depth_of(retired) == DEPTH

    done = run_tool(site, ["--json", "gc", "--grace-hours", "0", "--no-squeue"])

    assert done.returncode == 0, done.stderr[-3000:]
    assert [entry["path"] for entry in json.loads(done.stdout)["removed"]] == [str(retired)]
    assert not retired.exists()
    assert site.payload(APP) == "new build"


def test_a_rebuild_that_fails_with_a_stage_5000_directories_deep_ends_failed_and_discards_it(site):
    done = run_tool(
        site,
        site.rebuild_args(APP, extra=("--run-id", "r1")),
        env={"FAKE_EB_DEEP": DEPTH, "FAKE_EB_FAIL": "1"},
    )

    # The builder's failure, in one line after the unsandboxed backend's notice.
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("eb-staged-rebuild: EasyBuild failed"), lines[-1]
    assert (_journal(site, "r1")["state"], _journal(site, "r1")["refused"]) == ("failed", True)
    assert not _generation(site, "r1").exists()
    assert site.payload(APP) == "old"
    resumed = run_tool(site, ["--json", "resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["changed"] is False


def test_resume_rebuilds_a_run_stopped_with_a_stage_5000_directories_deep(site):
    # Killed right after the build, its stage (with the chain) left in the build area.
    crashed = run_tool(
        site,
        site.rebuild_args(APP, extra=("--run-id", "r1")),
        env={"FAKE_EB_DEEP": DEPTH, "EB_STAGED_REBUILD_CRASH_AT": "relocate"},
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    stage = _generation(site, "r1") / "software" / "TinyApp" / "1.0"
    assert depth_of(stage, "deep") == 1
    assert _journal(site, "r1")["state"] == "building"

    done = run_tool(site, ["--json", "resume"])

    assert done.returncode == 0, done.stderr[-3000:]
    assert _journal(site, "r1")["state"] == "published"
    assert not _generation(site, "r1").exists()
    assert site.payload(APP) == "new build"
    assert not (site.live(APP) / "deep").exists()


# A soft RLIMIT_NOFILE a removal that held a descriptor per level would pass 160 times over;
# the tool's own start (Python, its modules, the lock) needs a few dozen.
LOW_NOFILE = 64


def _with_low_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.parametrize("command", ["gc", "resume"])
def test_a_chain_5000_deep_is_removed_under_a_soft_descriptor_limit_of_64(site, command):
    if command == "gc":
        published = run_tool(site, site.rebuild_args(APP, extra=("--run-id", "r1")))
        assert published.returncode == 0, published.stderr
        removed = site.software / "TinyApp" / ".1.0.r1"
        nest(removed, DEPTH, files=False)
        args = ["--json", "gc", "--grace-hours", "0", "--no-squeue"]
    else:  # a failed build's stage, discarded when resume ends the run
        crashed = run_tool(
            site,
            site.rebuild_args(APP, extra=("--run-id", "r1")),
            env={"FAKE_EB_DEEP": DEPTH, "EB_STAGED_REBUILD_CRASH_AT": "relocate"},
        )
        assert crashed.returncode == -9, crashed.stderr[-3000:]
        removed = _generation(site, "r1")
        args = ["--json", "resume"]

    done = subprocess.run(
        tool_command(site.state_root, *args),
        env=tool_env(site),
        preexec_fn=_with_low_nofile,  # setrlimit only, in the child before exec
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert not removed.exists()
    assert site.payload(APP) == "new build"
