"""``gc``: which retired trees go, which stay, and what it refuses to touch.

Journals are written with ``Journal.create`` into a real state root and the trees they name
are real directories; the clock is the ``now`` argument, so the grace arithmetic is exact.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import gc, paths, settings
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal, retire_journal

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
HOUR = datetime.timedelta(hours=1)
GRACE = settings.DEFAULT_GRACE_HOURS * HOUR


class Site:
    """A live tree under ``root/apps`` and a state root at ``root/state``."""

    def __init__(self, root):
        self.software = root / "apps" / "software"
        self.modules = root / "apps" / "modules"
        self.state_root = root / "state"
        (self.state_root / "runs").mkdir(parents=True)
        self.software.mkdir(parents=True)

    @property
    def runs(self):
        return self.state_root / "runs"

    def stable(self, module):
        return self.software / module

    def sibling(self, module, run_id):
        name, version = module.split("/")
        return self.software / name / f".{version}.{run_id}"

    def module_file(self, module):
        return self.modules / "all" / (module + ".lua")

    def _tree(self, path, payload):
        path.mkdir(parents=True, exist_ok=True)
        (path / "PAYLOAD").write_text(payload + "\n")
        return path

    @property
    def trees(self):
        return paths.Trees(str(self.software), str(self.modules))

    def publish_run(self, run_id, *modules, state=RunState.PUBLISHED, since=T0, retired_paths=None):
        """A publish journal, its live trees, its retired siblings and its live module files."""
        modules = modules or ("TinyApp/1.0",)
        for module in modules:
            stable = self._tree(self.stable(module), "new")
            self._tree(self.sibling(module, run_id), "old")
            module_file = self.module_file(module)
            module_file.parent.mkdir(parents=True, exist_ok=True)
            module_file.write_bytes(os.fsencode(f'local root = "{stable}"\n'))  # any path's bytes
        journal = publish_journal(self.runs, run_id, self.trees, modules, state=state)
        for entry in journal.modules:
            assert entry.retired_path == str(self.sibling(entry.module, run_id))
            # As the swap leaves them: the new tree (the stage) live, the old one beside it.
            entry.stage_ino = os.lstat(entry.stable_path).st_ino
            entry.live_ino = os.lstat(entry.retired_path).st_ino
            entry.retired_path = (retired_paths or {}).get(entry.module, entry.retired_path)
        _age(journal, since)
        return journal

    def retire_run(self, run_id, software_dir, state=RunState.RETIRED, since=T0, module_file=None):
        """A retire journal for ``software_dir`` (its module file already moved away)."""
        module_file = module_file or self.modules / "all" / "Moved" / "1.0.lua"
        journal = retire_journal(
            self.runs,
            run_id,
            state=state,
            module_file=module_file,
            software_dir=software_dir,
            retired_at=since.isoformat(),
        )
        _age(journal, since)
        return journal

    def gc(self, now, **kwargs):
        return gc.gc(str(self.state_root), now=now, **kwargs)


def _age(journal, since):
    journal.run.state_since = since.isoformat()
    journal.run.created = since.isoformat()
    journal.save()


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def _identity(path):
    return (os.lstat(path).st_ino, (path / "PAYLOAD").read_text())


# the grace period


def test_a_sibling_inside_the_grace_period_is_kept(site):
    site.publish_run("run1")

    report = site.gc(now=T0 + GRACE - datetime.timedelta(microseconds=1))

    assert report["kept"] == [
        {"path": str(site.sibling("TinyApp/1.0", "run1")), "run_id": "run1", "why": "grace period"}
    ]
    assert report["removed"] == []
    assert report["changed"] is False
    assert site.sibling("TinyApp/1.0", "run1").is_dir()


def test_a_sibling_is_removed_when_the_grace_period_has_just_elapsed(site):
    site.publish_run("run1")
    live = _identity(site.stable("TinyApp/1.0"))

    report = site.gc(now=T0 + GRACE)

    assert report["removed"] == [{"path": str(site.sibling("TinyApp/1.0", "run1")), "run_id": "run1"}]
    assert report["changed"] is True
    assert not os.path.lexists(site.sibling("TinyApp/1.0", "run1"))
    assert _identity(site.stable("TinyApp/1.0")) == live


def test_the_default_grace_is_120_hours_of_walltime_plus_24(site):
    assert settings.DEFAULT_GRACE_HOURS == 144.0
    assert site.gc(now=T0)["grace_hours"] == 144.0


@pytest.mark.parametrize(
    ("grace_hours", "elapsed", "removed"),
    [
        (1.5, datetime.timedelta(minutes=89, seconds=59), False),
        (1.5, datetime.timedelta(minutes=90), True),
        (0, datetime.timedelta(0), True),
        (24, datetime.timedelta(hours=23), False),
        (24, datetime.timedelta(days=30), True),
    ],
)
def test_the_grace_period_is_the_given_hours_after_the_last_change_of_state(
    site, grace_hours, elapsed, removed
):
    site.publish_run("run1")

    report = site.gc(now=T0 + elapsed, grace_hours=grace_hours)

    assert bool(report["removed"]) is removed
    assert os.path.lexists(site.sibling("TinyApp/1.0", "run1")) is not removed


def test_the_grace_period_counts_from_state_since_not_from_creation(site):
    journal = site.publish_run("run1")
    journal.run.created = (T0 - 30 * 24 * HOUR).isoformat()
    journal.save()

    report = site.gc(now=T0 + HOUR)

    assert report["removed"] == []
    assert site.sibling("TinyApp/1.0", "run1").is_dir()


def test_the_grace_period_counts_from_creation_when_state_since_is_missing(site):
    journal = site.publish_run("run1")
    journal.run.state_since = None
    journal.save()
    assert json.loads(Path(journal.path).read_text())["state_since"] is None

    assert site.gc(now=T0 + GRACE - datetime.timedelta(microseconds=1))["removed"] == []
    assert site.gc(now=T0 + GRACE)["removed"] != []


def test_a_dry_run_lists_what_it_would_remove_and_removes_nothing(site):
    site.publish_run("run1")
    generation = site.software / ".eb-staged-rebuild" / "run1"
    generation.mkdir(parents=True)

    report = site.gc(now=T0 + GRACE, dry_run=True)

    assert report["removed"] == [{"path": str(site.sibling("TinyApp/1.0", "run1")), "run_id": "run1"}]
    assert (report["changed"], report["dry_run"]) == (False, True)
    assert site.sibling("TinyApp/1.0", "run1").is_dir()
    assert generation.is_dir()


def test_a_sibling_that_is_gone_already_is_not_reported(site):
    site.publish_run("run1")
    site.sibling("TinyApp/1.0", "run1").joinpath("PAYLOAD").unlink()
    site.sibling("TinyApp/1.0", "run1").rmdir()

    report = site.gc(now=T0 + GRACE)

    assert (report["removed"], report["kept"], report["changed"]) == ([], [], False)


def test_each_run_is_judged_by_its_own_clock(site):
    site.publish_run("old-run", "TinyApp/1.0", since=T0)
    site.publish_run("new-run", "TinyLib/1.0", since=T0 + 100 * HOUR)

    report = site.gc(now=T0 + GRACE)

    assert [entry["run_id"] for entry in report["removed"]] == ["old-run"]
    assert [entry["run_id"] for entry in report["kept"]] == ["new-run"]


def test_the_runs_build_area_goes_with_its_siblings(site):
    site.publish_run("run1")
    generation = site.software / ".eb-staged-rebuild" / "run1"
    (generation / "software").mkdir(parents=True)

    site.gc(now=T0 + GRACE - HOUR)
    assert generation.is_dir()

    site.gc(now=T0 + GRACE)
    assert not os.path.lexists(generation)


def test_a_multi_module_run_removes_every_recorded_sibling(site):
    site.publish_run("run1", "TinyLib/1.0", "TinyApp/1.0")

    report = site.gc(now=T0 + GRACE)

    assert sorted(entry["path"] for entry in report["removed"]) == sorted(
        [str(site.sibling("TinyApp/1.0", "run1")), str(site.sibling("TinyLib/1.0", "run1"))]
    )
    assert site.stable("TinyApp/1.0").is_dir()
    assert site.stable("TinyLib/1.0").is_dir()


# what gc refuses to remove


def test_a_journal_doctored_to_name_the_stable_path_stops_gc_and_the_stable_path_stays(site):
    stable = str(site.stable("TinyApp/1.0"))
    site.publish_run("run1", retired_paths={"TinyApp/1.0": stable})
    live = _identity(site.stable("TinyApp/1.0"))

    with pytest.raises(errors.JournalError) as raised:
        site.gc(now=T0 + 10 * GRACE)

    # Refused as the journal is loaded: the retired path is not where the run puts it.
    assert str(raised.value) == (
        f"journal {site.runs / 'run1' / 'journal.json'}: modules[0].retired_path {stable} "
        "is not <software>/TinyApp/.1.0.run1"
    )
    assert _identity(site.stable("TinyApp/1.0")) == live


@pytest.mark.parametrize(
    "doctored",
    [
        "{software}/TinyApp/.1.0.other-run",
        "{software}/TinyApp/1.0/.",
        "{software}/TinyApp",
        "{software}/Other/.1.0.run1",
        "{software}/TinyApp/sub/.1.0.run1",
    ],
)
def test_a_journal_naming_anything_but_the_runs_hidden_sibling_stops_gc(site, doctored):
    site.publish_run("run1")
    target = doctored.format(software=site.software)
    os.makedirs(target, exist_ok=True)
    before = {path: _identity(site.software / path) for path in ("TinyApp/1.0", "TinyApp/.1.0.run1")}
    journal = journals.find(str(site.state_root), "run1")
    journal.modules[0].retired_path = target
    journal.save()

    with pytest.raises(
        errors.JournalError, match=r"modules\[0\]\.retired_path .* is not <software>/TinyApp/\.1\.0\.run1$"
    ):
        site.gc(now=T0 + 10 * GRACE)

    assert os.path.isdir(target)
    assert {path: _identity(site.software / path) for path in before} == before


def test_a_journal_naming_a_path_that_climbs_with_dot_dot_is_not_read_and_gc_stops(site):
    # {software}/TinyApp/1.0/.. is {software}/TinyApp: the typed journal refuses any ".." path.
    site.publish_run("run1")
    before = {path: _identity(site.software / path) for path in ("TinyApp/1.0", "TinyApp/.1.0.run1")}
    climbing = f"{site.software}/TinyApp/1.0/.."
    journal = journals.find(str(site.state_root), "run1")
    journal.modules[0].retired_path = climbing
    journal.save()

    with pytest.raises(errors.JournalError) as raised:
        site.gc(now=T0 + 10 * GRACE)

    assert str(raised.value) == (
        f"journal {journal.path}: modules[0].retired_path must be an absolute path without '..', "
        f"not {climbing!r}"
    )
    assert {path: _identity(site.software / path) for path in before} == before


def test_a_sibling_that_is_a_symlink_stops_gc_and_its_target_stays(site, tmp_path):
    site.publish_run("run1")
    sibling = site.sibling("TinyApp/1.0", "run1")
    (sibling / "PAYLOAD").unlink()
    sibling.rmdir()
    target = tmp_path / "precious"
    target.mkdir()
    (target / "PAYLOAD").write_text("precious\n")
    sibling.symlink_to(target)

    with pytest.raises(errors.JournalError, match=r"modules\[0\]\.retired_path: .* is a symbolic link"):
        site.gc(now=T0 + 10 * GRACE)

    assert (target / "PAYLOAD").read_text() == "precious\n"


def test_a_sibling_reached_through_a_symlinked_name_directory_is_not_removed(site, tmp_path):
    # The journal is the run's own; afterwards someone replaced software/TinyApp by a link to
    # another tree. The recorded names still match, but they now lead out of the software root.
    site.publish_run("run1")
    elsewhere = tmp_path / "elsewhere"
    os.rename(site.software / "TinyApp", elsewhere)
    (site.software / "TinyApp").symlink_to(elsewhere)

    with pytest.raises(errors.HpcstackError):
        site.gc(now=T0 + 10 * GRACE)

    assert (elsewhere / ".1.0.run1" / "PAYLOAD").read_text() == "old\n"


def test_a_recorded_sibling_outside_the_runs_software_root_is_not_removed(site, tmp_path):
    # A consistent pair of stable and retired paths that lies outside the journal's trees.
    site.publish_run("run1")
    outside = tmp_path / "home" / "user"
    (outside / ".data.run1").mkdir(parents=True)
    (outside / ".data.run1" / "thesis.tex").write_text("precious\n")
    journal = journals.find(str(site.state_root), "run1")
    journal.modules[0].stable_path = str(outside / "data")
    journal.modules[0].retired_path = str(outside / ".data.run1")
    journal.save()

    with pytest.raises(errors.HpcstackError):
        site.gc(now=T0 + 10 * GRACE)

    assert (outside / ".data.run1" / "thesis.tex").read_text() == "precious\n"


def test_one_unreadable_journal_stops_gc_before_anything_is_removed(site):
    site.publish_run("run1")
    (site.runs / "run2").mkdir()
    (site.runs / "run2" / "journal.json").write_text('{"schema": 2, "kind"')

    with pytest.raises(errors.JournalError, match="truncated"):
        site.gc(now=T0 + GRACE)

    assert site.sibling("TinyApp/1.0", "run1").is_dir()


# interrupted runs


@pytest.mark.parametrize(
    "state", [RunState.BUILDING, RunState.PLANNING, RunState.PUBLISHING, RunState.ROLLING_BACK]
)
def test_an_interrupted_publish_run_is_reported_and_its_sibling_kept(site, state):
    site.publish_run("run1", state=state)

    report = site.gc(now=T0 + 10 * GRACE)

    assert report["interrupted"] == [
        {"run_id": "run1", "state": state.value, "why": "interrupted: 'eb-staged-rebuild resume'"}
    ]
    assert report["removed"] == []
    assert site.sibling("TinyApp/1.0", "run1").is_dir()


def test_an_interrupted_retire_is_reported_with_its_rollback_command(site):
    site.retire_run("retire-1", site.software / "Moved" / "1.0", state=RunState.RETIRING)

    report = site.gc(now=T0 + 10 * GRACE)

    assert report["interrupted"] == [
        {
            "run_id": "retire-1",
            "state": "retiring",
            "why": "interrupted: 'eb-staged-rebuild rollback retire-1'",
        }
    ]
    assert (report["kept"], report["manual"]) == ([], [])


@pytest.mark.parametrize("state", [RunState.FAILED, RunState.ROLLED_BACK])
def test_a_finished_run_that_did_not_publish_is_collected_too(site, state):
    site.publish_run("run1", state=state)

    report = site.gc(now=T0 + GRACE)

    assert report["interrupted"] == []
    assert [entry["run_id"] for entry in report["removed"]] == ["run1"]


def test_a_state_root_without_runs_reports_nothing(site):
    report = site.gc(now=T0)

    assert report == {
        "removed": [],
        "kept": [],
        "manual": [],
        "interrupted": [],
        "incomplete": [],
        "staged": [],
        "queued": [],
        "candidates": [],
        # Nothing to look for: /proc is not read at all.
        "processes": {
            "scanned": 0,
            "unreadable": 0,
            "as_uid": os.geteuid(),
            "seen": "every process of this node's pid namespace"
            if os.geteuid() == 0
            else f"only the processes of uid {os.geteuid()} of this node's pid namespace",
        },
        "slurm": {"answered": False, "why": "not asked (--no-squeue)", "fallback": "grace period"},
        "changed": False,
        "dry_run": False,
        "grace_hours": settings.DEFAULT_GRACE_HOURS,
    }


# retired module files: keep or manual, never deleted


def _software_dir(site, name="Moved"):
    path = site.software / name / "1.0"
    (path / "bin").mkdir(parents=True)
    return path


def test_a_retired_software_dir_is_kept_during_the_grace_period(site):
    software_dir = _software_dir(site)
    site.retire_run("retire-1", software_dir)

    report = site.gc(now=T0 + GRACE - HOUR)

    assert report["kept"] == [{"path": str(software_dir), "run_id": "retire-1", "why": "grace period"}]
    assert report["manual"] == []
    assert software_dir.is_dir()


def test_a_retired_software_dir_is_manual_after_the_grace_period_and_stays(site):
    software_dir = _software_dir(site)
    site.retire_run("retire-1", software_dir)

    report = site.gc(now=T0 + GRACE)

    assert report["manual"] == [
        {
            "path": str(software_dir),
            "run_id": "retire-1",
            "why": "retired; no tracked module uses it: delete it by hand when sure",
        }
    ]
    assert (report["kept"], report["removed"], report["changed"]) == ([], [], False)
    assert (software_dir / "bin").is_dir()


def test_a_retired_software_dir_still_used_by_a_published_module_is_kept(site):
    # A publish run's live module file (root = software/TinyApp/1.0) still resolves inside it.
    site.publish_run("run1", since=T0 + HOUR)
    site.retire_run("retire-1", site.stable("TinyApp/1.0"))

    report = site.gc(now=T0 + 10 * GRACE)

    assert {
        "path": str(site.stable("TinyApp/1.0")),
        "run_id": "retire-1",
        "why": "a tracked module file uses it",
    } in report["kept"]
    assert report["manual"] == []
    assert site.stable("TinyApp/1.0").is_dir()


def test_a_module_file_that_a_rolled_back_retire_put_back_keeps_its_software_dir(site):
    software_dir = _software_dir(site)
    module_file = site.modules / "all" / "Moved" / "1.0.lua"
    module_file.parent.mkdir(parents=True)
    module_file.write_text(f'local root = "{software_dir}/bin/.."\n')
    site.retire_run("retire-1", software_dir, state=RunState.ROLLED_BACK, module_file=module_file)
    site.retire_run("retire-2", software_dir, since=T0 + HOUR)

    report = site.gc(now=T0 + 10 * GRACE)

    assert report["kept"] == [
        {"path": str(software_dir), "run_id": "retire-2", "why": "a tracked module file uses it"}
    ]


def test_a_rolled_back_retire_is_not_itself_reported(site):
    site.retire_run("retire-1", _software_dir(site), state=RunState.ROLLED_BACK)

    report = site.gc(now=T0 + 10 * GRACE)

    assert (report["kept"], report["manual"], report["interrupted"]) == ([], [], [])


def test_a_tracked_root_that_only_shares_a_prefix_does_not_keep_a_retired_dir(site):
    # software/Moved/1.0-extra is not inside software/Moved/1.0.
    site.publish_run("run1", "Moved/1.0-extra")
    software_dir = _software_dir(site)
    site.retire_run("retire-1", software_dir)

    report = site.gc(now=T0 + GRACE)

    assert [entry["path"] for entry in report["manual"]] == [str(software_dir)]


def test_a_sibling_that_is_not_the_directory_the_run_left_stops_gc_and_stays(site):
    # Same name, another directory: what a journal moved whole to another tree would name.
    site.publish_run("run1")
    sibling = site.sibling("TinyApp/1.0", "run1")
    os.rename(sibling, site.software / "TinyApp" / "moved-away")
    (sibling / "PAYLOAD").parent.mkdir()
    (sibling / "PAYLOAD").write_text("precious\n")

    with pytest.raises(errors.JournalError) as raised:
        site.gc(now=T0 + 10 * GRACE)

    assert str(raised.value) == (
        f"run run1 records {sibling}, which is not the tree the run left there "
        "(neither the live nor the staged inode it recorded); gc stops"
    )
    assert (sibling / "PAYLOAD").read_text() == "precious\n"


def test_a_sibling_of_a_run_that_recorded_no_inode_stops_gc_and_stays(site):
    # A failed run may have stopped before it recorded them (a published one is refused when
    # loaded: test_journal's invariants).
    journal = site.publish_run("run1", state=RunState.FAILED)
    journal.modules[0].stage_ino = journal.modules[0].live_ino = None
    journal.save()

    with pytest.raises(errors.JournalError, match="gc stops"):
        site.gc(now=T0 + 10 * GRACE)

    assert site.sibling("TinyApp/1.0", "run1").is_dir()


def test_a_sibling_holding_the_stage_of_a_reversed_run_is_removed(site):
    # After a rollback (or a reversed swap) the sibling holds the stage, whose inode the run
    # recorded as stage_ino.
    journal = site.publish_run("run1", state=RunState.ROLLED_BACK)
    entry = journal.modules[0]
    entry.stage_ino, entry.live_ino = entry.live_ino, entry.stage_ino
    journal.save()

    report = site.gc(now=T0 + 10 * GRACE)

    assert [item["path"] for item in report["removed"]] == [str(site.sibling("TinyApp/1.0", "run1"))]
