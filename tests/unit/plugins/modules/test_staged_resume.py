"""The staged_resume module in-process, on runs that the real command was killed in.

An interrupted run is made the way a crash makes one: ``eb-staged-rebuild`` runs as its own
process (the test builder as ``eb``) with ``EB_STAGED_REBUILD_CRASH_AT=<step>``, which makes it
SIGKILL itself right after journaling that step as started. The module then runs in this
process, its arguments patched in and its JSON read back.
"""

from __future__ import annotations

import json
import signal

import pytest

from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild, staged_resume
from tests.support.module_runner import APP, assert_failed_with, run_module, run_on_site
from tests.support.staged import FAKE_EB, snapshot

CRASH_AT = "EB_STAGED_REBUILD_CRASH_AT"


def published(site) -> str:
    done = site.run("--json", *site.rebuild_args(APP))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run_id"]


def crashed(site, step) -> str:
    """The run id of a rebuild killed right after journaling ``step`` as started."""
    done = site.rebuild(APP, env={CRASH_AT: step})
    assert done.returncode == -signal.SIGKILL, done.stderr
    (run_dir,) = (site.state_root / "runs").iterdir()
    return run_dir.name


def everything(site) -> dict:
    """The live trees, the journals and the retired files: equal means nothing changed.

    Not the lock file: taking the lock writes the holder into it and releasing it empties it,
    which clears what a killed run left there.
    """
    return snapshot(site.software, site.modules, site.state_root / "runs", site.state_root / "retired")


def resume(capsys, site, *, check_mode=False, **options) -> dict:
    return run_on_site(capsys, staged_resume, site, check_mode=check_mode, **options)


# Nothing to resume


@pytest.mark.parametrize("check_mode", [False, True])
def test_nothing_interrupted_reports_no_change(site, capsys, check_mode):
    run_id = published(site)
    before = everything(site)

    result = resume(capsys, site, check_mode=check_mode)

    assert result["changed"] is False
    if check_mode:
        assert result["interrupted"] == []
    else:
        assert result["runs"] == [{"run_id": run_id, "state": "published", "changed": False, "actions": []}]
    assert everything(site) == before


# An interrupted publish


def test_check_mode_reports_the_interrupted_run_and_changes_nothing(site, capsys):
    run_id = crashed(site, f"swap {APP}")
    before = everything(site)

    result = resume(capsys, site, check_mode=True)

    assert result["changed"] is True
    assert result["interrupted"] == [run_id]
    assert everything(site) == before


@pytest.mark.parametrize("step", [f"swap {APP}", f"module {APP}"])
def test_resume_returns_an_interrupted_publish_to_the_old_tree(site, capsys, step):
    old_inode = site.live(APP).stat().st_ino
    old_module = site.module_file(APP).read_bytes()
    run_id = crashed(site, step)

    result = resume(capsys, site)

    assert result["changed"] is True
    (run,) = result["runs"]
    assert (run["run_id"], run["state"], run["changed"]) == (run_id, "failed", True)
    assert site.live(APP).stat().st_ino == old_inode
    assert site.payload(APP) == "old"
    assert site.module_file(APP).read_bytes() == old_module


def test_a_swapped_module_is_swapped_back(site, capsys):
    crashed(site, f"module {APP}")

    result = resume(capsys, site)

    assert f"{APP}: old tree back at {site.live(APP)}" in result["runs"][0]["actions"]


def test_the_second_resume_changes_nothing(site, capsys):
    run_id = crashed(site, f"swap {APP}")
    resume(capsys, site)
    after_first = everything(site)

    again = resume(capsys, site)

    assert again["changed"] is False
    assert again["runs"] == [{"run_id": run_id, "state": "failed", "changed": False, "actions": []}]
    assert everything(site) == after_first
    assert resume(capsys, site, check_mode=True)["changed"] is False


def test_run_id_resumes_that_run(site, capsys):
    run_id = crashed(site, f"swap {APP}")

    result = resume(capsys, site, run_id=run_id)

    assert result["changed"] is True
    assert [run["run_id"] for run in result["runs"]] == [run_id]


def test_a_run_killed_while_building_is_built_again_with_its_progress_returned(site, capsys):
    old_inode = site.live(APP).stat().st_ino
    run_id = crashed(site, "build")

    result = resume(capsys, site)

    (run,) = result["runs"]
    assert (run["run_id"], run["state"], run["actions"]) == (
        run_id,
        "published",
        ["built again and published"],
    )
    assert "== building and installing TinyApp/1.0..." in result["progress"]
    assert site.live(APP).stat().st_ino != old_inode
    assert site.payload(APP) == "new build"


def test_staged_rebuild_is_refused_until_the_run_is_resumed(site, capsys):
    run_id = crashed(site, f"swap {APP}")
    rebuild_args = {
        "state_root": str(site.state_root),
        "installpath": str(site.installpath),
        "modules": [APP],
        "eb_args": ["TinyApp-1.0.eb"],
        "eb": str(FAKE_EB),
        "backend": "installpath",
        "rebuild": "always",
    }

    refused = run_module(capsys, staged_rebuild, rebuild_args)
    resume(capsys, site)
    rebuilt = run_module(capsys, staged_rebuild, rebuild_args)

    assert_failed_with(refused, f"run {run_id} was interrupted; 'eb-staged-rebuild resume' finishes it first")
    assert rebuilt["state"] == "published"


# Refusals: failed, the one-line message, nothing changed


@pytest.mark.parametrize("check_mode", [False, True])
def test_no_state_root_is_refused(site, capsys, check_mode):
    result = run_module(capsys, staged_resume, {}, check_mode=check_mode)

    assert_failed_with(result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT")


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_state_root_without_runs_is_refused(site, capsys, check_mode):
    result = resume(capsys, site, check_mode=check_mode)

    assert_failed_with(
        result, f"state root {site.state_root} has no runs (nothing was ever published with it)"
    )
    assert not site.state_root.exists()


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_run_id_that_is_not_a_plain_name_is_refused(site, capsys, check_mode):
    crashed(site, f"swap {APP}")
    before = everything(site)

    result = resume(capsys, site, run_id="../x", check_mode=check_mode)

    assert_failed_with(result, "run id '../x' is not a plain name ([A-Za-z0-9._-], at most 128)")
    assert everything(site) == before


@pytest.mark.parametrize("check_mode", [False, True])
def test_an_unknown_run_id_is_refused(site, capsys, check_mode):
    crashed(site, f"swap {APP}")
    before = everything(site)

    result = resume(capsys, site, run_id="nope", check_mode=check_mode)

    assert_failed_with(result, f"no run nope under {site.state_root / 'runs'}")
    assert everything(site) == before


def test_the_state_root_comes_from_the_host_s_variable(site, capsys, monkeypatch):
    run_id = crashed(site, f"swap {APP}")
    monkeypatch.setenv("EB_STAGED_REBUILD_STATE_ROOT", str(site.state_root))

    result = run_module(capsys, staged_resume, {})

    assert [(run["run_id"], run["changed"]) for run in result["runs"]] == [(run_id, True)]
