"""The run journal: creation, the typed load and each of its refusals, the step names, the step
engine (write-through, fault points), the crash hook, and the listing of a state root's runs.

Journals are real files under ``tmp_path``. The documents that ``load`` refuses start from a
journal as the previous release wrote it (``PREVIOUS_PUBLISH``) with one thing wrong. The
crash hook is exercised in a forked child that really dies by SIGKILL, and the parent reads
what the child left on disk.
"""

from __future__ import annotations

import copy
import datetime
import errno
import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.errors import setting
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import paths, records, swap
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.faults import (
    Faults,
    InjectedFailure,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import (
    RunKind,
    RunState,
    Step,
    StepKind,
    StepName,
    StepStatus,
)
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import (
    APP,
    publish_journal,
    rebuild_request,
    retire_journal,
)

SWAP = StepName(StepKind.SWAP, APP)
MARKER = StepName(StepKind.MARKER, APP)
STATES = (
    "building, planning, publishing, published, failed, rolling_back, rolled_back, retiring, retired, "
    "queued, staged"
)

# A journal as the previous release wrote it (schema 4: a ledger; rolled back), shortened to
# one module and a few steps of each kind.
PREVIOUS_PUBLISH = {
    "backend": "installpath",
    "created": "2026-12-01T22:44:01.970777+00:00",
    "kind": "publish",
    "modules": [
        {
            "class_link_previous": {"tools": "/apps/modules/all/TinyApp/1.0.lua"},
            "class_links": ["tools"],
            "live_ino": 2704784,
            "live_record": "/apps/.eb-staged-rebuild/runs/run2/live/TinyApp/1.0.json",
            "module": "TinyApp/1.0",
            "module_backup": "/apps/.eb-staged-rebuild/runs/run2/backup/TinyApp/1.0.lua",
            "module_file": "/apps/modules/all/TinyApp/1.0.lua",
            "name": "TinyApp",
            "new_module_sha256": "d96b7013c2a1181fd08db315da6fd34fbaed0a8982cbea5acaac6ac51b841863",
            "old_module_sha256": "d96b7013c2a1181fd08db315da6fd34fbaed0a8982cbea5acaac6ac51b841863",
            "prepared_module": "/apps/.eb-staged-rebuild/runs/run2/prepared/TinyApp/1.0.lua",
            "retired_path": "/apps/software/TinyApp/.1.0.run2",
            "stable_path": "/apps/software/TinyApp/1.0",
            "stage_ino": 3214273,
            "version": "1.0",
        }
    ],
    "relocated_files": 2,
    "request": {
        "allow_unrelocated": False,
        "backend": "installpath",
        "eb": "/opt/easybuild/bin/eb",
        "eb_args": ["TinyApp-1.0.eb"],
        "ledger_config": "/etc/eb-staged-rebuild/ledger-config.json",
        "lock_timeout": 0.0,
        "modules": "/apps/modules",
        "modules_requested": ["TinyApp/1.0"],
        "prepare": None,
        "run_id": "run2",
        "skip_live_check": False,
        "software": "/apps/software",
    },
    "run_id": "run2",
    "schema": 4,
    "state": "rolled_back",
    "state_since": "2026-12-01T22:44:02.859349+00:00",
    "steps": [
        {"at": "2026-12-01T22:44:01.995570+00:00", "status": "done", "step": "build"},
        {"at": "2026-12-01T22:44:02.347949+00:00", "status": "done", "step": "swap TinyApp/1.0"},
        {"at": "2026-12-01T22:44:02.397255+00:00", "status": "done", "step": "class-link tools TinyApp/1.0"},
        {"at": "2026-12-01T22:44:02.426426+00:00", "ledger_length": 0, "status": "done", "step": "ledger"},
        {
            "at": "2026-12-01T22:44:02.794147+00:00",
            "status": "done",
            "step": "rollback class-link tools TinyApp/1.0",
        },
        {"at": "2026-12-01T22:44:02.822637+00:00", "status": "done", "step": "rollback swap TinyApp/1.0"},
    ],
    "trees": {"modules": "/apps/modules", "software": "/apps/software"},
    "updated": "2026-12-01T22:44:02.859364+00:00",
}

# The record of a run's batch job, as ``rebuild.queue``, ``record_job`` and the job write it.
JOB = {
    "job_id": "4242",
    "target": "zen3",
    "node": "node1",
    "submitted": "2026-01-01T00:00:00+00:00",
    "started": "2026-01-01T00:01:00+00:00",
}

PREVIOUS_RETIRE = {
    "created": "2026-12-01T22:44:04.390401+00:00",
    "kind": "retire",
    "module_file": "/apps/modules/all/TinyLib/1.0.lua",
    "module_sha256": "5739c42aa4d703b34f2fcc338fb5175b6c7dc7dce291488dee5077f85e2fafb8",
    "modules": [],
    "reason": "moved",
    "retired_at": "2026-12-01T22:44:04.385019+00:00",
    "retired_to": "/apps/.eb-staged-rebuild/retired/20261201T224404384606Z/apps/modules/all/TinyLib/1.0.lua",
    "run_id": "retire-20261201T224404384606Z",
    "schema": 2,
    "software_dir": "/apps/software/TinyLib/1.0",
    "state": "retired",
    "state_since": "2026-12-01T22:44:04.397524+00:00",
    "steps": [],
    "updated": "2026-12-01T22:44:04.397537+00:00",
}


@pytest.fixture
def runs(tmp_path):
    path = tmp_path / "runs"
    path.mkdir()
    return path


def _trees(tmp_path):
    return paths.Trees(str(tmp_path / "apps" / "software"), str(tmp_path / "apps" / "modules"))


def _create(runs, run_id="run1", state=RunState.BUILDING, **request_fields):
    return publish_journal(runs, run_id, _trees(runs.parent), state=state, **request_fields)


def _on_disk(journal):
    with open(journal.path, encoding="utf-8") as handle:
        return json.load(handle)


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _place(document, where):
    """The object that holds ``where`` (``modules[0].stage_ino``) in ``document``, and its key."""
    parts = [int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", where)]
    holder = document
    for part in parts[:-1]:
        holder = holder[part]
    return holder, parts[-1]


def _with(document, **values):
    """A copy of ``document`` with the top-level fields ``values``."""
    return dict(copy.deepcopy(document), **values)


def _set(document, where, value):
    """A copy of ``document`` with ``value`` at ``where`` (``modules[0].stage_ino``)."""
    document = copy.deepcopy(document)
    holder, key = _place(document, where)
    holder[key] = value
    return document


def _without(document, where):
    document = copy.deepcopy(document)
    holder, key = _place(document, where)
    del holder[key]
    return document


def _refusal(tmp_path, document):
    """``load``'s one line for ``document`` written as a journal, without the path prefix."""
    path = _write(tmp_path / "journal.json", document)
    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))
    message = str(raised.value)
    assert "\n" not in message
    assert raised.value.kind == "journal"
    prefix = f"journal {path}: "
    assert message.startswith(prefix)
    return message[len(prefix) :]


# create


def test_create_makes_the_run_directory_private_and_writes_the_first_journal(runs):
    journal = _create(runs)

    assert journal.path == str(runs / "run1" / "journal.json")
    assert stat.S_IMODE(os.lstat(runs / "run1").st_mode) == 0o700
    data = _on_disk(journal)
    assert data["schema"] == journals.SCHEMA_SWAP
    assert (data["kind"], data["run_id"], data["state"]) == ("publish", "run1", "building")
    assert data["steps"] == []
    assert [entry["module"] for entry in data["modules"]] == [APP]
    assert data["created"] == data["state_since"]


def test_create_stores_the_request_and_the_trees(runs):
    journal = _create(runs)

    data = _on_disk(journal)
    trees = _trees(runs.parent)
    assert data["trees"] == {"software": trees.software, "modules": trees.modules}
    assert data["request"] == records.dump(rebuild_request(trees))
    assert data["backend"] == "installpath"


def test_create_writes_the_ledger_schema_for_a_request_with_a_ledger(runs):
    journal = _create(runs, ledger_config="/etc/ledger-config.json")

    assert _on_disk(journal)["schema"] == journals.SCHEMA_SWAP_LEDGER == 4


def test_create_refuses_an_existing_run_id_and_keeps_its_journal(runs):
    first = _create(runs)
    first.begin(StepName(StepKind.BUILD))
    before = (runs / "run1" / "journal.json").read_bytes()

    with pytest.raises(errors.UsageError, match=r"run run1 exists already .*runs/run1.*--run-id"):
        _create(runs)

    assert (runs / "run1" / "journal.json").read_bytes() == before


def test_create_refuses_a_run_id_whose_directory_exists_without_a_journal(runs):
    (runs / "run1").mkdir()

    with pytest.raises(errors.UsageError, match="exists already"):
        _create(runs)

    assert os.listdir(runs / "run1") == []
    assert os.listdir(runs) == ["run1"], "the hidden directory of the refused create is gone"


def _at(name, dir_fd):
    """The path of ``name`` in the directory descriptor ``dir_fd`` (a rename's argument)."""
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)


