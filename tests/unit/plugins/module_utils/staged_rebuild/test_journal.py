"""The run journal: creation, the refusals of ``load``, write-through steps and the crash hook.

Journals are real files under ``tmp_path``; the crash hook is exercised in a forked child
that really dies by SIGKILL, and the parent reads what the child left on disk.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import stat

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals

STEP = "swap TinyApp/1.0"


@pytest.fixture
def runs(tmp_path):
    path = tmp_path / "runs"
    path.mkdir()
    return path


def _create(runs, run_id="run1", **fields):
    return journals.Journal.create(str(runs), run_id, kind="publish", state="building", **fields)


def _on_disk(journal):
    with open(journal.path, encoding="utf-8") as handle:
        return json.load(handle)


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _valid(**changes):
    data = {"schema": 2, "kind": "publish", "run_id": "run1", "state": "building", "modules": [], "steps": []}
    data.update(changes)
    return data


# create


def test_create_makes_the_run_directory_private_and_writes_the_first_journal(runs):
    journal = _create(runs)

    assert journal.path == str(runs / "run1" / "journal.json")
    assert stat.S_IMODE(os.lstat(runs / "run1").st_mode) == 0o700
    data = _on_disk(journal)
    assert data["schema"] == journals.SCHEMA_SWAP
    assert (data["kind"], data["run_id"], data["state"]) == ("publish", "run1", "building")
    assert (data["modules"], data["steps"]) == ([], [])
    assert data["created"] == data["state_since"]


def test_create_stores_extra_fields_and_the_ledger_schema(runs):
    journal = _create(runs, schema=journals.SCHEMA_SWAP_LEDGER, trees={"software": "/s", "modules": "/m"})

    data = _on_disk(journal)
    assert data["schema"] == 4
    assert data["trees"] == {"software": "/s", "modules": "/m"}


def test_create_refuses_an_existing_run_id_and_keeps_its_journal(runs):
    first = _create(runs)
    first.start("build")
    before = (runs / "run1" / "journal.json").read_bytes()

    with pytest.raises(errors.UsageError, match=r"run run1 exists already .*runs/run1.*--run-id"):
        _create(runs)

    assert (runs / "run1" / "journal.json").read_bytes() == before


def test_create_refuses_a_run_id_whose_directory_exists_without_a_journal(runs):
    (runs / "run1").mkdir()

    with pytest.raises(errors.UsageError, match="exists already"):
        _create(runs)

    assert os.listdir(runs / "run1") == []


# load


def test_load_reads_back_what_create_wrote(runs):
    journal = _create(runs, trees={"software": "/s", "modules": "/m"})

    loaded = journals.Journal.load(journal.path)

    assert loaded.data == journal.data
    assert (loaded.run_id, loaded.state, loaded.modules) == ("run1", "building", [])
    assert loaded.run_dir == str(runs / "run1")


@pytest.mark.parametrize("schema", [2, 4])
def test_load_accepts_the_directory_swap_schemas(tmp_path, schema):
    path = _write(tmp_path / "journal.json", _valid(schema=schema))

    assert journals.Journal.load(str(path)).data["schema"] == schema


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (1, "schema 1 is a generation-pointer journal (live path as a symlink to a generation)"),
        (3, "schema 3 is a generation-pointer journal with a ledger"),
    ],
)
def test_load_refuses_the_generation_pointer_schemas_and_says_why(tmp_path, schema, why):
    path = _write(tmp_path / "journal.json", _valid(schema=schema))

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    message = str(raised.value)
    assert str(path) in message
    assert why in message
    assert "only swaps directories (schemas 2 and 4)" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "schema", [0, 5, 99, "2", None, [2], True], ids=["0", "5", "99", "string", "null", "list", "true"]
)
def test_load_refuses_an_unknown_schema_naming_it(tmp_path, schema):
    path = _write(tmp_path / "journal.json", _valid(schema=schema))

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert f"{path} has unknown schema {schema!r} (known: 2, 4)" in str(raised.value)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b'{"schema": 2, "kind": "publish", "run_id": "ru',
        b"\xff\xfe not utf-8",
        b"{'schema': 2}",
    ],
    ids=["empty", "cut-off", "not-utf8", "python-literal"],
)
def test_load_refuses_a_truncated_or_non_json_journal_with_its_size(tmp_path, raw):
    path = _write(tmp_path / "journal.json", raw)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path} is truncated or not JSON ({len(raw)} bytes)"


@pytest.mark.parametrize("field", ["kind", "run_id", "state", "modules", "steps"])
def test_load_refuses_a_journal_missing_a_field_naming_it(tmp_path, field):
    data = _valid()
    del data[field]
    path = _write(tmp_path / "journal.json", data)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path} lacks the field {field!r}"


def test_load_refuses_a_journal_without_a_schema(tmp_path):
    data = _valid()
    del data["schema"]
    path = _write(tmp_path / "journal.json", data)

    with pytest.raises(errors.JournalError, match="has no schema field"):
        journals.Journal.load(str(path))


@pytest.mark.parametrize("document", [[1, 2], "schema", 2, None], ids=["list", "string", "number", "null"])
def test_load_refuses_a_json_document_that_is_not_an_object(tmp_path, document):
    path = _write(tmp_path / "journal.json", document)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(path) in str(raised.value)


def test_load_refuses_a_missing_journal_naming_it(tmp_path):
    path = tmp_path / "runs" / "run1" / "journal.json"

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"cannot read journal {path}: No such file or directory"


def test_load_refuses_a_directory_in_place_of_the_journal(tmp_path):
    path = tmp_path / "journal.json"
    path.mkdir()

    with pytest.raises(errors.JournalError, match=f"cannot read journal {path}"):
        journals.Journal.load(str(path))


# start, finish, set_state


def test_start_is_on_disk_before_it_returns(runs):
    journal = _create(runs)

    entry = journal.start(STEP, method="exchange")

    steps = journals.Journal.load(journal.path).data["steps"]
    assert steps == [entry]
    assert (entry["step"], entry["status"], entry["method"]) == (STEP, "started", "exchange")
    datetime.datetime.fromisoformat(entry["at"])  # a real timestamp, not a placeholder


def test_finish_marks_the_step_done_on_disk_with_its_fields(runs):
    journal = _create(runs)
    first = journal.start("marker TinyApp/1.0")
    journal.finish(first)
    second = journal.start(STEP)

    journal.finish(second, method="fallback")

    steps = journals.Journal.load(journal.path).data["steps"]
    assert [(s["step"], s["status"]) for s in steps] == [("marker TinyApp/1.0", "done"), (STEP, "done")]
    assert steps[1]["method"] == "fallback"
    assert journal.step_names() == ["marker TinyApp/1.0", STEP]


def test_an_unfinished_step_stays_started_at_the_end_of_the_list(runs):
    journal = _create(runs)
    journal.finish(journal.start("build"))

    journal.start(STEP)

    steps = journals.Journal.load(journal.path).data["steps"]
    assert [(s["step"], s["status"]) for s in steps] == [("build", "done"), (STEP, "started")]


def test_set_state_records_the_state_and_when_it_changed(runs):
    journal = _create(runs)
    journal.data["state_since"] = "2000-01-01T00:00:00+00:00"
    before = datetime.datetime.now(datetime.timezone.utc)

    journal.set_state("planning")

    data = _on_disk(journal)
    assert data["state"] == "planning"
    since = datetime.datetime.fromisoformat(data["state_since"])
    assert since >= before
    assert since <= datetime.datetime.fromisoformat(data["updated"])


def test_saves_without_a_state_change_keep_state_since(runs):
    journal = _create(runs)
    journal.data["state_since"] = "2000-01-01T00:00:00+00:00"
    journal.save()

    journal.finish(journal.start("build"))

    data = _on_disk(journal)
    assert data["state_since"] == "2000-01-01T00:00:00+00:00"
    assert data["updated"] != data["state_since"]


def test_save_leaves_no_temporary_file_beside_the_journal(runs):
    journal = _create(runs)

    for step in ("a", "b", "c"):
        journal.finish(journal.start(step))

    assert os.listdir(journal.run_dir) == ["journal.json"]


# the crash hook


def _in_forked_child(body, env):
    """Run ``body()`` in a forked child with ``env`` added; return the child's wait status.

    The child leaves with ``os._exit`` so that nothing of pytest runs twice.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.environ.update(env)
            body()
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    return status


