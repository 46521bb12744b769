"""Builds that go wrong never reach the live tree: real EasyBuild, real signals, real sandboxes.

Each case builds a live tree with plain ``eb`` (TinyLib and TinyApp, first generation),
takes a snapshot of the live software and module trees (type, mode, owner, inode and bytes
of every entry), and then lets a staged rebuild fail: its sanity check fails, the tool is
killed while EasyBuild is halfway (a hook marks "halfway" and sleeps), or a hook writes into
the live tree. Afterwards the snapshot must be the same: every live directory keeps its
inode and bytes, every module file its bytes. A failed build exits 2 with one
``eb-staged-rebuild:`` line that names the build log.
"""

from __future__ import annotations

import errno
import json
import os
import signal

import pytest

import tinypkgs
from tests.integration.harness.ebsite import (
    APP,
    LIB,
    OWNERS,
    failure_cases,
    grep_bytes,
    result_json,
    wait_for,
)

NEW_GREETING = "hello from TinyLib 1.0, second generation"
RUN_ID = "20240101T000000Z-isolation"
SANDBOXED = ("bwrap", "userns")
ALL_BACKENDS = ("bwrap", "userns", "installpath")
READ_ONLY = os.strerror(errno.EROFS)  # "Read-only file system"
SIGNAL_WAIT = 60


def _live_site(eb_site_factory, owner):
    """A site with TinyLib and TinyApp built live by plain eb from the first generation."""
    site = eb_site_factory(owner)
    site.install(site.write_packages("gen1"), tinypkgs.APP)
    return site


