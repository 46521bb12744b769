"""The commands as functions of plain arguments, what the CLI and the Ansible modules call:
their dry runs (``would_change``, nothing written), the idempotent retire, the rebuild that
is skipped when the live install is up to date, and the one-line failure message.

Builds use the test builder ``tests/builders/fake-eb`` (installpath backend), as in test_cli.
"""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.errors import setting
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import commands, uptodate
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import rebuild as rebuild_module
from tests.support.staged import StagedSite, fake_eb_request, publish_in_process, snapshot

APP = "TinyApp/1.0"


@pytest.fixture
def site(tmp_path):
    site = StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=tmp_path)
    site.install(APP)
    return site


def _request(site, run_id="run1"):
    return fake_eb_request(site, APP, run_id)


def _publish(site, run_id="run1"):
    return publish_in_process(site, APP, run_id)


def _everything(site):
    return snapshot(site.software, site.modules, site.state_root)


def test_a_dry_run_rebuild_would_change_and_writes_nothing(site):
    before = _everything(site)

    result = commands.run_rebuild(_request(site), str(site.state_root), None, {}, dry_run=True)

    assert (result["dry_run"], result["would_change"], result["changed"]) == (True, True, False)
    assert _everything(site) == before


def test_rebuild_if_changed_skips_a_module_whose_record_matches(site, monkeypatch):
    monkeypatch.setattr(
        uptodate, "compare", lambda request: [{"module": APP, "up_to_date": True, "why": "same"}]
    )
    before = _everything(site)

    result = commands.rebuild_if_changed(_request(site), str(site.state_root), None, {})

    assert (result["changed"], result["state"]) == (False, "up_to_date")
    assert _everything(site) == before


def test_rebuild_if_changed_rebuilds_a_stale_module_and_says_why(site):
    # The test builder records no EasyBuild log, so the version cannot match: stale.
    result = commands.rebuild_if_changed(
        _request(site), str(site.state_root), lambda line: None, dict(os.environ)
    )

    assert (result["changed"], result["state"]) == (True, "published")
    assert result["up_to_date"][0]["up_to_date"] is False


def test_roll_back_dry_run_says_whether_it_would_change_and_writes_nothing(site):
    _publish(site)
    before = _everything(site)

    planned = commands.roll_back(str(site.state_root), "run1", 0.0, dry_run=True)

    assert (planned["would_change"], planned["state"]) == (True, "published")
    assert _everything(site) == before
    commands.roll_back(str(site.state_root), "run1", 0.0)
    assert commands.roll_back(str(site.state_root), "run1", 0.0, dry_run=True)["would_change"] is False


def test_retire_of_an_already_retired_file_is_ok_only_when_asked(site):
    module_file = str(site.module_file(APP))
    first = commands.retire_module(str(site.state_root), module_file, "moved", already_retired_ok=True)
    before = _everything(site)

    again = commands.retire_module(str(site.state_root), module_file, "moved", already_retired_ok=True)

    assert first["changed"] is True
    assert again == dict(first, changed=False)
    assert _everything(site) == before
    with pytest.raises(errors.UsageError, match="already retired"):
        commands.retire_module(str(site.state_root), module_file, "moved")


def test_retire_of_a_file_that_was_rolled_back_and_removed_is_refused(site):
    module_file = str(site.module_file(APP))
    first = commands.retire_module(str(site.state_root), module_file, "moved")
    commands.roll_back(str(site.state_root), first["run_id"], 0.0)
    os.unlink(module_file)

    with pytest.raises(errors.UsageError, match="does not exist"):
        commands.retire_module(str(site.state_root), module_file, "moved", already_retired_ok=True)


def test_retire_of_a_module_file_whose_root_climbs_records_the_directory_it_names(site):
    # EasyBuild writes a plain root, but a site's own module file may say .../bin/..; the
    # journal keeps the directory it names, which every command can then read back.
    module_file = site.module_file(APP)
    module_file.write_text(f'local root = "{site.live(APP)}/bin/.."\n')

    retired = commands.retire_module(str(site.state_root), str(module_file), "moved")

    journal = journals.find(str(site.state_root), retired["run_id"])
    assert journal.run.software_dir == str(site.live(APP))
    assert [run["run_id"] for run in commands.show_status(str(site.state_root))["runs"]] == [
        retired["run_id"]
    ]
    assert commands.roll_back(str(site.state_root), retired["run_id"], 0.0)["changed"] is True
    assert module_file.is_file()