def _steps_then_marker(runs, marker):
    def body():
        journal = _create(runs)
        journal.finish(journal.start("marker TinyApp/1.0"))
        journal.start(STEP)
        marker.write_text("the child went on after the step\n")

    return body


def test_the_crash_hook_kills_the_process_right_after_the_step_is_on_disk(runs, tmp_path):
    marker = tmp_path / "went-on"

    status = _in_forked_child(_steps_then_marker(runs, marker), {journals.CRASH_HOOK: STEP})

    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert not marker.exists()
    steps = journals.Journal.load(str(runs / "run1" / "journal.json")).data["steps"]
    assert [(s["step"], s["status"]) for s in steps] == [("marker TinyApp/1.0", "done"), (STEP, "started")]


def test_the_crash_hook_ignores_other_steps(runs, tmp_path):
    marker = tmp_path / "went-on"

    status = _in_forked_child(_steps_then_marker(runs, marker), {journals.CRASH_HOOK: "swap Other/2.0"})

    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0
    assert marker.exists()


# run_journals and find


def _created(runs, run_id, created):
    return _create(runs, run_id, created=created)


def test_run_journals_lists_runs_by_creation_time_not_by_name(runs, tmp_path):
    _created(runs, "zz-first", "2026-01-01T00:00:00+00:00")
    _created(runs, "aa-second", "2026-01-01T00:00:00.000001+00:00")
    _created(runs, "mm-third", "2026-01-02T00:00:00+00:00")

    listed = journals.run_journals(str(tmp_path))

    assert [journal.run_id for journal in listed] == ["zz-first", "aa-second", "mm-third"]


