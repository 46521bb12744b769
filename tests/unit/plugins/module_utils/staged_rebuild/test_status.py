"""``status``: the list of runs (``journal.summary``), one run in detail, and the refusals of a
broken state root, through ``commands.show_status`` as the command line and the modules call it."""

from __future__ import annotations

import json

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import commands, paths
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState, StepKind
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import (
    APP,
    publish_journal,
    retire_journal,
)


@pytest.fixture
def state_root(tmp_path):
    (tmp_path / "state" / "runs").mkdir(parents=True)
    return tmp_path / "state"


def _publish(state_root, run_id, created, sibling_exists=True, ledger=False):
    trees = paths.Trees(str(state_root.parent / "software"), str(state_root.parent / "modules"))
    stable = state_root.parent / "software" / "TinyApp" / "1.0"
    stable.mkdir(parents=True, exist_ok=True)
    if sibling_exists:
        (stable.parent / f".1.0.{run_id}").mkdir()
    extra = {"ledger_config": str(state_root.parent / "ledger-config.json")} if ledger else {}
    journal = publish_journal(state_root / "runs", run_id, trees, state=RunState.PUBLISHED, **extra)
    journal.run.created = created
    with journal.step(StepKind.SWAP, journal.modules[0]):
        pass
    return journal


def _retire(state_root, run_id, created):
    journal = retire_journal(
        state_root / "runs",
        run_id,
        module_file="/apps/modules/all/Moved/1.0.lua",
        software_dir="/apps/software/Moved/1.0",
        reason="on CVMFS",
    )
    journal.run.created = created
    journal.save()
    return journal


def _status(state_root, run_id=None):
    return commands.show_status(str(state_root), run_id)


def test_status_of_a_state_root_with_an_empty_runs_directory_is_an_empty_list(state_root):
    assert _status(state_root) == {"runs": [], "incomplete": []}


def test_status_of_a_state_root_without_runs_is_refused(tmp_path):
    with pytest.raises(errors.UsageError) as raised:
        _status(tmp_path)

    assert str(raised.value) == f"state root {tmp_path} has no runs (nothing was ever published with it)"


def test_status_lists_a_publish_run_with_its_modules(state_root):
    journal = _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")

    (run,) = _status(state_root)["runs"]

    software = state_root.parent / "software"
    assert run == {
        "run_id": "run1",
        "kind": "publish",
        "schema": 2,
        "state": "published",
        "created": "2026-01-01T00:00:00+00:00",
        "state_since": journal.run.state_since,
        "job": None,
        "error": None,
        "cancelled": None,
        "modules": [
            {
                "module": APP,
                "stable_path": str(software / "TinyApp" / "1.0"),
                "retired_path": str(software / "TinyApp" / ".1.0.run1"),
                "retired_path_exists": True,
            }
        ],
    }


def test_status_shows_when_the_state_changed_as_the_creation_for_a_journal_without_it(state_root):
    journal = _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    journal.run.state_since = None
    journal.save()

    (run,) = _status(state_root)["runs"]

    assert run["state_since"] == "2026-01-01T00:00:00+00:00"


def test_status_reports_a_retired_path_that_is_gone(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00", sibling_exists=False)

    (run,) = _status(state_root)["runs"]

    assert run["modules"][0]["retired_path_exists"] is False


def test_status_shows_the_ledger_schema(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00", ledger=True)

    assert _status(state_root)["runs"][0]["schema"] == 4


def test_status_lists_a_retire_run_with_its_module_file_and_reason(state_root):
    _retire(state_root, "retire-1", "2026-01-01T00:00:00+00:00")

    (run,) = _status(state_root)["runs"]

    assert "modules" not in run
    assert {key: run[key] for key in ("kind", "module_file", "retired_to", "software_dir", "reason")} == {
        "kind": "retire",
        "module_file": "/apps/modules/all/Moved/1.0.lua",
        "retired_to": f"{state_root}/retired/1/apps/modules/all/Moved/1.0.lua",
        "software_dir": "/apps/software/Moved/1.0",
        "reason": "on CVMFS",
    }


def test_status_lists_runs_oldest_first_without_their_steps(state_root):
    _publish(state_root, "zz", "2026-01-01T00:00:00+00:00")
    _retire(state_root, "retire-1", "2026-01-02T00:00:00+00:00")
    _publish(state_root, "aa", "2026-01-03T00:00:00+00:00")

    runs = _status(state_root)["runs"]

    assert [run["run_id"] for run in runs] == ["zz", "retire-1", "aa"]
    assert all("steps" not in run and "journal" not in run for run in runs)


def test_status_of_one_run_shows_its_whole_record_its_steps_and_its_journal(state_root):
    journal = _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    _publish(state_root, "run2", "2026-01-02T00:00:00+00:00")

    run = _status(state_root, "run1")["run"]

    assert run["journal"] == journal.path
    assert [(step["step"], step["status"]) for step in run["steps"]] == [("swap TinyApp/1.0", "done")]
    assert run["modules"][0]["retired_path_exists"] is True
    # Everything else is the journal's record as it is stored.
    with open(journal.path, encoding="utf-8") as handle:
        stored = json.load(handle)
    del run["journal"], run["modules"][0]["retired_path_exists"]
    assert run == stored


def test_status_of_a_missing_run_is_refused(state_root):
    with pytest.raises(errors.UsageError, match="no run nope under"):
        _status(state_root, "nope")


def test_one_unreadable_journal_stops_the_listing(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    (state_root / "runs" / "broken").mkdir()
    (state_root / "runs" / "broken" / "journal.json").write_text('{"schema": 1, "kind": "publish"}')

    with pytest.raises(errors.JournalError, match="schema 1 is a generation-pointer journal"):
        _status(state_root)


def test_status_of_one_run_does_not_read_the_others(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    (state_root / "runs" / "broken").mkdir()
    (state_root / "runs" / "broken" / "journal.json").write_text("")

    assert _status(state_root, "run1")["run"]["state"] == "published"


def test_status_changes_nothing_on_disk(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    before = {
        path: (path.stat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in sorted(state_root.parent.rglob("*"))
    }

    _status(state_root)
    _status(state_root, "run1")

    after = {
        path: (path.stat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in sorted(state_root.parent.rglob("*"))
    }
    assert after == before