def test_retire_of_a_module_file_with_a_relative_root_is_refused_and_writes_nothing(site):
    module_file = site.module_file(APP)
    module_file.write_text('local root = "software/TinyApp/1.0"\n')
    before = _everything(site)

    with pytest.raises(errors.UsageError) as raised:
        commands.retire_module(str(site.state_root), str(module_file), "moved")

    assert str(raised.value) == (
        f"module file {module_file} assigns root 'software/TinyApp/1.0', not an absolute path; "
        "refusing to retire it"
    )
    assert _everything(site) == before


def test_retire_dry_run_checks_the_request_and_writes_nothing(site):
    module_file = str(site.module_file(APP))
    before = _everything(site)

    planned = commands.retire_module(str(site.state_root), module_file, "moved", dry_run=True)

    assert planned["would_change"] is True
    assert _everything(site) == before
    with pytest.raises(errors.UsageError, match="--reason"):
        commands.retire_module(str(site.state_root), module_file, " ", dry_run=True)


def test_gc_dry_run_would_change_only_when_something_is_due(site):
    _publish(site)
    before = _everything(site)

    due = commands.collect_garbage(str(site.state_root), 0.0, 0.0, dry_run=True)
    kept = commands.collect_garbage(str(site.state_root), 1000.0, 0.0, dry_run=True)

    assert (due["would_change"], len(due["removed"])) == (True, 1)
    assert (kept["would_change"], kept["removed"]) == (False, [])
    assert _everything(site) == before


def test_resume_dry_run_lists_nothing_when_no_run_was_interrupted(site):
    _publish(site)

    planned = commands.resume_runs(
        str(site.state_root), None, lock_timeout=0.0, progress=None, env={}, dry_run=True
    )

    assert (planned["would_change"], planned["interrupted"]) == (False, [])


def test_resume_of_a_run_stopped_before_its_modules_were_recorded_ends_it_failed_and_builds_nothing(site):
    """The journal as a crash right after ``Journal.create`` leaves it: ``building``, no
    modules (the crash hook stops only at journaled steps, and this point has none)."""
    _publish(site, "first")
    request = _request(site, "run2")
    journals.Journal.create(
        str(site.state_root / "runs"),
        "run2",
        kind=journals.RunKind.PUBLISH,
        state=journals.RunState.BUILDING,
        trees=request.trees,
        request=request,
        backend="installpath",
    )
    trees = snapshot(site.software, site.modules)

    result = commands.resume_runs(
        str(site.state_root), "run2", lock_timeout=0.0, progress=lambda line: None, env={}
    )

    (run,) = result["runs"]
    assert (run["state"], run["changed"]) == ("failed", True)
    assert run["actions"] == [
        "stopped before its modules were recorded: nothing built or published; ended failed"
    ]
    assert "modules" not in run
    assert journals.find(str(site.state_root), "run2").state is journals.RunState.FAILED
    assert snapshot(site.software, site.modules) == trees


def test_a_second_resume_of_a_failed_run_changes_nothing(site):
    _publish(site, "first")
    request = _request(site, "run2")
    journal = journals.Journal.create(
        str(site.state_root / "runs"),
        "run2",
        kind=journals.RunKind.PUBLISH,
        state=journals.RunState.FAILED,
        trees=request.trees,
        request=request,
        backend="installpath",
    )
    before = snapshot(site.software, site.modules, site.state_root / "runs")

    result = commands.resume_runs(str(site.state_root), None, lock_timeout=0.0, progress=None, env={})

    assert result["changed"] is False
    assert [(run["run_id"], run["state"], run["actions"]) for run in result["runs"]] == [
        ("first", "published", []),
        ("run2", "failed", []),
    ]
    assert journals.find(str(site.state_root), "run2").state is journal.state is journals.RunState.FAILED
    assert snapshot(site.software, site.modules, site.state_root / "runs") == before


def test_status_reads_a_state_root_without_writing_to_it(site):
    _publish(site)
    os.rmdir(site.state_root / "retired")
    before = _everything(site)

    result = commands.show_status(str(site.state_root))

    assert [run["run_id"] for run in result["runs"]] == ["run1"]
    assert _everything(site) == before


