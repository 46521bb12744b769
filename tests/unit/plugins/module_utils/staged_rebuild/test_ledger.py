"""The optional ledger: its configuration, the durable append, its inverse, and the records."""

from __future__ import annotations

import datetime
import hashlib
import json
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import ledger, paths, records
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal


def _config_file(tmp_path, content):
    path = tmp_path / "ledger-config.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(path)


@pytest.fixture
def config(tmp_path):
    return ledger.LedgerConfig(str(tmp_path / "ledger.jsonl"), "hpc1")


def _lines(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


# load_config


def test_load_config_returns_the_path_and_the_site(tmp_path):
    path = _config_file(tmp_path, {"path": "/var/lib/ledger.jsonl", "site": "hpc1", "extra": 1})

    assert ledger.load_config(path) == ledger.LedgerConfig("/var/lib/ledger.jsonl", "hpc1")


def test_load_config_defaults_the_site_to_empty(tmp_path):
    path = _config_file(tmp_path, {"path": "/var/lib/ledger.jsonl"})

    assert ledger.load_config(path).site == ""


def test_load_config_turns_a_non_string_site_into_text(tmp_path):
    path = _config_file(tmp_path, {"path": "/var/lib/ledger.jsonl", "site": 7})

    assert ledger.load_config(path).site == "7"


def test_load_config_refuses_a_missing_file_naming_it(tmp_path):
    path = tmp_path / "missing.json"

    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(str(path))

    assert str(raised.value) == f"cannot read --ledger-config {path}: No such file or directory"


def test_load_config_refuses_a_directory(tmp_path):
    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(str(tmp_path))

    assert str(raised.value) == f"--ledger-config {tmp_path} is not a regular file"


@pytest.mark.parametrize(
    "raw", [b"", b"{path: /x}", b'{"path": "/x"', b"\xff\xfe"], ids=["empty", "bare", "cut", "bytes"]
)
def test_load_config_refuses_a_file_that_is_not_json(tmp_path, raw):
    path = _config_file(tmp_path, raw)

    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(path)

    assert str(raised.value) == f"--ledger-config {path} is not JSON"


@pytest.mark.parametrize(
    "content",
    [["/x"], "/x", {"site": "hpc1"}, {"path": ""}, {"path": None}, {"path": 5}, {"path": ["/x"]}],
    ids=["list", "string", "no-path", "empty-path", "null-path", "number-path", "list-path"],
)
def test_load_config_refuses_a_document_without_a_path_string(tmp_path, content):
    path = _config_file(tmp_path, content)

    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(path)

    assert (
        str(raised.value) == f'--ledger-config {path} needs {{"path": "<ledger.jsonl>", "site": "<label>"}}'
    )


@pytest.mark.parametrize("relative", ["ledger.jsonl", "./ledger.jsonl", "../ledger.jsonl", "~/ledger.jsonl"])
def test_load_config_refuses_a_relative_ledger_path(tmp_path, relative):
    path = _config_file(tmp_path, {"path": relative})

    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(path)

    assert str(raised.value) == f"--ledger-config {path}: path {relative!r} is not absolute"


@pytest.mark.parametrize("climbing", ["/var/lib/../ledger.jsonl", "/var/lib/ledger/..", "/.."])
def test_load_config_refuses_a_ledger_path_with_a_dot_dot_component(tmp_path, climbing):
    # The run's journal keeps the path; a journal path with ".." is refused when it is read.
    path = _config_file(tmp_path, {"path": climbing})

    with pytest.raises(errors.UsageError) as raised:
        ledger.load_config(path)

    assert str(raised.value) == f"--ledger-config {path}: path {climbing!r} has a '..' component"


def test_load_config_accepts_a_name_that_only_starts_with_dots(tmp_path):
    path = _config_file(tmp_path, {"path": "/var/lib/..ledger.jsonl"})

    assert ledger.load_config(path).path == "/var/lib/..ledger.jsonl"


def test_the_configuration_is_a_record_the_journal_stores_and_reads_back():
    config = ledger.LedgerConfig("/var/lib/ledger.jsonl", "hpc1")

    assert records.load(ledger.LedgerConfig, records.dump(config)) == config


# append and truncate


def test_append_creates_the_ledger_and_returns_zero(config):
    before = ledger.append(config, [{"name": "TinyApp", "version": "1.0"}])

    assert before == 0
    assert _lines(config.path) == [{"name": "TinyApp", "version": "1.0"}]


def test_append_returns_the_previous_length_and_keeps_what_was_there(config):
    ledger.append(config, [{"name": "A"}])
    length = os.path.getsize(config.path)

    before = ledger.append(config, [{"name": "B"}, {"name": "C"}])

    assert before == length
    assert _lines(config.path) == [{"name": "A"}, {"name": "B"}, {"name": "C"}]


def test_append_writes_one_sorted_json_line_per_record(config):
    ledger.append(config, [{"z": 1, "a": "x"}])

    with open(config.path, "rb") as handle:
        assert handle.read() == b'{"a": "x", "z": 1}\n'


def test_append_of_no_records_changes_nothing(config):
    ledger.append(config, [{"name": "A"}])
    with open(config.path, "rb") as handle:
        before = handle.read()

    assert ledger.append(config, []) == len(before)

    with open(config.path, "rb") as handle:
        assert handle.read() == before


def test_append_refuses_a_symlink_at_the_ledger_path_and_leaves_its_target(tmp_path, config):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("precious\n")
    os.symlink(target, config.path)

    with pytest.raises(errors.UsageError, match="symbolic link"):
        ledger.append(config, [{"name": "A"}])

    assert target.read_text() == "precious\n"


def test_append_refuses_a_symlink_component_of_the_ledger_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    config = ledger.LedgerConfig(str(tmp_path / "link" / "ledger.jsonl"))

    with pytest.raises(errors.UsageError, match=f"{tmp_path}/link is a symbolic link"):
        ledger.append(config, [{"name": "A"}])

    assert os.listdir(tmp_path / "real") == []


def test_truncate_restores_the_ledger_to_its_length_before_the_append(config):
    ledger.append(config, [{"name": "A"}])
    with open(config.path, "rb") as handle:
        original = handle.read()

    length = ledger.append(config, [{"name": "B"}, {"name": "C"}])
    ledger.truncate(config, length)

    with open(config.path, "rb") as handle:
        assert handle.read() == original


def test_truncate_of_a_ledger_the_append_created_leaves_it_empty(config):
    length = ledger.append(config, [{"name": "A"}])

    ledger.truncate(config, length)

    assert os.path.getsize(config.path) == 0


def test_truncate_refuses_a_symlink_at_the_ledger_path(tmp_path, config):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("precious\n")
    os.symlink(target, config.path)

    with pytest.raises(errors.UsageError, match="symbolic link"):
        ledger.truncate(config, 0)

    assert target.read_text() == "precious\n"


# the ledger's lines of a run


def _journal_with(tmp_path, *modules):
    """A publishing run of a ledger (schema 4) whose modules are live with ``easyconfigs``."""
    trees = paths.Trees(str(tmp_path / "software"), str(tmp_path / "modules"))
    for name, version, easyconfigs in modules:
        stable = tmp_path / "software" / name / version
        (stable / "easybuild").mkdir(parents=True)
        for file_name, text in easyconfigs.items():
            (stable / "easybuild" / file_name).write_text(text)
    journal = publish_journal(
        tmp_path / "state" / "runs",
        "run1",
        trees,
        [f"{name}/{version}" for name, version, _easyconfigs in modules],
        state=RunState.PUBLISHING,
        ledger_config=str(tmp_path / "ledger-config.json"),
    )
    assert journal.run.schema == journals.SCHEMA_SWAP_LEDGER
    for entry in journal.modules:
        entry.new_module_sha256 = "ab" * 32
    return journal


def test_the_lines_describe_each_published_module(tmp_path, config):
    journal = _journal_with(tmp_path, ("TinyApp", "1.0", {"TinyApp-1.0.eb": "name = 'TinyApp'\n"}))

    (record,) = ledger.lines_of(journal, config)

    published_at = record.pop("published_at")
    assert datetime.datetime.fromisoformat(published_at) >= datetime.datetime.fromisoformat(
        journal.run.created
    )
    assert record == {
        "name": "TinyApp",
        "version": "1.0",
        "stable_path": f"{tmp_path}/software/TinyApp/1.0",
        "run_id": "run1",
        "site": "hpc1",
        "started_at": journal.run.created,
        "module_file": f"{tmp_path}/modules/all/TinyApp/1.0.lua",
        "module_sha256": "ab" * 32,
        "easyconfig_sha256": hashlib.sha256(b"name = 'TinyApp'\n").hexdigest(),
        "retired_path": f"{tmp_path}/software/TinyApp/.1.0.run1",
    }


def test_the_lines_hash_the_first_easyconfig_by_name(tmp_path, config):
    journal = _journal_with(tmp_path, ("TinyApp", "1.0", {"b.eb": "second\n", "a.eb": "first\n"}))

    (record,) = ledger.lines_of(journal, config)

    assert record["easyconfig_sha256"] == hashlib.sha256(b"first\n").hexdigest()


def test_the_lines_of_an_install_without_an_easyconfig_say_none(tmp_path, config):
    journal = _journal_with(tmp_path, ("TinyApp", "1.0", {}))

    (record,) = ledger.lines_of(journal, config)

    assert record["easyconfig_sha256"] is None


def test_the_lines_keep_the_publish_order_and_share_one_time(tmp_path, config):
    journal = _journal_with(tmp_path, ("TinyLib", "1.0", {}), ("TinyApp", "1.0", {}))

    lines = ledger.lines_of(journal, config)

    assert [record["name"] for record in lines] == ["TinyLib", "TinyApp"]
    assert lines[0]["published_at"] == lines[1]["published_at"]


def test_the_lines_round_trip_through_the_ledger(tmp_path, config):
    journal = _journal_with(tmp_path, ("TinyApp", "1.0", {"TinyApp-1.0.eb": "x\n"}))
    lines = ledger.lines_of(journal, config)

    ledger.append(config, lines)

    assert _lines(config.path) == lines