def test_create_renames_a_hidden_directory_into_place_and_leaves_no_other_entry(runs, monkeypatch):
    renames = []
    real_rename = os.rename

    def recording_rename(source, destination, *, src_dir_fd, dst_dir_fd):
        source_path, destination_path = _at(source, src_dir_fd), _at(destination, dst_dir_fd)
        renames.append((source, sorted(os.listdir(source_path)), destination_path))
        real_rename(source, destination, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(journals.os, "rename", recording_rename)

    _create(runs)

    ((source, contents, destination),) = renames
    assert source.startswith(journals.CREATING)
    assert contents == ["journal.json"], "the journal is in the directory before it gets the run's name"
    assert destination == str(runs / "run1")
    assert os.listdir(runs) == ["run1"]


def test_two_creates_take_unpredictable_hidden_names(runs, monkeypatch):
    sources = []
    real_rename = os.rename

    def recording_rename(source, destination, **dir_fds):
        sources.append(source)
        real_rename(source, destination, **dir_fds)

    monkeypatch.setattr(journals.os, "rename", recording_rename)

    _create(runs, "run1")
    _create(runs, "run2")

    assert len(set(sources)) == 2
    assert all(len(source) > len(journals.CREATING) + 4 for source in sources)


def test_create_refuses_a_run_directory_that_appears_during_the_rename_and_cleans_up(runs, monkeypatch):
    """Injected: the race (a non-empty directory made by the run id after the check) cannot be
    timed from outside; os.rename answers ENOTEMPTY as the kernel does."""
    real_rename = os.rename

    def racing_rename(source, destination, *, src_dir_fd, dst_dir_fd):
        os.mkdir(_at(destination, dst_dir_fd))
        (Path(_at(destination, dst_dir_fd)) / "journal.json").write_text("{}")
        real_rename(source, destination, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(journals.os, "rename", racing_rename)

    with pytest.raises(errors.UsageError, match="run run1 exists already"):
        _create(runs)

    assert os.listdir(runs) == ["run1"]
    assert (runs / "run1" / "journal.json").read_text() == "{}"


def test_create_refuses_a_runs_directory_that_is_a_link_and_writes_nothing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "runs").symlink_to(victim)

    with pytest.raises(errors.UsageError, match="symbolic link"):
        _create(tmp_path / "state" / "runs")

    assert os.listdir(victim) == []


def test_create_that_cannot_write_its_journal_says_so_and_leaves_no_directory(runs, monkeypatch):
    """Injected ENOSPC at the journal's write (a real full disk is in test_staged_lifecycle)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(journals.fsutil, "atomic_write", full)

    with pytest.raises(errors.JournalError) as raised:
        _create(runs)

    assert str(raised.value) == (
        f"cannot write the first journal of run run1 in {runs}: No space left on device; no run was created"
    )
    assert os.listdir(runs) == []


# load: what it reads


def test_load_reads_back_what_create_wrote(runs):
    journal = _create(runs)

    loaded = journals.Journal.load(journal.path)

    assert loaded.run == journal.run
    assert (loaded.run_id, loaded.state, loaded.modules) == ("run1", RunState.BUILDING, journal.modules)
    assert loaded.run.trees == _trees(runs.parent)
    assert loaded.run.request == rebuild_request(_trees(runs.parent))
    assert loaded.run_dir == str(runs / "run1")


def test_a_publish_journal_as_the_previous_release_wrote_it_loads(tmp_path):
    path = _write(tmp_path / "journal.json", PREVIOUS_PUBLISH)

    run = journals.Journal.load(str(path)).run

    assert (run.schema, run.kind, run.state) == (4, RunKind.PUBLISH, RunState.ROLLED_BACK)
    (entry,) = run.modules
    assert (entry.module, entry.stage_ino, entry.class_link_previous) == (
        APP,
        3214273,
        {"tools": "/apps/modules/all/TinyApp/1.0.lua"},
    )
    assert run.request.ledger_config == "/etc/eb-staged-rebuild/ledger-config.json"
    assert run.request.ledger is None  # read from its file again when needed (ledger_settings)
    assert [str(step.step) for step in run.steps] == [step["step"] for step in PREVIOUS_PUBLISH["steps"]]
    assert [step.ledger_length for step in run.steps if step.step.kind is StepKind.LEDGER] == [0]


def test_a_retire_journal_as_the_previous_release_wrote_it_loads(tmp_path):
    path = _write(tmp_path / "journal.json", PREVIOUS_RETIRE)

    run = journals.Journal.load(str(path)).run

    assert (run.kind, run.state, run.reason) == (RunKind.RETIRE, RunState.RETIRED, "moved")
    assert run.software_dir == "/apps/software/TinyLib/1.0"


def _nulls_dropped(value):
    if isinstance(value, dict):
        return {key: _nulls_dropped(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_nulls_dropped(item) for item in value]
    return value


def test_what_load_read_is_saved_back_as_it_was_but_for_nulls_and_the_time(tmp_path):
    """Every field is written, a field the old journal left out as null (or, for a request's
    chain options, as their defaults: no chain); nothing else changes."""
    path = _write(tmp_path / "journal.json", PREVIOUS_PUBLISH)
    journal = journals.Journal.load(str(path))

    journal.save()

    saved = _on_disk(journal)
    assert datetime.datetime.fromisoformat(saved.pop("updated")) > datetime.datetime.fromisoformat(
        PREVIOUS_PUBLISH["updated"]
    )
    assert saved["request"].pop("with_dependants") is False
    assert saved["request"].pop("exclude") == []
    assert saved["request"].pop("publish_together") is False
    assert _nulls_dropped(saved) == _nulls_dropped(_without(PREVIOUS_PUBLISH, "updated"))
    assert saved["module_file"] is None  # a retire run's field, null in a publish run


@pytest.mark.parametrize("schema", [2, 4])
def test_load_accepts_the_directory_swap_schemas(tmp_path, schema):
    path = _write(tmp_path / "journal.json", _with(PREVIOUS_PUBLISH, schema=schema))

    assert journals.Journal.load(str(path)).run.schema == schema


# load: the refusals of the file itself


def test_load_refuses_a_missing_journal_naming_it(tmp_path):
    path = tmp_path / "runs" / "run1" / "journal.json"

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path}: cannot read it: No such file or directory"


def test_load_refuses_a_directory_in_place_of_the_journal(tmp_path):
    path = tmp_path / "journal.json"
    path.mkdir()

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path}: not a regular file"


def test_load_refuses_a_fifo_in_place_of_the_journal_without_blocking(tmp_path):
    path = tmp_path / "journal.json"
    os.mkfifo(path)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path}: not a regular file"


def test_load_refuses_a_symlinked_journal_and_does_not_follow_it(tmp_path):
    target = _write(tmp_path / "elsewhere.json", PREVIOUS_PUBLISH)
    path = tmp_path / "journal.json"
    path.symlink_to(target)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path}: a symbolic link; refusing to follow it"


def test_load_refuses_a_journal_larger_than_any_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(journals, "MAX_BYTES", 100)

    assert _refusal(tmp_path, b" " * 101) == "larger than 100 bytes"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "truncated or not JSON (0 bytes)"),
        (b'{"schema": 2, "kind": "publish", "run_id": "ru', "truncated or not JSON (46 bytes)"),
        (b"{'schema': 2}", "truncated or not JSON (13 bytes)"),
        (b"\xff\xfe not utf-8", "not UTF-8 (12 bytes)"),
    ],
    ids=["empty", "cut-off", "python-literal", "not-utf8"],
)
def test_load_refuses_a_truncated_or_non_json_journal_with_its_size(tmp_path, raw, why):
    assert _refusal(tmp_path, raw) == why


def test_load_refuses_a_key_given_twice(tmp_path):
    raw = json.dumps(PREVIOUS_RETIRE)[:-1] + ', "reason": "other"}'

    assert _refusal(tmp_path, raw.encode()) == "the key 'reason' appears twice in one object"


def test_load_refuses_a_key_given_twice_in_a_nested_object(tmp_path):
    raw = json.dumps(PREVIOUS_PUBLISH).replace('"name": "TinyApp"', '"name": "TinyApp", "name": "Other"')

    assert _refusal(tmp_path, raw.encode()) == "the key 'name' appears twice in one object"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_load_refuses_a_number_json_does_not_have(tmp_path, constant):
    raw = json.dumps(PREVIOUS_PUBLISH).replace('"lock_timeout": 0.0', f'"lock_timeout": {constant}')

    assert _refusal(tmp_path, raw.encode()) == f"{constant} is not a JSON number"


# load: the refusals of the document's shape


@pytest.mark.parametrize("document", [[1, 2], "schema", 2, None], ids=["list", "string", "number", "null"])
def test_load_refuses_a_json_document_that_is_not_an_object(tmp_path, document):
    assert _refusal(tmp_path, document) == "no schema field"


def test_load_refuses_a_journal_without_a_schema(tmp_path):
    assert _refusal(tmp_path, _without(PREVIOUS_PUBLISH, "schema")) == "no schema field"


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (1, "schema 1 is a generation-pointer journal (live path as a symlink to a generation)"),
        (3, "schema 3 is a generation-pointer journal with a ledger"),
    ],
)
def test_load_refuses_the_generation_pointer_schemas_and_says_why(tmp_path, schema, why):
    assert _refusal(tmp_path, _with(PREVIOUS_PUBLISH, schema=schema)) == (
        f"{why}; this version only swaps directories (schemas 2 and 4)"
    )


@pytest.mark.parametrize(
    "schema", [0, 5, 99, "2", None, [2], True], ids=["0", "5", "99", "string", "null", "list", "true"]
)
def test_load_refuses_an_unknown_schema_naming_it(tmp_path, schema):
    # JSON true equals 1 to Python, and must not pass for schema 1 (or any integer) either.
    assert (
        _refusal(tmp_path, _with(PREVIOUS_PUBLISH, schema=schema))
        == f"unknown schema {schema!r} (known: 2, 4)"
    )


def test_load_refuses_a_schema_that_is_a_number_but_not_an_integer(tmp_path):
    assert (
        _refusal(tmp_path, _with(PREVIOUS_PUBLISH, schema=2.0)) == "schema must be an integer, not a number"
    )


def _nested(levels):
    value = "x"
    for _level in range(levels):
        value = [value]
    return value


def test_load_refuses_a_document_nested_deeper_than_a_journal_before_reading_its_fields(tmp_path):
    # A run, its modules, an entry, its class links: four levels. Nine are no journal.
    document = _set(PREVIOUS_PUBLISH, "modules[0].class_links", _nested(6))

    assert records.depth(document) == journals.MAX_DEPTH + 1
    assert _refusal(tmp_path, document) == f"nested deeper than {journals.MAX_DEPTH} levels"


def test_a_document_nested_as_deep_as_the_limit_is_read_field_by_field(tmp_path):
    document = _set(PREVIOUS_PUBLISH, "modules[0].class_links", _nested(5))

    assert records.depth(document) == journals.MAX_DEPTH
    assert _refusal(tmp_path, document) == "modules[0].class_links[0] must be a string, not a list"


def test_load_refuses_a_document_nested_too_deep_for_the_parser(tmp_path):
    raw = b'{"schema": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    assert _refusal(tmp_path, raw) == f"nested deeper than {journals.MAX_DEPTH} levels"


# load: every field's presence


@pytest.mark.parametrize(
    "field",
    [
        "kind",
        "run_id",
        "state",
        "created",
        "updated",
        "modules",
        "steps",
        "request.software",
        "request.modules",
        "request.modules_requested",
        "request.eb",
        "request.eb_args",
        "trees.software",
        "trees.modules",
        "modules[0].module",
        "modules[0].name",
        "modules[0].version",
        "modules[0].stable_path",
        "modules[0].retired_path",
        "modules[0].module_file",
        "steps[0].step",
        "steps[0].status",
        "steps[0].at",
    ],
)
def test_load_refuses_a_journal_missing_a_field_naming_it(tmp_path, field):
    assert _refusal(tmp_path, _without(PREVIOUS_PUBLISH, field)) == f"{field} is missing"


@pytest.mark.parametrize("field", ["trees", "request"])
def test_load_refuses_a_publish_journal_missing_what_a_publish_run_has(tmp_path, field):
    assert (
        _refusal(tmp_path, _without(PREVIOUS_PUBLISH, field)) == f"{field} is missing (a publish run has it)"
    )


@pytest.mark.parametrize(
    "state", ["building", "planning", "staged", "publishing", "published", "rolled_back"]
)
def test_load_refuses_a_run_past_queued_without_its_backend(tmp_path, state):
    """The backend is chosen when a run starts to build; only a queued run (and a failed one,
    which may have ended queued) is without it."""
    document = _with(_without(PREVIOUS_PUBLISH, "backend"), state=state)

    assert _refusal(tmp_path, document) == f"backend is missing (a publish run in state {state} has it)"


@pytest.mark.parametrize("state", ["queued", "failed"])
def test_a_run_that_never_built_loads_without_a_backend(tmp_path, state):
    document = _with(_without(PREVIOUS_PUBLISH, "backend"), state=state, modules=[], steps=[], job=JOB)

    assert journals.Journal.load(str(_write(tmp_path / "journal.json", document))).run.backend is None


@pytest.mark.parametrize(
    "field", ["module_file", "retired_to", "module_sha256", "software_dir", "reason", "retired_at"]
)
def test_load_refuses_a_retire_journal_missing_what_a_retire_run_has(tmp_path, field):
    assert _refusal(tmp_path, _without(PREVIOUS_RETIRE, field)) == f"{field} is missing (a retire run has it)"


def test_a_null_in_place_of_a_retire_field_is_as_missing(tmp_path):
    assert (
        _refusal(tmp_path, _with(PREVIOUS_RETIRE, reason=None)) == "reason is missing (a retire run has it)"
    )


@pytest.mark.parametrize(
    "where", ["colour", "request.colour", "trees.colour", "modules[0].colour", "steps[0].method"]
)
def test_load_refuses_a_field_this_version_does_not_know(tmp_path, where):
    holder, key = _place(copy.deepcopy(PREVIOUS_PUBLISH), where)
    document = _set(PREVIOUS_PUBLISH, where, "blue")

    assert key not in holder
    assert _refusal(tmp_path, document) == f"{where} is not a field this version knows"


# load: every field's type and shape

RUN_FIELDS = [
    ("kind", "nope", "kind is 'nope', not one of publish, retire"),
    ("kind", 1, "kind is 1, not one of publish, retire"),
    ("run_id", 7, "run_id must be a string, not a number"),
    ("run_id", "../x", "run_id: run id '../x' is not a plain name ([A-Za-z0-9._-], at most 128)"),
    ("run_id", "run\x002", "run_id contains a NUL byte"),
    ("state", "paused", f"state is 'paused', not one of {STATES}"),
    ("state", None, f"state is None, not one of {STATES}"),
    ("created", "yesterday", "created is not an ISO 8601 time: 'yesterday'"),
    ("created", "2026-01-01T00:00:00", "created has no UTC offset: '2026-01-01T00:00:00'"),
    ("updated", 1767225600, "updated must be a string, not a number"),
    (
        "state_since",
        "2026-13-01T00:00:00+00:00",
        "state_since is not an ISO 8601 time: '2026-13-01T00:00:00+00:00'",
    ),
    ("modules", {}, "modules must be a list, not an object"),
    ("steps", "build", "steps must be a list, not a string"),
    ("trees", [], "trees must be an object, not a list"),
    (
        "trees.software",
        "apps/software",
        "trees.software must be an absolute path without '..', not 'apps/software'",
    ),
    ("request", "TinyApp/1.0", "request must be an object, not a string"),
    ("request.eb_args", [1], "request.eb_args[0] must be a string, not a number"),
    ("request.modules_requested", "TinyApp/1.0", "request.modules_requested must be a list, not a string"),
    ("request.lock_timeout", "soon", "request.lock_timeout must be a finite number, not a string"),
    ("request.skip_live_check", "no", "request.skip_live_check must be true or false, not a string"),
    ("request.ledger", {"site": "hpc1"}, "request.ledger.path is missing"),
    (
        "request.ledger",
        {"path": "ledger.jsonl"},
        "request.ledger.path must be an absolute path without '..', not 'ledger.jsonl'",
    ),
    ("backend", 1, "backend must be a string, not a number"),
    ("relocated_files", True, "relocated_files must be an integer, not true/false"),
    ("refused", "yes", "refused must be true or false, not a string"),
    ("resumed", "now", "resumed is not an ISO 8601 time: 'now'"),
    ("job", "4242", "job must be an object, not a string"),
    ("job", {"job_id": "4242"}, "job.submitted is missing"),
    ("job.job_id", 4242, "job.job_id must be a string, not a number"),
    ("job.job_id", "4242.0", "job.job_id '4242.0' is not a job id (digits)"),
    ("job.job_id", "4242;rm", "job.job_id '4242;rm' is not a job id (digits)"),
    ("job.job_id", "", "job.job_id '' is not a job id (digits)"),
    ("job.target", "../zen3", "job.target '../zen3' is not a plain name"),
    ("job.target", 3, "job.target must be a string, not a number"),
    ("job.node", "node/1", "job.node 'node/1' is not a plain name"),
    ("job.node", ["node1"], "job.node must be a string, not a list"),
    ("job.submitted", "2026-01-01", "job.submitted has no UTC offset: '2026-01-01'"),
    ("job.started", 0, "job.started must be a string, not a number"),
    ("job.extra", 1, "job.extra is not a field this version knows"),
    ("error", ["eb failed"], "error must be a string, not a list"),
    ("error", "eb\x00failed", "error contains a NUL byte"),
    ("cancelled", "yes", "cancelled must be true or false, not a string"),
    ("cancelled", 1, "cancelled must be true or false, not a number"),
    ("request.publish_together", "no", "request.publish_together must be true or false, not a string"),
]


@pytest.mark.parametrize(
    ("where", "value", "why"), RUN_FIELDS, ids=[f"{w}={v!r}" for w, v, _why in RUN_FIELDS]
)
def test_load_refuses_a_run_field_of_the_wrong_type_or_shape(tmp_path, where, value, why):
    assert _refusal(tmp_path, _set(_with(PREVIOUS_PUBLISH, job=JOB), where, value)) == why


RETIRE_FIELDS = [
    (
        "module_file",
        "modules/all/x.lua",
        "module_file must be an absolute path without '..', not 'modules/all/x.lua'",
    ),
    (
        "retired_to",
        "/apps/../x.lua",
        "retired_to must be an absolute path without '..', not '/apps/../x.lua'",
    ),
    ("module_sha256", "00", "module_sha256 is not a SHA-256 in hex: '00'"),
    ("software_dir", 5, "software_dir must be a string, not a number"),
    ("reason", ["moved"], "reason must be a string, not a list"),
    ("retired_at", "2026-12-01", "retired_at has no UTC offset: '2026-12-01'"),
]


@pytest.mark.parametrize(
    ("where", "value", "why"), RETIRE_FIELDS, ids=[w for w, _value, _why in RETIRE_FIELDS]
)
def test_load_refuses_a_retire_field_of_the_wrong_type_or_shape(tmp_path, where, value, why):
    assert _refusal(tmp_path, _set(PREVIOUS_RETIRE, where, value)) == why


ENTRY_FIELDS = [
    ("module", "TinyApp/2.0", "modules[0].module 'TinyApp/2.0' is not its name/version"),
    ("module", 1, "modules[0].module must be a string, not a number"),
    ("name", None, "modules[0].name must be a string, not null"),
    ("version", 1.0, "modules[0].version must be a string, not a number"),
    (
        "stable_path",
        "software/TinyApp/1.0",
        "modules[0].stable_path must be an absolute path without '..', not 'software/TinyApp/1.0'",
    ),
    (
        "retired_path",
        "/apps/software/TinyApp/1.0/..",
        "modules[0].retired_path must be an absolute path without '..', not '/apps/software/TinyApp/1.0/..'",
    ),
    ("module_file", 3, "modules[0].module_file must be a string, not a number"),
    (
        "live_record",
        "live/TinyApp/1.0.json",
        "modules[0].live_record must be an absolute path without '..', not 'live/TinyApp/1.0.json'",
    ),
    ("prepared_module", False, "modules[0].prepared_module must be a string, not true/false"),
    ("new_module_sha256", "d96b", "modules[0].new_module_sha256 is not a SHA-256 in hex: 'd96b'"),
    ("old_module_sha256", "D" * 64, f"modules[0].old_module_sha256 is not a SHA-256 in hex: {'D' * 64!r}"),
    ("class_links", "tools", "modules[0].class_links must be a list, not a string"),
    ("class_links", [None], "modules[0].class_links[0] must be a string, not null"),
    (
        "module_backup",
        "backup.lua",
        "modules[0].module_backup must be an absolute path without '..', not 'backup.lua'",
    ),
    ("stage_ino", True, "modules[0].stage_ino must be an integer, not true/false"),
    ("stage_ino", "3214273", "modules[0].stage_ino must be an integer, not a string"),
    ("live_ino", 1.5, "modules[0].live_ino must be an integer, not a number"),
    ("class_link_previous", ["tools"], "modules[0].class_link_previous must be an object, not a list"),
    (
        "class_link_previous",
        {"tools": 3},
        "modules[0].class_link_previous.tools must be a string, not a number",
    ),
]


@pytest.mark.parametrize(
    ("field", "value", "why"), ENTRY_FIELDS, ids=[f"{f}={v!r}" for f, v, _why in ENTRY_FIELDS]
)
def test_load_refuses_a_module_entry_field_of_the_wrong_type_or_shape(tmp_path, field, value, why):
    assert _refusal(tmp_path, _set(PREVIOUS_PUBLISH, f"modules[0].{field}", value)) == why


@pytest.mark.parametrize(
    ("module", "name", "version"),
    [("../1.0", "..", "1.0"), ("TinyApp/.1.0", "TinyApp", ".1.0"), ("a b/1.0", "a b", "1.0")],
)
def test_load_refuses_a_module_entry_whose_module_is_not_a_name_version(tmp_path, module, name, version):
    entry = dict(PREVIOUS_PUBLISH["modules"][0], module=module, name=name, version=version)
    document = _with(PREVIOUS_PUBLISH, modules=[entry])

    assert _refusal(tmp_path, document) == f"modules[0].module {module!r} is not NAME/VERSION"


def test_load_refuses_a_module_entry_that_is_not_an_object(tmp_path):
    assert (
        _refusal(tmp_path, _with(PREVIOUS_PUBLISH, modules=[APP]))
        == "modules[0] must be an object, not a string"
    )


STEP_FIELDS = [
    (
        "step",
        "frobnicate TinyApp/1.0",
        "steps[0].step is 'frobnicate TinyApp/1.0', not a step this version knows",
    ),
    ("step", "undo frobnicate", "steps[0].step is 'undo frobnicate', not a step this version knows"),
    ("step", "Swap TinyApp/1.0", "steps[0].step is 'Swap TinyApp/1.0', not a step this version knows"),
    ("step", "swap", "steps[0].step is 'swap': a swap step names 1 more words"),
    (
        "step",
        "swap TinyApp/1.0 again",
        "steps[0].step is 'swap TinyApp/1.0 again': a swap step names 1 more words",
    ),
    ("step", "build TinyApp/1.0", "steps[0].step is 'build TinyApp/1.0': a build step names 0 more words"),
    (
        "step",
        "class-link TinyApp/1.0",
        "steps[0].step is 'class-link TinyApp/1.0': a class-link step names 2 more words",
    ),
    ("step", "swap ../1.0", "steps[0].step is 'swap ../1.0': '../1.0' is not NAME/VERSION"),
    ("step", 5, "steps[0].step must be a string, not a number"),
    ("status", "running", "steps[0].status is 'running', not one of started, done"),
    ("at", "soon", "steps[0].at is not an ISO 8601 time: 'soon'"),
    ("ledger_length", "0", "steps[0].ledger_length must be an integer, not a string"),
]


@pytest.mark.parametrize(
    ("field", "value", "why"), STEP_FIELDS, ids=[f"{f}={v!r}" for f, v, _why in STEP_FIELDS]
)
def test_load_refuses_a_step_whose_kind_name_or_field_is_wrong(tmp_path, field, value, why):
    assert _refusal(tmp_path, _set(PREVIOUS_PUBLISH, f"steps[0].{field}", value)) == why


# load: values no command can compute with, whatever the field

UNUSABLE = [
    # times whose offset carries them out of datetime's range, or past it with gc's grace
    (
        "created",
        "0001-01-01T00:00:00+05:00",
        "created is not between 1970 and 9000 UTC: '0001-01-01T00:00:00+05:00'",
    ),
    (
        "state_since",
        "9999-12-31T23:00:00-05:00",
        "state_since is not between 1970 and 9000 UTC: '9999-12-31T23:00:00-05:00'",
    ),
    (
        "updated",
        "9999-12-31T00:00:00+00:00",
        "updated is not between 1970 and 9000 UTC: '9999-12-31T00:00:00+00:00'",
    ),
    (
        "steps[1].at",
        "1969-12-31T23:59:59+00:00",
        "steps[1].at is not between 1970 and 9000 UTC: '1969-12-31T23:59:59+00:00'",
    ),
    (
        "resumed",
        "9000-01-01T00:00:00+00:00",
        "resumed is not between 1970 and 9000 UTC: '9000-01-01T00:00:00+00:00'",
    ),
    # surrogates that no bytes encode, in any string
    ("backend", "install\ud800path", "backend holds U+D800, a lone surrogate that encodes no bytes"),
    (
        "request.eb_args",
        ["TinyApp-1.0.eb", "--hooks=\udfff"],
        "request.eb_args[1] holds U+DFFF, a lone surrogate that encodes no bytes",
    ),
    ("request.eb", "/opt/eb\udc00/bin/eb", "request.eb holds U+DC00, a lone surrogate that encodes no bytes"),
    (
        "modules[0].stable_path",
        "/apps/software/TinyApp/\udbff",
        "modules[0].stable_path holds U+DBFF, a lone surrogate that encodes no bytes",
    ),
    (
        "modules[0].class_link_previous",
        {"\ud800": None},
        "modules[0].class_link_previous holds U+D800, a lone surrogate that encodes no bytes",
    ),
    # integers: inodes, offsets and counts are 64 bits, unsigned
    ("modules[0].stage_ino", -1, "modules[0].stage_ino is -1, not an integer from 0 to 2**64 - 1"),
    (
        "steps[3].ledger_length",
        2**64,
        f"steps[3].ledger_length is {2**64}, not an integer from 0 to 2**64 - 1",
    ),
    ("relocated_files", -2, "relocated_files is -2, not an integer from 0 to 2**64 - 1"),
    # the backend is a name of a closed set, not text
    (
        "backend",
        "installpath\n\x1b[2Kremoved",
        "backend 'installpath\\n\\x1b[2Kremoved' is not one of bwrap, userns, installpath",
    ),
    ("backend", "auto", "backend 'auto' is not one of bwrap, userns, installpath"),
    (
        "request.backend",
        "bwrap\x07",
        "request.backend 'bwrap\\x07' is not one of auto, bwrap, userns, installpath",
    ),
]


@pytest.mark.parametrize(("where", "value", "why"), UNUSABLE, ids=[f"{w}={v!r}" for w, v, _why in UNUSABLE])
def test_load_refuses_a_value_no_command_can_compute_with(tmp_path, where, value, why):
    assert _refusal(tmp_path, _set(PREVIOUS_PUBLISH, where, value)) == why


def test_load_refuses_a_lone_surrogate_in_a_retire_s_reason(tmp_path):
    # Rollback once moved the module file back, then died printing the reason.
    assert _refusal(tmp_path, _with(PREVIOUS_RETIRE, reason="moved \ud800")) == (
        "reason holds U+D800, a lone surrogate that encodes no bytes"
    )


USABLE = [
    # the ends of the range, with offsets
    ("created", "1970-01-01T00:00:00+00:00"),
    ("created", "1970-01-01T05:00:00+05:00"),
    ("state_since", "8999-12-31T23:59:59.999999+00:00"),
    ("state_since", "8999-12-31T20:00:00-03:00"),
    # a path's undecodable byte, as Python names it (U+DC80..U+DCFF): the tool writes those
    ("request.eb", "/opt/eb-\udcff/bin/eb"),
    ("modules[0].class_links", ["tools"]),
    ("relocated_files", 2**64 - 1),
    ("modules[0].stage_ino", 0),
]


@pytest.mark.parametrize(("where", "value"), USABLE, ids=[f"{w}={v!r}" for w, v in USABLE])
def test_load_accepts_values_at_the_edges_of_what_the_commands_compute_with(tmp_path, where, value):
    path = _write(tmp_path / "journal.json", _set(PREVIOUS_PUBLISH, where, value))

    loaded = records.dump(journals.Journal.load(str(path)).run)

    holder, key = _place(loaded, where)
    assert holder[key] == value


def test_load_keeps_control_characters_in_the_reason_and_easybuild_s_arguments(tmp_path):
    """The administrator's own text: a reason may hold a newline, an EasyBuild argument any
    character the command line took. The journal keeps them as given; what prints them for
    people escapes them (text.py)."""
    reason = "moved to /cvmfs\nsee ticket\t42\x1b[2K"
    eb_args = ["TinyApp-1.0.eb", "--modules-header=line one\nline two\r"]
    retire_path = _write(tmp_path / "retire" / "journal.json", _with(PREVIOUS_RETIRE, reason=reason))
    publish_path = _write(
        tmp_path / "publish" / "journal.json", _set(PREVIOUS_PUBLISH, "request.eb_args", eb_args)
    )

    assert journals.Journal.load(str(retire_path)).run.reason == reason
    assert journals.Journal.load(str(publish_path)).run.request.eb_args == eb_args


# load: what a run in each state always has (journal.STATE_INVARIANTS), written here apart
# from the code's table

PLANNED = [
    "live_record",
    "prepared_module",
    "new_module_sha256",
    "module_backup",
    "old_module_sha256",
    "stage_ino",
    "live_ino",
]
ALWAYS_HAS = {
    "building": ["live_record"],
    "planning": ["live_record"],
    "publishing": PLANNED,
    "published": PLANNED,
    "rolling_back": PLANNED,
    "rolled_back": PLANNED,
    "failed": [],
    "queued": [],
    "staged": PLANNED,
}
# When an entry may lack the field all the same.
UNLESS = {
    "live_record": " unless its request skipped the live-change check",
    "module_backup": " unless old_module_sha256 is null too",
    "old_module_sha256": " unless module_backup is null too",
}
LOST = [(state, field) for state, fields in ALWAYS_HAS.items() for field in fields]


def test_the_invariants_table_is_the_one_these_tests_check():
    table = {
        state.value: set(invariant.entry_fields)
        for (kind, state), invariant in journals.STATE_INVARIANTS.items()
        if kind is RunKind.PUBLISH
    }

    assert table == {state: set(fields) for state, fields in ALWAYS_HAS.items()}
    assert {state for (kind, state) in journals.STATE_INVARIANTS if kind is RunKind.RETIRE} == {
        RunState.RETIRING,
        RunState.RETIRED,
        RunState.ROLLED_BACK,
    }


@pytest.mark.parametrize(("state", "field"), LOST, ids=[f"{s}-{f}" for s, f in LOST])
def test_a_run_that_lost_a_field_its_state_always_has_is_refused_naming_it(tmp_path, state, field):
    document = _set(_with(PREVIOUS_PUBLISH, state=state), f"modules[0].{field}", None)

    assert _refusal(tmp_path, document) == (
        f"modules[0].{field} is missing (a publish run in state {state} has it{UNLESS.get(field, '')})"
    )


@pytest.mark.parametrize("state", list(ALWAYS_HAS))
def test_a_run_with_what_its_state_has_loads_and_may_lack_the_rest(tmp_path, state):
    document = _with(PREVIOUS_PUBLISH, state=state, job=JOB if state == "queued" else None)
    for field in set(PLANNED) - set(ALWAYS_HAS[state]):
        document = _set(document, f"modules[0].{field}", None)
    path = _write(tmp_path / "journal.json", document)

    assert journals.Journal.load(str(path)).run.state is RunState(state)


@pytest.mark.parametrize(
    "state", ["planning", "staged", "publishing", "published", "rolling_back", "rolled_back"]
)
def test_a_run_past_building_without_a_module_is_refused(tmp_path, state):
    document = _with(PREVIOUS_PUBLISH, state=state, modules=[], steps=[])

    assert _refusal(tmp_path, document) == (
        f"modules is empty (a publish run in state {state} has at least one module)"
    )


@pytest.mark.parametrize("state", ["building", "failed"])
def test_a_run_stopped_before_its_module_list_was_saved_loads(tmp_path, state):
    path = _write(tmp_path / "journal.json", _with(PREVIOUS_PUBLISH, state=state, modules=[], steps=[]))

    assert journals.Journal.load(str(path)).run.modules == []


def test_a_published_run_that_skipped_the_live_check_has_no_live_record(tmp_path):
    document = _set(PREVIOUS_PUBLISH, "request.skip_live_check", True)
    document = _set(_with(document, state="published"), "modules[0].live_record", None)
    path = _write(tmp_path / "journal.json", document)

    assert journals.Journal.load(str(path)).run.modules[0].live_record is None


def test_a_published_run_of_a_module_that_had_no_module_file_before_has_no_backup(tmp_path):
    document = _with(PREVIOUS_PUBLISH, state="published")
    for field in ("module_backup", "old_module_sha256"):
        document = _set(document, f"modules[0].{field}", None)
    path = _write(tmp_path / "journal.json", document)

    (entry,) = journals.Journal.load(str(path)).run.modules
    assert (entry.module_backup, entry.old_module_sha256) == (None, None)


def test_a_published_run_whose_backup_fields_are_both_gone_but_whose_backup_is_there_is_refused(runs):
    journal = _create(runs, state=RunState.PUBLISHED)
    (entry,) = journal.modules
    backup = entry.module_backup
    entry.module_backup = entry.old_module_sha256 = None
    journal.save()

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(journal.path)

    assert str(raised.value) == (
        f"journal {journal.path}: modules[0].module_backup is missing, but the run's backup {backup} exists"
    )


def test_load_refuses_a_run_id_that_is_not_its_directory_s_name(runs):
    path = _write(runs / "run1" / "journal.json", PREVIOUS_PUBLISH)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value) == f"journal {path}: run_id 'run2' is not its directory's name"


def test_a_journal_outside_a_runs_directory_need_not_match_its_directory(tmp_path):
    path = _write(tmp_path / "copy" / "journal.json", PREVIOUS_PUBLISH)

    assert journals.Journal.load(str(path)).run_id == "run2"


# step names: one closed set of kinds, read back from the text they are written as


def _step_name(kind, undo=False):
    return StepName(kind, APP if kind.has_module else None, "tools" if kind.has_class else None, undo)


@pytest.mark.parametrize("undo", [False, True], ids=["forward", "undo"])
@pytest.mark.parametrize("kind", list(StepKind), ids=[kind.value for kind in StepKind])
def test_every_step_name_round_trips_through_its_text(kind, undo):
    name = _step_name(kind, undo)

    text = str(name)

    words = (["undo"] if undo else []) + [kind.value]
    words += (["tools"] if kind.has_class else []) + ([APP] if kind.has_module else [])
    assert text == " ".join(words)
    assert name.to_json() == text
    assert StepName.from_json(text, "step") == name


def test_step_names_read_as_the_previous_release_wrote_them():
    assert StepName.from_json("class-link tools TinyApp/1.0", "s") == StepName(
        StepKind.CLASS_LINK, APP, "tools"
    )
    assert StepName.from_json("rollback class-link tools TinyApp/1.0", "s") == StepName(
        StepKind.ROLLBACK_CLASS_LINK, APP, "tools"
    )
    assert StepName.from_json("undo swap TinyApp/1.0", "s") == StepName(StepKind.SWAP, APP, undo=True)
    assert StepName.from_json("resume recover-fallback TinyApp/1.0", "s") == StepName(
        StepKind.RESUME_RECOVER_FALLBACK, APP
    )
    assert StepName.from_json("ledger", "s") == StepName(StepKind.LEDGER)


def test_which_kinds_name_a_module_and_a_class():
    assert {kind for kind in StepKind if not kind.has_module} == {
        StepKind.BUILD,
        StepKind.RELOCATE,
        StepKind.PREPARE_PROGRAM,
        StepKind.LEDGER,
    }
    assert {kind for kind in StepKind if kind.has_class} == {
        StepKind.CLASS_LINK,
        StepKind.ROLLBACK_CLASS_LINK,
        StepKind.RESUME_CLASS_LINK,
    }


def test_the_fallback_step_kinds_are_the_exchange_s_three_renames():
    fallback = [kind.value for kind in StepKind if kind.value.startswith("fallback-")]

    assert fallback == list(swap.FALLBACK_STEPS)


def test_undone_names_the_reversal_of_a_step():
    assert str(SWAP.undone()) == "undo swap TinyApp/1.0"
    assert SWAP.undone().undone() == SWAP.undone()


# the step engine: begin/done, step, and their fault points


def test_begin_is_on_disk_before_it_returns(runs):
    journal = _create(runs)

    journal.begin(SWAP)

    (step,) = journals.Journal.load(journal.path).run.steps
    assert (step.step, step.status) == (SWAP, StepStatus.STARTED)
    datetime.datetime.fromisoformat(step.at)  # a real timestamp, not a placeholder
    assert _on_disk(journal)["steps"] == [
        {"step": "swap TinyApp/1.0", "status": "started", "at": step.at, "ledger_length": None}
    ]


def test_done_marks_the_step_done_on_disk(runs):
    journal = _create(runs)
    journal.begin(MARKER).done()
    second = journal.begin(SWAP)

    second.done()

    steps = journals.Journal.load(journal.path).run.steps
    assert [(step.step, step.status) for step in steps] == [
        (MARKER, StepStatus.DONE),
        (SWAP, StepStatus.DONE),
    ]
    assert journal.step_names() == ["marker TinyApp/1.0", "swap TinyApp/1.0"]


def test_begin_journals_the_fields_of_a_step(runs):
    journal = _create(runs)

    journal.begin(StepName(StepKind.LEDGER), ledger_length=120)

    (step,) = journals.Journal.load(journal.path).run.steps
    assert step.ledger_length == 120


def test_an_unfinished_step_stays_started_at_the_end_of_the_list(runs):
    journal = _create(runs)
    journal.begin(StepName(StepKind.BUILD)).done()

    journal.begin(SWAP)

    steps = journals.Journal.load(journal.path).run.steps
    assert [(str(step.step), step.status) for step in steps] == [
        ("build", StepStatus.DONE),
        ("swap TinyApp/1.0", StepStatus.STARTED),
    ]


def test_step_journals_the_step_started_before_its_block_and_done_after(runs):
    journal = _create(runs)
    (entry,) = journal.modules
    inside = []

    with journal.step(StepKind.CLASS_LINK, entry, "tools"):
        inside.append(
            [(str(step.step), step.status) for step in journals.Journal.load(journal.path).run.steps]
        )

    assert inside == [[("class-link tools TinyApp/1.0", StepStatus.STARTED)]]
    (step,) = journals.Journal.load(journal.path).run.steps
    assert (str(step.step), step.status) == ("class-link tools TinyApp/1.0", StepStatus.DONE)


def test_a_step_whose_block_raises_stays_started_and_the_error_goes_on(runs):
    journal = _create(runs)

    with pytest.raises(OSError, match="the operation failed"), journal.step(
        StepKind.SWAP, journal.modules[0]
    ):
        raise OSError("the operation failed")

    (step,) = journals.Journal.load(journal.path).run.steps
    assert (step.step, step.status) == (SWAP, StepStatus.STARTED)


def test_a_step_is_a_fault_point_and_so_is_its_journal_write(runs):
    journal = _create(runs)
    journal.faults = Faults()

    with journal.step(StepKind.MARKER, journal.modules[0]):
        pass
    journal.begin(SWAP).done()

    assert journal.faults.operations == [
        "marker TinyApp/1.0",
        "journal marker TinyApp/1.0",
        "swap TinyApp/1.0",
        "journal swap TinyApp/1.0",
    ]


def test_a_failure_at_a_step_s_fault_point_comes_before_the_step_is_journaled_or_run(runs):
    journal = _create(runs)
    journal.faults = Faults(fail_at=1)
    ran = []

    with pytest.raises(InjectedFailure) as raised, journal.step(StepKind.MARKER, journal.modules[0]):
        ran.append(True)

    assert raised.value.step == "marker TinyApp/1.0"
    assert ran == []
    assert journals.Journal.load(journal.path).run.steps == []


def test_a_failure_at_the_journal_write_comes_after_the_operation_and_leaves_it_started(runs):
    journal = _create(runs)
    journal.faults = Faults(fail_at=2)
    ran = []

    with pytest.raises(InjectedFailure) as raised, journal.step(StepKind.MARKER, journal.modules[0]):
        ran.append(True)

    assert raised.value.step == "journal marker TinyApp/1.0"
    assert ran == [True]
    (step,) = journals.Journal.load(journal.path).run.steps
    assert step.status is StepStatus.STARTED


def test_a_reversal_s_steps_are_journaled_but_are_no_fault_points(runs):
    journal = _create(runs)
    journal.faults = Faults(fail_at=1)

    with journal.step_named(SWAP.undone()):
        pass

    assert journal.faults.operations == []
    (step,) = journals.Journal.load(journal.path).run.steps
    assert (str(step.step), step.status) == ("undo swap TinyApp/1.0", StepStatus.DONE)


def test_steps_of_lists_a_kind_s_forward_steps_only(runs):
    journal = _create(runs)
    journal.begin(SWAP).done()
    journal.begin(MARKER).done()
    journal.begin(SWAP.undone()).done()

    assert [step.step for step in journal.steps_of(StepKind.SWAP)] == [SWAP]
    assert journal.steps_of(StepKind.LEDGER) == []


def test_the_default_faults_only_count(runs):
    journal = _create(runs)

    journal.begin(SWAP).done()

    assert journal.faults.fail_at is None
    assert journal.faults.operations == ["swap TinyApp/1.0", "journal swap TinyApp/1.0"]


# set_state and save


def test_set_state_records_the_state_and_when_it_changed(runs):
    journal = _create(runs)
    journal.run.state_since = "2000-01-01T00:00:00+00:00"
    before = datetime.datetime.now(datetime.timezone.utc)

    journal.set_state(RunState.PLANNING)

    data = _on_disk(journal)
    assert data["state"] == "planning"
    since = datetime.datetime.fromisoformat(data["state_since"])
    assert since >= before
    assert since <= datetime.datetime.fromisoformat(data["updated"])


def test_saves_without_a_state_change_keep_state_since(runs):
    journal = _create(runs)
    journal.run.state_since = "2000-01-01T00:00:00+00:00"
    journal.save()

    journal.begin(StepName(StepKind.BUILD)).done()

    data = _on_disk(journal)
    assert data["state_since"] == "2000-01-01T00:00:00+00:00"
    assert data["updated"] != data["state_since"]


def test_save_leaves_no_temporary_file_beside_the_journal(runs):
    journal = _create(runs, skip_live_check=True)  # no live-change record beside it either

    for kind in (StepKind.BUILD, StepKind.RELOCATE, StepKind.LEDGER):
        journal.begin(StepName(kind)).done()

    assert os.listdir(journal.run_dir) == ["journal.json"]


def test_a_saved_step_is_a_typed_record(runs):
    journal = _create(runs)

    journal.begin(SWAP).done()

    (step,) = journals.Journal.load(journal.path).run.steps
    assert isinstance(step, Step)
    assert records.dump(step) == _on_disk(journal)["steps"][0]


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
        journal.begin(MARKER).done()
        journal.begin(SWAP)
        marker.write_text("the child went on after the step\n")

    return body


def test_the_crash_hook_kills_the_process_right_after_the_step_is_on_disk(runs, tmp_path):
    marker = tmp_path / "went-on"

    status = _in_forked_child(_steps_then_marker(runs, marker), {journals.CRASH_HOOK: str(SWAP)})

    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert not marker.exists()
    steps = journals.Journal.load(str(runs / "run1" / "journal.json")).run.steps
    assert [(step.step, step.status) for step in steps] == [
        (MARKER, StepStatus.DONE),
        (SWAP, StepStatus.STARTED),
    ]


def test_the_crash_hook_ignores_other_steps(runs, tmp_path):
    marker = tmp_path / "went-on"

    status = _in_forked_child(_steps_then_marker(runs, marker), {journals.CRASH_HOOK: "swap Other/2.0"})

    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0
    assert marker.exists()


# run_journals, check_all, find and interrupted


def _created(runs, run_id, created, state=RunState.PUBLISHED):
    journal = _create(runs, run_id, state)
    journal.run.created = created
    journal.save()
    return journal


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


def test_run_journals_ignores_a_symlink_to_a_run_directory(runs, tmp_path):
    _create(runs, "run1")
    elsewhere = tmp_path / "elsewhere"
    _create(elsewhere, "run2")
    (runs / "run2").symlink_to(elsewhere / "run2")

    assert [journal.run_id for journal in journals.run_journals(str(tmp_path))] == ["run1"]


def test_run_journals_stops_on_one_unreadable_journal(runs, tmp_path):
    _create(runs, "good-1")
    _write(runs / "broken" / "journal.json", b'{"schema": 2, "ki')
    _create(runs, "good-2")

    with pytest.raises(errors.JournalError, match=r"broken/journal\.json: truncated or not JSON"):
        journals.run_journals(str(tmp_path))


def test_run_journals_skips_a_run_directory_without_a_journal_and_incomplete_names_it(runs, tmp_path):
    # What an earlier release's create left after a crash or ENOSPC between mkdir and journal.
    _create(runs, "good")
    (runs / "empty").mkdir()

    assert [journal.run_id for journal in journals.run_journals(str(tmp_path))] == ["good"]
    (found,) = journals.incomplete(str(tmp_path))
    assert found["path"] == str(runs / "empty")
    assert found["run_id"] == "empty"
    assert "without a journal" in found["why"]
    assert "remove it by hand" in found["why"]


def _plant_link(runs, name, tmp_path):
    """A link named as a run, to a directory holding a journal that would load."""
    elsewhere = tmp_path / "elsewhere"
    _create(elsewhere, "forged")
    (runs / name).symlink_to(elsewhere / "forged")


# What else than a run ``runs/`` may hold, how it is made, and what ``incomplete`` says it is:
# (name, make, run_id, kind, words of its why). A partial list never hides a run: each is listed.
UNLISTED = [
    (".creating-abc123", lambda runs, name, tmp: (runs / name).mkdir(), None, "leftover", "interrupted"),
    (
        ".creating-def456",
        lambda runs, name, tmp: _write(runs / name / "journal.json", b"{"),  # half written: never loaded
        None,
        "leftover",
        "remove it by hand",
    ),
    ("run2", _plant_link, "run2", "unreadable", "a symbolic link where a run directory should be"),
    ("run3", lambda runs, name, tmp: (runs / name).symlink_to(tmp / "gone"), "run3", "unreadable", "link"),
    ("run4", lambda runs, name, tmp: (runs / name).write_text("x"), "run4", "unreadable", "not a directory"),
    (".hidden", lambda runs, name, tmp: (runs / name).mkdir(), None, "unreadable", "no run id"),
    (
        ".creating-x",
        lambda runs, name, tmp: (runs / name).write_text(""),
        None,
        "unreadable",
        "not a directory",
    ),
]


@pytest.mark.parametrize("case", UNLISTED, ids=[entry[0] + "-" + entry[3] for entry in UNLISTED])
def test_what_is_not_a_run_is_never_loaded_and_incomplete_lists_it(runs, tmp_path, case):
    name, make, run_id, kind, words = case
    _create(runs, "good")
    make(runs, name, tmp_path)

    journals.check_all(str(tmp_path))

    assert [journal.run_id for journal in journals.run_journals(str(tmp_path))] == ["good"]
    (found,) = journals.incomplete(str(tmp_path))
    assert (found["path"], found["run_id"], found["kind"]) == (str(runs / name), run_id, kind)
    assert words in found["why"]
    assert "by hand" in found["why"]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_plant_link, "is a symbolic link where a run directory should be"),
        (lambda runs, name, tmp: (runs / name).write_text("x"), "is not a directory, so no run"),
    ],
    ids=["link", "file"],
)
def test_find_refuses_a_run_id_that_is_no_run_directory_in_one_line(runs, tmp_path, make, why):
    make(runs, "run2", tmp_path)

    with pytest.raises(errors.JournalError) as raised:
        journals.find(str(tmp_path), "run2")

    assert str(raised.value).startswith(f"run run2: {runs / 'run2'} {why}")
    assert "\n" not in str(raised.value)


def test_a_complete_state_root_has_nothing_incomplete(runs, tmp_path):
    _create(runs, "good")

    assert journals.incomplete(str(tmp_path)) == []


def test_check_all_refuses_one_unreadable_journal(runs, tmp_path):
    _create(runs, "good")
    _write(runs / "broken" / "journal.json", b"{")

    with pytest.raises(errors.JournalError) as raised:
        journals.check_all(str(tmp_path))

    assert str(raised.value) == f"journal {runs / 'broken' / 'journal.json'}: truncated or not JSON (1 bytes)"


def test_interrupted_lists_the_runs_that_resume_must_finish(runs, tmp_path):
    retire_states = {RunState.RETIRING, RunState.RETIRED}
    for index, state in enumerate(RunState):
        if state in retire_states:
            moved = tmp_path / "apps" / "modules" / "all" / "TinyOld" / "1.0.lua"
            journal = retire_journal(
                runs,
                f"retire-{state.value}",
                module_file=moved,
                software_dir=tmp_path / "apps" / "software" / "TinyOld" / "1.0",
                state=state,
            )
            journal.run.created = f"2026-01-01T00:00:0{index}+00:00"
            journal.save()
        else:
            _created(runs, f"run-{state.value}", f"2026-01-01T00:00:0{index}+00:00", state)

    listed = [journal.state for journal in journals.interrupted(str(tmp_path))]

    assert listed == [state for state in RunState if state in journals.INTERRUPTED]
    assert set(listed) == {
        RunState.BUILDING,
        RunState.PLANNING,
        RunState.PUBLISHING,
        RunState.ROLLING_BACK,
        RunState.RETIRING,
    }


def test_a_retire_run_round_trips_through_its_journal(runs):
    journal = retire_journal(
        runs,
        "retire-1",
        module_file="/apps/modules/all/Moved/1.0.lua",
        retired_to=f"{runs.parent}/retired/1/apps/modules/all/Moved/1.0.lua",
        software_dir="/apps/software/Moved/1.0",
    )

    loaded = journals.Journal.load(journal.path)

    assert loaded.run == journal.run
    assert (loaded.run.kind, loaded.run.trees, loaded.run.request) == (RunKind.RETIRE, None, None)


def test_find_loads_the_named_run(runs, tmp_path):
    _create(runs, "run1")
    _create(runs, "run2")

    assert journals.find(str(tmp_path), "run2").run_id == "run2"


def test_find_refuses_a_missing_run_naming_the_runs_directory(runs, tmp_path):
    with pytest.raises(errors.UsageError) as raised:
        journals.find(str(tmp_path), "nope")

    assert str(raised.value) == f"no run nope under {runs}"


def test_find_refuses_a_run_directory_without_a_journal_saying_what_it_is(runs, tmp_path):
    (runs / "run1").mkdir()

    with pytest.raises(
        errors.JournalError, match=r"run run1: a run directory without a journal .*remove .*by hand"
    ):
        journals.find(str(tmp_path), "run1")


def test_find_refuses_a_run_whose_journal_is_unreadable(runs, tmp_path):
    _write(runs / "run1" / "journal.json", b"{")

    with pytest.raises(errors.JournalError, match="truncated or not JSON"):
        journals.find(str(tmp_path), "run1")


def test_find_refuses_a_run_id_that_leaves_the_runs_directory(runs, tmp_path):
    # A journal that is not under runs/ is not a run of this state root, even when the
    # path the run id spells happens to hold one.
    _create(tmp_path, "outside")

    with pytest.raises(errors.UsageError):
        journals.find(str(tmp_path), "../outside")


# the paths a journal names: where this state root's runs put them

STATE_ROOT = "/apps/.eb-staged-rebuild"


def _run_of(document):
    return journals.parse(json.dumps(document).encode())


def _path_refusal(document, state_root=STATE_ROOT):
    with pytest.raises(records.RecordError) as raised:
        _run_of(document).check_paths(state_root)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_the_paths_of_a_publish_and_a_retire_run_as_the_tool_writes_them_pass():
    assert _run_of(PREVIOUS_PUBLISH).check_paths(STATE_ROOT) is None  # returns: no refusal
    assert _run_of(PREVIOUS_RETIRE).check_paths(STATE_ROOT) is None


def test_a_tcl_module_file_and_the_files_named_after_it_pass():
    document = copy.deepcopy(PREVIOUS_PUBLISH)
    entry = document["modules"][0]
    entry["module_file"] = "/apps/modules/all/TinyApp/1.0"
    entry["prepared_module"] = f"{STATE_ROOT}/runs/run2/prepared/TinyApp/1.0"
    entry["module_backup"] = f"{STATE_ROOT}/runs/run2/backup/TinyApp/1.0"

    assert _run_of(document).check_paths(STATE_ROOT) is None


def test_an_entry_without_its_optional_files_passes():
    # A failed run, which may have stopped before any of them was written.
    document = _with(PREVIOUS_PUBLISH, state="failed")
    for field in ("live_record", "prepared_module", "module_backup"):
        document["modules"][0][field] = None

    assert _run_of(document).check_paths(STATE_ROOT) is None


@pytest.mark.parametrize(
    ("where", "value", "why"),
    [
        (
            "modules[0].stable_path",
            "/other/TinyApp/1.0",
            "modules[0].stable_path /other/TinyApp/1.0 is not <software>/TinyApp/1.0",
        ),
        (
            "modules[0].stable_path",
            "/apps/software/TinyApp/./1.0",
            "modules[0].stable_path /apps/software/TinyApp/./1.0 is not <software>/TinyApp/1.0",
        ),
        (
            "modules[0].stable_path",
            "/apps/software/Other/1.0",
            "modules[0].stable_path /apps/software/Other/1.0 is not <software>/TinyApp/1.0",
        ),
        (
            "modules[0].retired_path",
            "/other/TinyApp/.1.0.run2",
            "modules[0].retired_path /other/TinyApp/.1.0.run2 is not <software>/TinyApp/.1.0.run2",
        ),
        (
            "modules[0].retired_path",
            "/apps/software/TinyApp/.1.0.run1",
            "modules[0].retired_path /apps/software/TinyApp/.1.0.run1 is not <software>/TinyApp/.1.0.run2",
        ),
        (
            "modules[0].retired_path",
            "/apps/software/TinyApp/1.0",
            "modules[0].retired_path /apps/software/TinyApp/1.0 is not <software>/TinyApp/.1.0.run2",
        ),
        (
            "modules[0].module_file",
            "/etc/passwd",
            "modules[0].module_file /etc/passwd is not <modules>/all/TinyApp/1.0.lua "
            "or <modules>/all/TinyApp/1.0",
        ),
        (
            "modules[0].module_file",
            "/apps/modules/tools/TinyApp/1.0.lua",
            "modules[0].module_file /apps/modules/tools/TinyApp/1.0.lua is not "
            "<modules>/all/TinyApp/1.0.lua or <modules>/all/TinyApp/1.0",
        ),
        (
            "modules[0].live_record",
            "/tmp/1.0.json",
            "modules[0].live_record /tmp/1.0.json is not <run>/live/TinyApp/1.0.json",
        ),
        (
            "modules[0].prepared_module",
            f"{STATE_ROOT}/runs/run1/prepared/TinyApp/1.0.lua",
            f"modules[0].prepared_module {STATE_ROOT}/runs/run1/prepared/TinyApp/1.0.lua is not "
            "<run>/prepared/TinyApp/1.0.lua",
        ),
        (
            "modules[0].module_backup",
            "/etc/shadow",
            "modules[0].module_backup /etc/shadow is not <run>/backup/TinyApp/1.0.lua",
        ),
        (
            "modules[0].class_links",
            ["../x"],
            "modules[0].class_links[0]: '../x' is not a module class (a plain name, not 'all')",
        ),
        (
            "modules[0].class_links",
            ["all"],
            "modules[0].class_links[0]: 'all' is not a module class (a plain name, not 'all')",
        ),
        (
            "modules[0].class_links",
            [".hidden"],
            "modules[0].class_links[0]: '.hidden' is not a module class (a plain name, not 'all')",
        ),
        (
            "modules[0].class_link_previous",
            {"a/b": None},
            "modules[0].class_link_previous: 'a/b' is not a module class (a plain name, not 'all')",
        ),
        (
            "trees.software",
            "/other/software",
            "trees (/other/software, /apps/modules) are not the request's (/apps/software, /apps/modules)",
        ),
        (
            "steps[2].step",
            "class-link .. TinyApp/1.0",
            "steps[2]: '..' is not a module class (a plain name, not 'all')",
        ),
    ],
)
def test_a_publish_run_naming_a_path_elsewhere_is_refused_naming_the_field(where, value, why):
    assert _path_refusal(_set(PREVIOUS_PUBLISH, where, value)) == why


def test_a_publish_run_of_another_state_root_is_refused():
    assert _path_refusal(PREVIOUS_PUBLISH, "/other/state") == (
        f"modules[0].live_record {STATE_ROOT}/runs/run2/live/TinyApp/1.0.json is not "
        "<run>/live/TinyApp/1.0.json"
    )


def _retire_document(**fields):
    return _with(PREVIOUS_RETIRE, **fields)


RETIRED_TO = PREVIOUS_RETIRE["retired_to"]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (
            {"retired_to": "/etc/passwd"},
            f"retired_to /etc/passwd is not where run retire-20261201T224404384606Z keeps "
            f"/apps/modules/all/TinyLib/1.0.lua ({RETIRED_TO})",
        ),
        (
            {"module_file": "/apps/modules/all/TinyLib/2.0.lua"},
            f"retired_to {RETIRED_TO} is not where run retire-20261201T224404384606Z keeps "
            f"/apps/modules/all/TinyLib/2.0.lua ({STATE_ROOT}/retired/20261201T224404384606Z"
            "/apps/modules/all/TinyLib/2.0.lua)",
        ),
        (
            {
                "module_file": "/etc/x.lua",
                "retired_to": f"{STATE_ROOT}/retired/20261201T224404384606Z/etc/x.lua",
            },
            "module_file /etc/x.lua is not in a module tree <installpath>/modules/all/<Name>/",
        ),
        (
            {"software_dir": "/other/software/TinyLib/1.0"},
            "software_dir /other/software/TinyLib/1.0 is not under /apps/software, "
            "the software root of /apps/modules/all/TinyLib/1.0.lua",
        ),
        (
            {"software_dir": "/apps/software"},
            "software_dir /apps/software is not under /apps/software, "
            "the software root of /apps/modules/all/TinyLib/1.0.lua",
        ),
        (
            {"run_id": "moved-1"},
            "run_id 'moved-1' of a retire run does not begin with 'retire-'",
        ),
    ],
)
def test_a_retire_run_naming_a_path_elsewhere_is_refused_naming_the_field(fields, why):
    assert _path_refusal(_retire_document(**fields)) == why


def _linked_site(tmp_path):
    """A publish journal of a real tree under ``tmp_path``, its state root ``tmp_path/state``."""
    trees = _trees(tmp_path)
    state_root = tmp_path / "state"
    journal = publish_journal(state_root / "runs", "run1", trees)
    return journal, trees, state_root


@pytest.mark.parametrize(
    ("linked", "where"),
    [
        ("software/TinyApp", "modules[0].stable_path"),
        ("modules/all/TinyApp", "modules[0].module_file"),
    ],
)
def test_a_path_through_a_symlinked_directory_below_its_tree_is_refused(tmp_path, linked, where):
    journal, _trees_of, _state_root = _linked_site(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    link = tmp_path / "apps" / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(journal.path)

    assert str(raised.value) == (
        f"journal {journal.path}: {where}: {link} is a symbolic link (in {link}/"
        + ("1.0" if linked.startswith("software") else "1.0.lua")
        + "); symlink components are refused"
    )


def test_a_symlinked_tree_root_itself_is_trusted(tmp_path):
    # A site may keep its software root behind a link: only what lies below it is checked.
    real = tmp_path / "real-apps"
    (real / "software" / "TinyApp" / "1.0").mkdir(parents=True)
    (tmp_path / "apps").symlink_to(real)
    journal, _trees_of, _state_root = _linked_site(tmp_path)

    assert journals.Journal.load(journal.path).run == journal.run


def test_load_checks_the_paths_of_a_journal_in_a_runs_directory(tmp_path):
    # PREVIOUS_PUBLISH names the state root /apps/.eb-staged-rebuild: under another, its run
    # files are not where this state root's runs put them.
    path = _write(tmp_path / "state" / "runs" / "run2" / "journal.json", PREVIOUS_PUBLISH)

    with pytest.raises(errors.JournalError) as raised:
        journals.Journal.load(str(path))

    assert str(raised.value).startswith(f"journal {path}: modules[0].live_record ")


def test_check_trees_accepts_the_journal_s_own_trees_and_no_trees():
    run = _run_of(PREVIOUS_PUBLISH)

    assert run.check_trees(None) is None  # returns: no refusal
    assert run.check_trees(paths.Trees("/apps/software", "/apps/modules")) is None
    assert run.check_trees(paths.Trees("/apps/software/", "/apps//modules")) is None  # as options spell them


@pytest.mark.parametrize(
    "trees", [("/other/software", "/apps/modules"), ("/apps/software", "/other/modules")]
)
def test_check_trees_refuses_a_publish_run_of_other_trees(trees):
    given = paths.Trees(*trees)

    with pytest.raises(records.RecordError) as raised:
        _run_of(PREVIOUS_PUBLISH).check_trees(given)

    assert str(raised.value) == (
        "trees.software /apps/software and trees.modules /apps/modules are not the trees given "
        f"({given.software}, {given.modules})"
    )


def test_check_trees_refuses_a_retire_of_a_module_file_outside_the_module_tree_given():
    run = _run_of(PREVIOUS_RETIRE)
    run.check_trees(paths.Trees("/apps/software", "/apps/modules"))

    with pytest.raises(records.RecordError) as raised:
        run.check_trees(paths.Trees("/other/software", "/other/modules"))

    assert str(raised.value) == (
        "module_file /apps/modules/all/TinyLib/1.0.lua is not under the module tree given (/other/modules)"
    )


def test_journal_check_trees_names_the_journal(runs):
    journal = _create(runs)

    with pytest.raises(errors.JournalError) as raised:
        journal.check_trees(paths.Trees("/other/software", "/other/modules"))

    assert str(raised.value).startswith(f"journal {journal.path}: trees.software ")
    assert raised.value.kind == "journal"


def test_a_journal_named_by_a_relative_path_is_checked_against_its_absolute_state_root(
    runs, tmp_path, monkeypatch
):
    journal = _create(runs)
    monkeypatch.chdir(tmp_path)

    assert journals.Journal.load(os.path.join("runs", "run1", "journal.json")).run == journal.run


# failure_reason / record_failure: the one line a failed run keeps


@pytest.mark.parametrize(
    ("err", "line"),
    [
        (
            errors.PublishError(f"{setting('prepare')} exited 1;\nnothing was swapped"),
            "--prepare exited 1; nothing was swapped",
        ),
        # Spelt as the command line showed it: the flag is --module, not --modules.
        (
            errors.UsageError(f"{setting('modules')} names TinyApp/1.0 twice"),
            "--module names TinyApp/1.0 twice",
        ),
        (
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/apps/software/x"),
            "No space left on device (/apps/software/x)",
        ),
        (OSError(errno.EROFS, os.strerror(errno.EROFS)), "Read-only file system"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (ValueError("bad\tvalue"), "ValueError: bad value"),
    ],
    ids=[
        "tool-error-with-a-setting",
        "tool-error-with-a-flag-of-another-spelling",
        "os-error-with-a-path",
        "os-error",
        "bare-exception",
        "other-exception",
    ],
)
def test_failure_reason_is_one_line_in_the_words_the_user_was_shown(err, line):
    assert journals.failure_reason(err) == line


def test_record_failure_marks_a_run_stopped_by_sigterm_cancelled_and_no_other():
    terminated, failed = (
        journals.Run(2, RunKind.PUBLISH, "run1", RunState.BUILDING, "t", "t", [], []) for _ in range(2)
    )

    terminated.record_failure(errors.Terminated("terminated by signal 15; completed steps were reversed"))
    failed.record_failure(errors.PublishError("EasyBuild failed"))

    assert (terminated.error, terminated.cancelled) == (
        "terminated by signal 15; completed steps were reversed",
        True,
    )
    assert (failed.error, failed.cancelled) == ("EasyBuild failed", None)