def test_a_state_root_without_runs_is_refused_for_commands_that_need_runs(tmp_path):
    with pytest.raises(errors.UsageError, match="has no runs"):
        commands.show_status(str(tmp_path))


def test_failure_message_is_one_line_for_core_and_system_errors(tmp_path):
    missing = tmp_path / "missing"

    with pytest.raises(OSError) as raised:
        missing.read_text()

    assert commands.failure_message(raised.value) == f"No such file or directory ({missing})"
    assert commands.failure_message(errors.UsageError("no run x")) == "no run x"
    assert commands.failure_kind(raised.value) == "os_error"
    assert commands.failure_kind(errors.UsageError("no run x")) == "usage"


def test_failure_message_spells_the_settings_it_names_as_asked(tmp_path):
    refused = errors.UsageError(f"{setting('modules')} TinyApp/1.0 is given twice")

    assert commands.failure_message(refused) == "--module TinyApp/1.0 is given twice"
    assert commands.failure_message(refused, name_of=str) == "modules TinyApp/1.0 is given twice"


def test_roll_back_dry_run_refuses_what_the_rollback_would_refuse(site):
    _publish(site)
    commands.collect_garbage(str(site.state_root), 0.0, 0.0)
    before = _everything(site)

    with pytest.raises(errors.UsageError) as planned:
        commands.roll_back(str(site.state_root), "run1", 0.0, dry_run=True)
    with pytest.raises(errors.UsageError) as real:
        commands.roll_back(str(site.state_root), "run1", 0.0)

    assert str(planned.value) == str(real.value)
    assert _everything(site) == before


def test_gc_dry_run_writes_nothing_even_where_the_state_root_lacks_its_lock_and_retired_dir(tmp_path):
    (tmp_path / "state" / "runs").mkdir(parents=True)
    before = snapshot(tmp_path / "state")

    planned = commands.collect_garbage(str(tmp_path / "state"), 0.0, 0.0, dry_run=True)

    assert (planned["would_change"], planned["removed"]) == (False, [])
    assert snapshot(tmp_path / "state") == before


def _fail_at_live_record(monkeypatch, err):
    def record_live(journal, entry, skip):
        raise OSError(err, os.strerror(err), "live.json")

    monkeypatch.setattr(rebuild_module.planner, "record_live", record_live)


def test_a_rebuild_that_fails_at_the_live_change_record_ends_its_run_failed(site, monkeypatch):
    """Injected ENOSPC (a real full disk: test_staged_lifecycle's tmpfs case)."""
    _fail_at_live_record(monkeypatch, errno.ENOSPC)
    trees = snapshot(site.software, site.modules)

    with pytest.raises(OSError, match="No space left on device"):
        commands.run_rebuild(_request(site), str(site.state_root), lambda line: None, {})

    journal = journals.find(str(site.state_root), "run1")
    assert (journal.state, journal.run.refused) == (journals.RunState.FAILED, True)
    assert snapshot(site.software, site.modules) == trees


def test_a_failed_rebuild_whose_journal_cannot_be_written_says_so_and_stays_as_the_disk_has_it(
    site, monkeypatch
):
    """Injected EROFS at the journal's write after the failure: a state root that turned
    read-only during the run (the first journal was written, the next write fails)."""
    _fail_at_live_record(monkeypatch, errno.ENOSPC)
    real_write = rebuild_module.journals.fsutil.atomic_write
    writes = []

    def read_only_after_the_first(path, data, *args, **kwargs):
        writes.append(path)
        if len(writes) > 1:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        real_write(path, data, *args, **kwargs)

    monkeypatch.setattr(rebuild_module.journals.fsutil, "atomic_write", read_only_after_the_first)

    with pytest.raises(errors.JournalError) as raised:
        commands.run_rebuild(_request(site), str(site.state_root), lambda line: None, {})

    message = commands.failure_message(raised.value)
    assert "\n" not in message
    assert message.startswith("run run1 failed (No space left on device) and its journal ")
    assert "could not be marked failed: Read-only file system; it stays building" in message
    monkeypatch.undo()
    assert journals.find(str(site.state_root), "run1").state is journals.RunState.BUILDING
