"""``status``: the list of runs, one run in detail, and the refusals of a broken state root."""

from __future__ import annotations

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import status


@pytest.fixture
def state_root(tmp_path):
    (tmp_path / "state" / "runs").mkdir(parents=True)
    return tmp_path / "state"


def _publish(state_root, run_id, created, sibling_exists=True, schema=2):
    software = state_root.parent / "software"
    stable = software / "TinyApp" / "1.0"
    sibling = software / "TinyApp" / f".1.0.{run_id}"
    stable.mkdir(parents=True, exist_ok=True)
    if sibling_exists:
        sibling.mkdir()
    journal = journals.Journal.create(
        str(state_root / "runs"), run_id, kind="publish", state="published", schema=schema, created=created
    )
    journal.modules.append(
        {
            "module": "TinyApp/1.0",
            "stable_path": str(stable),
            "retired_path": str(sibling),
            "module_file": "/m",
        }
    )
    journal.finish(journal.start("swap TinyApp/1.0"), method="exchange")
    return journal


def _retire(state_root, run_id, created):
    return journals.Journal.create(
        str(state_root / "runs"),
        run_id,
        kind="retire",
        state="retired",
        created=created,
        module_file="/apps/modules/all/Moved/1.0.lua",
        retired_to=f"{state_root}/retired/stamp/apps/modules/all/Moved/1.0.lua",
        software_dir="/apps/software/Moved/1.0",
        reason="on CVMFS",
        module_sha256="00" * 32,
    )


def test_status_of_a_state_root_without_runs_is_an_empty_list(tmp_path):
    assert status.status(str(tmp_path)) == {"runs": []}


def test_status_lists_a_publish_run_with_its_modules(state_root):
    journal = _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")

    (run,) = status.status(str(state_root))["runs"]

    software = state_root.parent / "software"
    assert run == {
        "run_id": "run1",
        "kind": "publish",
        "schema": 2,
        "state": "published",
        "created": "2026-01-01T00:00:00+00:00",
        "state_since": journal.data["state_since"],
        "modules": [
            {
                "module": "TinyApp/1.0",
                "stable_path": str(software / "TinyApp" / "1.0"),
                "retired_path": str(software / "TinyApp" / ".1.0.run1"),
                "retired_path_exists": True,
            }
        ],
    }


def test_status_reports_a_retired_path_that_is_gone(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00", sibling_exists=False)

    (run,) = status.status(str(state_root))["runs"]

    assert run["modules"][0]["retired_path_exists"] is False


def test_status_shows_the_ledger_schema(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00", schema=4)

    assert status.status(str(state_root))["runs"][0]["schema"] == 4


def test_status_lists_a_retire_run_with_its_module_file_and_reason(state_root):
    _retire(state_root, "retire-1", "2026-01-01T00:00:00+00:00")

    (run,) = status.status(str(state_root))["runs"]

    assert "modules" not in run
    assert {key: run[key] for key in ("kind", "module_file", "retired_to", "software_dir", "reason")} == {
        "kind": "retire",
        "module_file": "/apps/modules/all/Moved/1.0.lua",
        "retired_to": f"{state_root}/retired/stamp/apps/modules/all/Moved/1.0.lua",
        "software_dir": "/apps/software/Moved/1.0",
        "reason": "on CVMFS",
    }


def test_status_lists_runs_oldest_first_without_their_steps(state_root):
    _publish(state_root, "zz", "2026-01-01T00:00:00+00:00")
    _retire(state_root, "retire-1", "2026-01-02T00:00:00+00:00")
    _publish(state_root, "aa", "2026-01-03T00:00:00+00:00")

    runs = status.status(str(state_root))["runs"]

    assert [run["run_id"] for run in runs] == ["zz", "retire-1", "aa"]
    assert all("steps" not in run and "journal" not in run for run in runs)


def test_status_of_one_run_adds_its_steps_and_its_journal(state_root):
    journal = _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    _publish(state_root, "run2", "2026-01-02T00:00:00+00:00")

    result = status.status(str(state_root), "run1")

    run = result["run"]
    assert run["run_id"] == "run1"
    assert run["journal"] == journal.path
    assert [(step["step"], step["status"], step["method"]) for step in run["steps"]] == [
        ("swap TinyApp/1.0", "done", "exchange")
    ]


def test_status_of_a_missing_run_is_refused(state_root):
    with pytest.raises(errors.UsageError, match="no run nope under"):
        status.status(str(state_root), "nope")


def test_one_unreadable_journal_stops_the_listing(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    (state_root / "runs" / "broken").mkdir()
    (state_root / "runs" / "broken" / "journal.json").write_text('{"schema": 1, "kind": "publish"}')

    with pytest.raises(errors.JournalError, match="schema 1 is a generation-pointer journal"):
        status.status(str(state_root))


def test_status_of_one_run_does_not_read_the_others(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    (state_root / "runs" / "broken").mkdir()
    (state_root / "runs" / "broken" / "journal.json").write_text("")

    assert status.status(str(state_root), "run1")["run"]["state"] == "published"


def test_status_changes_nothing_on_disk(state_root):
    _publish(state_root, "run1", "2026-01-01T00:00:00+00:00")
    before = {
        path: (path.stat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in sorted(state_root.parent.rglob("*"))
    }

    status.status(str(state_root))
    status.status(str(state_root), "run1")

    after = {
        path: (path.stat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in sorted(state_root.parent.rglob("*"))
    }
    assert after == before