def test_run_journals_orders_runs_created_at_the_same_time_by_run_id(runs, tmp_path):
    _created(runs, "b", "2026-01-01T00:00:00+00:00")
    _created(runs, "a", "2026-01-01T00:00:00+00:00")

    assert [journal.run_id for journal in journals.run_journals(str(tmp_path))] == ["a", "b"]


def test_run_journals_of_a_state_root_without_runs_is_empty(tmp_path):
    assert journals.run_journals(str(tmp_path)) == []


def test_run_journals_ignores_files_beside_the_run_directories(runs, tmp_path):
    _create(runs, "run1")
    (runs / "README").write_text("not a run\n")

    assert [journal.run_id for journal in journals.run_journals(str(tmp_path))] == ["run1"]


def test_run_journals_stops_on_one_unreadable_journal(runs, tmp_path):
    _create(runs, "good-1")
    _write(runs / "broken" / "journal.json", b'{"schema": 2, "ki')
    _create(runs, "good-2")

    with pytest.raises(errors.JournalError, match=r"broken/journal\.json is truncated"):
        journals.run_journals(str(tmp_path))


def test_run_journals_stops_on_a_run_directory_without_a_journal(runs, tmp_path):
    _create(runs, "good")
    (runs / "empty").mkdir()

    with pytest.raises(errors.JournalError, match=r"cannot read journal .*empty/journal\.json"):
        journals.run_journals(str(tmp_path))


def test_find_loads_the_named_run(runs, tmp_path):
    _create(runs, "run1")
    _create(runs, "run2")

    assert journals.find(str(tmp_path), "run2").run_id == "run2"


def test_find_refuses_a_missing_run_naming_the_runs_directory(runs, tmp_path):
    with pytest.raises(errors.UsageError) as raised:
        journals.find(str(tmp_path), "nope")

    assert str(raised.value) == f"no run nope under {runs}"


def test_find_refuses_a_run_whose_journal_is_unreadable(runs, tmp_path):
    (runs / "run1").mkdir()

    with pytest.raises(errors.JournalError, match="cannot read journal"):
        journals.find(str(tmp_path), "run1")


def test_find_refuses_a_run_id_that_leaves_the_runs_directory(runs, tmp_path):
    # A journal that is not under runs/ is not a run of this state root, even when the
    # path the run id spells happens to hold one.
    _create(tmp_path, "outside")

    with pytest.raises(errors.UsageError):
        journals.find(str(tmp_path), "../outside")