def _failure_line(done, site, run_id=RUN_ID) -> str:
    """The one ``eb-staged-rebuild:`` line of a failed build; it must name the build log."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "backend installpath:" not in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("eb-staged-rebuild: EasyBuild failed (exit "), lines[0]
    assert "nothing was swapped" in lines[0]
    log = site.build_log(run_id)
    assert lines[0].endswith(f"its log is {log}"), lines[0]
    assert log.is_file()
    return lines[0]


def _greeting(site) -> str:
    return site.module_shell(f"module load {APP} && tinyapp").stdout.strip()


# --- a sanity check that fails -----------------------------------------------------------


@pytest.mark.parametrize(("backend", "owner"), failure_cases(ALL_BACKENDS))
def test_a_failed_sanity_check_leaves_the_live_tree_as_it_was(eb_site_factory, backend, owner):
    site = _live_site(eb_site_factory, owner)
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    tinypkgs.write_failing_sanity_check(new, tinypkgs.LIB)
    before = site.snapshot()

    done = site.rebuild((LIB,), new, backend=backend, extra=("--run-id", RUN_ID))

    _failure_line(done, site)
    assert "Sanity check failed" in site.build_log(RUN_ID).read_text()
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


# Not bwrap: the transaction logic is the same for every backend; bwrap's failures are covered
# by the tests around this one.
@pytest.mark.parametrize("backend", ["userns", "installpath"])
def test_a_chain_whose_second_package_fails_publishes_neither(eb_site_factory, backend):
    site = _live_site(eb_site_factory, "user")
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    tinypkgs.write_failing_sanity_check(new, tinypkgs.APP)
    before = site.snapshot()

    done = site.rebuild((LIB, APP), new, backend=backend, eb_args=("--robot",), extra=("--run-id", RUN_ID))

    _failure_line(done, site)
    log = site.build_log(RUN_ID).read_text()
    assert "Sanity check failed" in log
    # TinyLib did build: the failure came after it, and still nothing of it is live.
    assert "COMPLETED: Installation ended successfully" in log
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


# --- the tool killed while EasyBuild is halfway ------------------------------------------


def _start_halfway(site, backend, extra=()):
    """Start a rebuild of TinyLib whose build stops after its install step; return (proc, packages)."""
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    control = site.scratch("control")
    marker = control / "halfway"
    hooks = tinypkgs.write_halfway_hooks(control / "hooks.py", marker)
    site.give(control)
    args = site.rebuild_args(
        (LIB,), new, backend=backend, eb_args=("--hooks", str(hooks)), extra=("--run-id", RUN_ID, *extra)
    )
    proc = site.popen_tool(*args, packages=new)
    wait_for(marker, proc)
    return proc, new


def _live_parts(site):
    """The live directories, module files and class links of both packages (not the generation)."""
    parts = {}
    for module in (LIB, APP):
        parts.update(site.snapshot_of(site.live(module), site.module_file(module), site.class_link(module)))
    return parts


def _command_line(pid) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.parametrize(("backend", "owner"), failure_cases(ALL_BACKENDS))
def test_sigterm_during_the_build_kills_easybuild_and_swaps_nothing(eb_site_factory, backend, owner):
    site = _live_site(eb_site_factory, owner)
    before = site.snapshot()
    live_before = _live_parts(site)
    proc, _new = _start_halfway(site, backend)
    # Halfway: EasyBuild has emptied what it sees as the install directory and installed.
    assert _live_parts(site) == live_before

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=SIGNAL_WAIT)

    assert proc.returncode == 2, (out, err)
    lines = [line for line in err.splitlines() if "backend installpath:" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("eb-staged-rebuild: "), err
    assert "Traceback" not in err
    # The build's whole process group went with the tool: nothing writes on.
    assert site.wait_until_gone(SIGNAL_WAIT) == []
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sigkill_of_the_tool_leaves_no_build_running(eb_site_factory, backend):
    """EasyBuild runs in a session of its own; it must not outlive a tool killed without warning."""
    site = _live_site(eb_site_factory, "user")
    proc, _new = _start_halfway(site, backend)
    assert len(site.leftovers()) > 1  # the tool and its build

    proc.kill()
    proc.communicate(timeout=SIGNAL_WAIT)

    running = site.wait_until_gone(30)
    commands = [_command_line(pid) for pid in running]
    assert commands == []


@pytest.mark.parametrize(("backend", "owner"), failure_cases(ALL_BACKENDS))
def test_sigkill_during_the_build_leaves_the_live_tree_and_resume_finishes_the_run(
    eb_site_factory, backend, owner
):
    site = _live_site(eb_site_factory, owner)
    live_before = _live_parts(site)
    old_inode = site.live(LIB).stat().st_ino
    proc, new = _start_halfway(site, backend)
    # Halfway: EasyBuild has emptied what it sees as the install directory and installed.
    assert _live_parts(site) == live_before

    proc.kill()
    proc.communicate(timeout=SIGNAL_WAIT)

    assert proc.returncode == -signal.SIGKILL
    assert _live_parts(site) == live_before
    journal = json.loads((site.state_root / "runs" / RUN_ID / "journal.json").read_text())
    assert journal["state"] == "building"
    # A build that outlived the tool (test_sigkill_of_the_tool_leaves_no_build_running says
    # whether one does) would race the second build of resume: stopped here in any case.
    site.stop_leftovers()
    assert _live_parts(site) == live_before

    resumed = result_json(site.run_tool("--json", "resume", packages=new))

    assert resumed["changed"] is True
    assert [run["run_id"] for run in resumed["runs"]] == [RUN_ID]
    assert resumed["runs"][0]["state"] == "published"
    assert os.lstat(site.software / tinypkgs.LIB / f".{tinypkgs.VERSION}.{RUN_ID}").st_ino == old_inode
    assert _greeting(site) == NEW_GREETING
    for stage in (site.generation(RUN_ID), site.software / tinypkgs.LIB / f".{tinypkgs.VERSION}.{RUN_ID}"):
        assert grep_bytes(os.fsencode(stage), site.live(LIB), site.modules) == []


# --- a hook that writes into the live tree ----------------------------------------------


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("backend", SANDBOXED)
def test_a_hook_writing_into_the_live_tree_fails_with_erofs_and_changes_nothing(
    eb_site_factory, backend, owner
):
    site = _live_site(eb_site_factory, owner)
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    control = site.scratch("control")
    report = control / "report"
    targets = [
        site.module_file(LIB),  # the live module file of the module being rebuilt
        site.live(APP),  # a sibling module's live directory
        site.module_file(APP),  # a sibling module's live module file
        site.software,  # the live software tree itself
        site.modules_all,  # the live module tree itself
    ]
    hooks = tinypkgs.write_live_writer_hooks(control / "hooks.py", targets, report)
    site.give(control)
    before = site.snapshot()

    done = site.rebuild(
        (LIB,), new, backend=backend, eb_args=("--hooks", str(hooks)), extra=("--run-id", RUN_ID)
    )

    _failure_line(done, site)
    assert READ_ONLY in site.build_log(RUN_ID).read_text()
    outcomes = dict(line.split("\t") for line in report.read_text().splitlines())
    assert outcomes == {str(target): f"{errno.EROFS} {READ_ONLY}" for target in targets}
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


# --- a missing live Name/version --------------------------------------------------------


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("backend", ["auto", *ALL_BACKENDS])
def test_a_missing_live_version_is_refused_before_easybuild_runs(eb_site_factory, backend, owner):
    site = _live_site(eb_site_factory, owner)
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    missing = site.software / tinypkgs.LIB / "9.9"
    before = site.snapshot()

    done = site.run_tool(
        "--json",
        "rebuild",
        f"--installpath={site.installpath}",
        f"--eb={site.eb}",
        "--module",
        f"{tinypkgs.LIB}/9.9",
        "--backend",
        backend,
        "--run-id",
        RUN_ID,
        "--",
        str(new.easyconfig(tinypkgs.LIB)),
        packages=new,
    )

    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("eb-staged-rebuild: "), lines
    assert str(missing) in lines[0]
    assert not os.path.lexists(missing)
    assert not site.build_log(RUN_ID).exists()
    assert site.journals() == []
    assert site.snapshot() == before
