"""A run's life cycle (issue 18, defects 6 and 7): a run directory appears with its journal,
a rebuild that fails before publishing ends its run ``failed``, and resume leaves it so.

Each case runs the real command against a live tree. A failure before the publish must
exit 2 with one line, leave the live trees exactly as they were, end the journal ``failed``
(``refused``), and a following ``resume`` must build and publish nothing and say so; the
next rebuild then runs without any manual repair. A leftover of a crash between a run
directory's creation and its journal (the hidden directory this release makes, or the
journal-less directory an earlier release's create left) is skipped by ``status``,
``resume``, ``gc`` and ``rebuild`` instead of refusing them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.harness.staged_checks import (
    read_journal,
    refusal_line,
    run_tool,
    tool_command,
    tool_env,
)
from tests.support.mountns import in_private_mounts

APP = "TinyApp/1.0"


@pytest.fixture
def site(staged_site):
    staged_site.install(APP, payload="old")
    return staged_site


def _json(done):
    assert done.returncode in (0, 1), (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def _assert_resume_publishes_nothing(site, run_id, eb_log):
    before = site.snapshot()

    done = run_tool(site, ["--json", "resume"], env={"FAKE_EB_ARGS_LOG": eb_log})

    result = _json(done)
    assert done.returncode == 0, done.stderr
    assert result["changed"] is False
    assert [(run["run_id"], run["state"], run["changed"], run["actions"]) for run in result["runs"]] == [
        (run_id, "failed", False, [])
    ]
    assert site.snapshot() == before
    assert not eb_log.exists(), "resume started EasyBuild for a failed run"


def _assert_the_next_rebuild_publishes(site):
    done = run_tool(site, ["--json", *site.rebuild_args(APP)], env={"FAKE_EB_PAYLOAD": "new"})
    assert done.returncode == 0, done.stderr
    assert site.payload(APP) == "new"


def test_a_file_where_the_generation_directory_goes_ends_the_run_failed_and_resume_publishes_nothing(
    site, tmp_path
):
    blocker = site.software / ".eb-staged-rebuild"
    blocker.write_text("not a directory\n")
    eb_log = tmp_path / "eb-args.jsonl"
    before = site.snapshot()

    done = run_tool(
        site, site.rebuild_args(APP, extra=("--run-id", "run1")), env={"FAKE_EB_ARGS_LOG": eb_log}
    )

    assert refusal_line(done) == f"eb-staged-rebuild: {blocker} is not a directory"
    assert site.snapshot() == before, "the live trees and the file in the way are as they were"
    journal = read_journal(site.state_root, "run1")
    assert (journal["state"], journal["refused"]) == ("failed", True)
    assert not eb_log.exists()
    _assert_resume_publishes_nothing(site, "run1", eb_log)
    assert site.payload(APP) == "old"
    blocker.unlink()
    _assert_the_next_rebuild_publishes(site)


def test_a_failed_build_ends_the_run_failed_and_resume_does_not_build_it_again(site, tmp_path):
    eb_log = tmp_path / "eb-args.jsonl"
    before = site.snapshot()

    done = run_tool(site, site.rebuild_args(APP, extra=("--run-id", "run1")), env={"FAKE_EB_FAIL": "1"})

    assert done.returncode == 2, done.stderr
    assert site.snapshot() == before
    assert read_journal(site.state_root, "run1")["state"] == "failed"
    _assert_resume_publishes_nothing(site, "run1", eb_log)
    _assert_the_next_rebuild_publishes(site)


# The child: the state root on a tmpfs of 64 KiB in its own mount namespace. The first
# journal fits; the live-change record of a live install of 3000 files does not (ENOSPC).
DISK_FULL = r"""
import json, os, subprocess, sys
commands = json.loads(os.environ["COMMANDS"])
results = []
for command in commands:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    results.append({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr})
state_root = os.environ["STATE_ROOT"]
with open(os.path.join(state_root, "runs", "run1", "journal.json")) as handle:
    journal = json.load(handle)
print(json.dumps({"results": results, "state": journal["state"], "refused": journal.get("refused"),
                  "runs": sorted(os.listdir(os.path.join(state_root, "runs")))}))
