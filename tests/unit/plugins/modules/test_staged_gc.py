"""hpcstack.ops.staged_gc: ``main()`` run with module arguments, its JSON result read back.

The runs are real: a rebuild published by the core with the test builder ``fake-eb`` (the
installpath backend), which leaves the previous tree as the hidden sibling
``software/TinyApp/.1.0.<run_id>``. Interrupted runs are journals written as a crash leaves
them. Snapshots of the live tree and the state root (type, mode, owner, inode and bytes of
every entry) show what changed on disk and what did not.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import settings
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from ansible_collections.hpcstack.ops.plugins.modules import staged_gc
from tests.support.module_runner import APP, assert_failed_with, disk, run_on_site, warnings_of
from tests.support.staged import publish_in_process
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import (
    publish_journal,
    retire_journal,
    trees_of,
)

RUN = "run1"


@pytest.fixture
def published(site):
    """``site`` after one published rebuild of APP: its previous tree is the hidden sibling."""
    publish_in_process(site, APP, RUN)
    return site


def _sibling(site):
    return site.software / "TinyApp" / f".1.0.{RUN}"


def _gc(capsys, site, **args):
    """Run the module; returns its result."""
    return run_on_site(capsys, staged_gc, site, **args)


def _interrupted_rebuild(site, run_id):
    """A rebuild's journal as a crash during the build leaves it."""
    publish_journal(site.state_root / "runs", run_id, trees_of(site.installpath), state=RunState.BUILDING)


def _interrupted_retire(site, stamp):
    """A retire's journal as a crash just before its rename leaves it (as retire writes it)."""
    module_file = site.module_file(APP)
    retire_journal(
        site.state_root / "runs",
        "retire-" + stamp,
        state=RunState.RETIRING,
        module_file=module_file,
        retired_to=site.state_root / "retired" / stamp / str(module_file).lstrip("/"),
        software_dir=site.live(APP),
        reason="now on /cvmfs",
    )


# removing, and a second run


def test_gc_removes_the_previous_tree_once_the_grace_period_is_over(capsys, published):
    sibling = _sibling(published)
    live = os.lstat(published.live(APP)).st_ino

    result = _gc(capsys, published, grace_hours=0)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["removed"] == [{"path": str(sibling), "run_id": RUN}]
    assert not os.path.lexists(sibling)
    assert os.lstat(published.live(APP)).st_ino == live
    assert published.payload(APP) == "new build"


def test_a_second_gc_changes_nothing(capsys, published):
    _gc(capsys, published, grace_hours=0)
    before = disk(published)

    result = _gc(capsys, published, grace_hours=0)

    assert "failed" not in result
    assert result["changed"] is False
    assert result["removed"] == []
    assert disk(published) == before


def test_the_default_grace_period_keeps_a_fresh_previous_tree(capsys, published):
    before = disk(published)

    result = _gc(capsys, published)

    assert "failed" not in result
    assert result["changed"] is False
    assert result["kept"] == [{"path": str(_sibling(published)), "run_id": RUN, "why": "grace period"}]
    assert result["grace_hours"] == 144.0
    assert disk(published) == before


def test_the_grace_period_can_come_from_the_hosts_environment(capsys, published, monkeypatch):
    monkeypatch.setenv(settings.GRACE_HOURS_VARIABLE, "0")

    result = _gc(capsys, published)

    assert "failed" not in result
    assert result["removed"] == [{"path": str(_sibling(published)), "run_id": RUN}]
    assert result["grace_hours"] == 0.0


def test_the_grace_hours_option_beats_the_hosts_environment(capsys, published, monkeypatch):
    monkeypatch.setenv(settings.GRACE_HOURS_VARIABLE, "0")

    result = _gc(capsys, published, grace_hours=1)

    assert "failed" not in result
    assert result["removed"] == []
    assert _sibling(published).is_dir()


def test_the_state_root_can_come_from_the_hosts_environment(capsys, published, monkeypatch):
    monkeypatch.setenv(settings.STATE_ROOT_VARIABLE, str(published.state_root))

    result = _gc(capsys, published, state_root=None, grace_hours=0)

    assert "failed" not in result
    assert result["changed"] is True


# check mode


def test_check_mode_lists_what_it_would_remove_and_removes_nothing(capsys, published):
    before = disk(published)

    result = _gc(capsys, published, grace_hours=0, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["dry_run"] is True
    assert result["removed"] == [{"path": str(_sibling(published)), "run_id": RUN}]
    assert disk(published) == before


def test_check_mode_with_nothing_due_reports_no_change(capsys, published):
    before = disk(published)

    result = _gc(capsys, published, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is False
    assert disk(published) == before


# interrupted runs become warnings


def test_each_interrupted_run_becomes_a_warning(capsys, published):
    _interrupted_rebuild(published, "run2")
    _interrupted_retire(published, "20260101T000000000000Z")

    result = _gc(capsys, published)

    assert "failed" not in result
    assert [run["run_id"] for run in result["interrupted"]] == ["run2", "retire-20260101T000000000000Z"]
    assert warnings_of(result) == [
        "run run2 (building) is interrupted: 'eb-staged-rebuild resume'",
        "run retire-20260101T000000000000Z (retiring) is interrupted: "
        "'eb-staged-rebuild rollback retire-20260101T000000000000Z'",
    ]


def test_without_interrupted_runs_there_is_no_warning(capsys, published):
    result = _gc(capsys, published)

    assert "failed" not in result
    assert result["interrupted"] == []
    assert warnings_of(result) == []


# errors: failed, the core's one line, nothing changed


def test_no_state_root_and_no_variable_fails(capsys, published):
    before = disk(published)

    result = _gc(capsys, published, state_root=None)

    assert_failed_with(result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT")
    assert disk(published) == before


def test_a_state_root_without_runs_fails(capsys, site):
    result = _gc(capsys, site)

    assert_failed_with(
        result, f"state root {site.state_root} has no runs (nothing was ever published with it)"
    )
    assert not site.state_root.exists()


def test_negative_grace_hours_fail(capsys, published):
    before = disk(published)

    result = _gc(capsys, published, grace_hours=-1)

    assert_failed_with(result, "grace_hours must not be negative")
    assert disk(published) == before


def test_grace_hours_from_the_environment_that_are_not_a_number_fail(capsys, published, monkeypatch):
    monkeypatch.setenv(settings.GRACE_HOURS_VARIABLE, "soon")
    before = disk(published)

    result = _gc(capsys, published)

    assert_failed_with(result, "EB_STAGED_REBUILD_GRACE_HOURS='soon' is not a number", error="usage")
    assert disk(published) == before


def test_a_symlinked_state_root_fails(capsys, published, tmp_path):
    link = tmp_path / "state-link"
    link.symlink_to(published.state_root)
    before = disk(published)

    result = _gc(capsys, published, state_root=str(link), grace_hours=0)

    assert_failed_with(result, f"{link} is a symbolic link (in {link}); symlink components are refused")
    assert disk(published) == before


def test_an_unreadable_journal_fails_with_its_path(capsys, published):
    journal = published.state_root / "runs" / "run2" / "journal.json"
    journal.parent.mkdir()
    journal.write_text("{")
    before = disk(published)

    result = _gc(capsys, published, grace_hours=0)

    assert_failed_with(result, f"journal {journal}: truncated or not JSON (1 bytes)", error="journal")
    assert disk(published) == before


def test_a_negative_lock_timeout_fails(capsys, published):
    before = disk(published)

    result = _gc(capsys, published, lock_timeout=-1)

    assert_failed_with(result, "lock_timeout must be 0 or more seconds, not -1.0", error="usage")
    assert disk(published) == before