"""


def test_enospc_at_the_live_change_record_ends_the_run_failed_and_resume_publishes_nothing(site, tmp_path):
    shared = site.live(APP) / "share"
    shared.mkdir()
    for index in range(3000):
        (shared / f"file-{index:04d}.txt").write_text(f"{index}\n")
    site.state_root.mkdir()
    eb_log = tmp_path / "eb-args.jsonl"
    before = site.snapshot()
    commands = [
        tool_command(site.state_root, *site.rebuild_args(APP, extra=("--run-id", "run1"))),
        tool_command(site.state_root, "--json", "resume"),
    ]
    env = tool_env(site, {"FAKE_EB_ARGS_LOG": eb_log})

    done = subprocess.run(
        in_private_mounts(
            'mount -t tmpfs -o size=64k,mode=0700 none "$STATE_ROOT" && exec "$PYTHON" -c "$CODE"'
        ),
        env=dict(
            env,
            STATE_ROOT=str(site.state_root),
            PYTHON=sys.executable,
            CODE=DISK_FULL,
            COMMANDS=json.dumps(commands),
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rebuild, resume = report["results"]
    assert refusal_line(subprocess.CompletedProcess([], rebuild["rc"], rebuild["stdout"], rebuild["stderr"]))
    assert "No space left on device" in rebuild["stderr"]
    assert (report["state"], report["refused"]) == ("failed", True)
    assert report["runs"] == ["run1"], "no hidden leftover of the run's creation"
    assert resume["rc"] == 0, resume["stderr"]
    (run,) = json.loads(resume["stdout"])["runs"]
    assert (run["state"], run["changed"], run["actions"]) == ("failed", False, [])
    assert site.snapshot() == before
    assert not eb_log.exists()


# --- leftovers of a crash between a run directory and its journal -------------------------


@pytest.fixture(params=["journal-less-run-dir", "hidden-run-being-created"])
def leftover(request, site):
    """A published run, then what a crash at a run's creation left beside it."""
    done = run_tool(site, ["--json", *site.rebuild_args(APP, extra=("--run-id", "first"))])
    assert done.returncode == 0, done.stderr
    runs = site.state_root / "runs"
    if request.param == "journal-less-run-dir":
        path = runs / "20261201T000000Z-0ld001"  # an earlier release: mkdir, then the crash
        path.mkdir(mode=0o700)
    else:
        path = runs / ".creating-5f1e2d3c"  # this release: the crash before the rename
        path.mkdir(mode=0o700)
        (path / "journal.json").write_text('{"schema": 2, "ki')  # torn: it is never read
    return request.param, path


def test_status_lists_a_journal_less_run_and_a_creation_s_leftover_beside_the_runs(site, leftover):
    kind, path = leftover

    done = run_tool(site, ["--json", "status"])

    result = _json(done)
    assert [run["run_id"] for run in result["runs"]] == ["first"]
    assert done.returncode == 1, "a leftover is a warning"
    (entry,) = result["incomplete"]
    assert entry["path"] == str(path)
    if kind == "journal-less-run-dir":
        assert entry["kind"] == "incomplete"
        assert "without a journal" in entry["why"]
    else:
        assert (entry["kind"], entry["run_id"]) == ("leftover", None)
        assert "creation" in entry["why"]
    assert "remove it by hand" in entry["why"]


def test_resume_gc_and_rebuild_work_beside_a_leftover(site, leftover):
    _kind, path = leftover

    resumed = run_tool(site, ["--json", "resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert _json(resumed)["changed"] is False

    collected = run_tool(site, ["--json", "gc"])
    report = _json(collected)
    assert [entry["path"] for entry in report["incomplete"]] == [str(path)]

    rebuilt = run_tool(site, ["--json", *site.rebuild_args(APP)], env={"FAKE_EB_PAYLOAD": "newer"})
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert site.payload(APP) == "newer"
    assert path.is_dir(), "a leftover is reported, never removed by the tool"


def test_status_and_resume_of_a_journal_less_run_by_its_id_say_what_it_is(site):
    path = site.state_root / "runs" / "20261201T000000Z-0ld001"
    path.mkdir(parents=True, mode=0o700)

    for command in (["status", path.name], ["resume", path.name]):
        line = refusal_line(run_tool(site, command))

        assert "without a journal" in line
        assert str(path) in line
    assert os.listdir(path) == []


def test_a_new_run_leaves_no_hidden_directory_in_runs(site):
    done = run_tool(site, ["--json", *site.rebuild_args(APP, extra=("--run-id", "run1"))])

    assert done.returncode == 0, done.stderr
    assert os.listdir(site.state_root / "runs") == ["run1"]
    assert oct(os.lstat(site.state_root / "runs" / "run1").st_mode & 0o777) == "0o700"
