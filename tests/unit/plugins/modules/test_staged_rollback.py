"""hpcstack.ops.staged_rollback: ``main()`` run with module arguments, its JSON result read back.

The runs are real: a rebuild published by the core with the test builder ``fake-eb`` (the
installpath backend, which swaps the new tree in and keeps the old one as the hidden sibling),
and a retire of a module file. Snapshots of the live tree and the state root (type, mode,
owner, inode and bytes of every entry) show what changed on disk and what did not.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    module_support,
    settings,
)
from ansible_collections.hpcstack.ops.plugins.modules import staged_rollback
from tests.support.module_runner import APP, assert_failed_with, disk, run_on_site
from tests.support.staged import StagedSite, publish_in_process

RUN = "run1"


class Published(NamedTuple):
    """A site where APP was installed, then rebuilt by run RUN; what was live before that run."""

    site: StagedSite
    old_inode: int
    old_module: bytes


class Retired(NamedTuple):
    """A site whose module file of APP a retire run moved away; the file's bytes before."""

    site: StagedSite
    run_id: str
    data: bytes


@pytest.fixture
def published(site):
    old_inode = os.lstat(site.live(APP)).st_ino
    old_module = site.module_file(APP).read_bytes()
    publish_in_process(site, APP, RUN)
    assert site.payload(APP) == "new build"
    return Published(site, old_inode, old_module)


@pytest.fixture
def retired(site):
    data = site.module_file(APP).read_bytes()
    run_id = commands.retire_module(str(site.state_root), str(site.module_file(APP)), "on /cvmfs")["run_id"]
    return Retired(site, run_id, data)


def _rollback(capsys, site, run_id=RUN, **args):
    """Run the module; returns its result."""
    return run_on_site(capsys, staged_rollback, site, run_id=run_id, **args)


def _rendered(site, live_inode):
    """What diff mode shows for APP: the live directory's inode, then the module file."""
    module_file = site.module_file(APP)
    return f"# {APP}: {site.live(APP)} inode {live_inode}\n# {module_file}\n{module_file.read_text()}"


# rolling back a rebuild, and a second time


def test_rollback_puts_the_old_tree_and_module_file_back(capsys, published):
    site, old_inode, old_module = published

    result = _rollback(capsys, site)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["run_id"] == RUN
    assert result["state"] == "rolled_back"
    assert os.lstat(site.live(APP)).st_ino == old_inode
    assert site.payload(APP) == "old"
    assert site.module_file(APP).read_bytes() == old_module


def test_a_second_rollback_changes_nothing(capsys, published):
    site = published.site
    _rollback(capsys, site)
    before = disk(site)

    again = _rollback(capsys, site)

    assert "failed" not in again
    assert again["changed"] is False
    assert again["state"] == "rolled_back"
    assert disk(site) == before


# check mode


def test_check_mode_predicts_the_rollback_and_changes_nothing(capsys, published):
    site = published.site
    before = disk(site)

    result = _rollback(capsys, site, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["dry_run"] is True
    assert result["state"] == "published"
    assert disk(site) == before


def test_check_mode_after_a_rollback_reports_no_change(capsys, published):
    site = published.site
    _rollback(capsys, site)
    before = disk(site)

    result = _rollback(capsys, site, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is False
    assert disk(site) == before


# diff mode


def test_diff_mode_shows_the_live_inode_and_module_file_before_and_after(capsys, published):
    site, old_inode = published.site, published.old_inode
    before = _rendered(site, os.lstat(site.live(APP)).st_ino)

    result = _rollback(capsys, site, diff=True)

    assert result["diff"] == {"before": before, "after": _rendered(site, old_inode)}
    assert result["diff"]["before"] != result["diff"]["after"]


def test_diff_in_check_mode_shows_the_live_directory_replaced_and_changes_nothing(capsys, published):
    site = published.site
    before_text = _rendered(site, os.lstat(site.live(APP)).st_ino)
    before = disk(site)

    result = _rollback(capsys, site, diff=True, check_mode=True)

    module_file = site.module_file(APP)
    assert result["diff"] == {
        "before": before_text,
        "after": f"# {APP}: {site.live(APP)} replaced by a new directory\n"
        f"# {module_file}\n{module_file.read_text()}",
    }
    assert disk(site) == before


def test_diff_of_a_second_rollback_is_empty(capsys, published):
    site = published.site
    _rollback(capsys, site)

    result = _rollback(capsys, site, diff=True)

    assert result["diff"]["before"] == result["diff"]["after"]


# rolling back a retire


def test_rollback_of_a_retire_moves_the_module_file_back(capsys, retired):
    site, run_id, data = retired

    result = _rollback(capsys, site, run_id=run_id)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["state"] == "rolled_back"
    assert result["module_file"] == str(site.module_file(APP))
    assert site.module_file(APP).read_bytes() == data


def test_a_second_rollback_of_a_retire_changes_nothing(capsys, retired):
    site, run_id = retired.site, retired.run_id
    _rollback(capsys, site, run_id=run_id)
    before = disk(site)

    again = _rollback(capsys, site, run_id=run_id)

    assert "failed" not in again
    assert again["changed"] is False
    assert disk(site) == before


def test_check_mode_on_a_retire_changes_nothing(capsys, retired):
    site, run_id = retired.site, retired.run_id
    before = disk(site)

    result = _rollback(capsys, site, run_id=run_id, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["state"] == "retired"
    assert not os.path.lexists(site.module_file(APP))
    assert disk(site) == before


def test_diff_of_a_retire_rollback_shows_the_module_file_coming_back(capsys, retired):
    site, run_id, data = retired
    module_file = site.module_file(APP)

    result = _rollback(capsys, site, run_id=run_id, diff=True)

    assert result["diff"] == {
        "before": f"# {module_file}\n{module_support.NO_MODULE_FILE}",
        "after": f"# {module_file}\n{data.decode()}",
    }


def test_diff_of_a_retire_rollback_in_check_mode_predicts_the_retired_copy(capsys, retired):
    site, run_id = retired.site, retired.run_id
    module_file = site.module_file(APP)
    before = disk(site)

    result = _rollback(capsys, site, run_id=run_id, diff=True, check_mode=True)

    assert result["diff"] == {
        "before": f"# {module_file}\n{module_support.NO_MODULE_FILE}",
        "after": f"# {module_file}\n(the retired copy)\n",
    }
    assert disk(site) == before


# errors: failed, the core's one line, nothing changed


def test_no_state_root_and_no_variable_fails(capsys, published):
    site = published.site
    before = disk(site)

    result = _rollback(capsys, site, state_root=None)

    assert_failed_with(result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT")
    assert disk(site) == before


def test_the_state_root_can_come_from_the_hosts_environment(capsys, published, monkeypatch):
    site, old_inode = published.site, published.old_inode
    monkeypatch.setenv(settings.STATE_ROOT_VARIABLE, str(site.state_root))

    result = _rollback(capsys, site, state_root=None)

    assert "failed" not in result
    assert result["changed"] is True
    assert os.lstat(site.live(APP)).st_ino == old_inode


def test_a_state_root_without_runs_fails(capsys, site):
    before = disk(site)

    result = _rollback(capsys, site)

    assert_failed_with(
        result, f"state root {site.state_root} has no runs (nothing was ever published with it)"
    )
    assert disk(site) == before


@pytest.mark.parametrize("check_mode", [False, True])
def test_an_unknown_run_id_fails(capsys, published, check_mode):
    site = published.site
    before = disk(site)

    result = _rollback(capsys, site, run_id="nope", check_mode=check_mode)

    assert_failed_with(result, f"no run nope under {site.state_root}/runs")
    assert disk(site) == before


@pytest.mark.parametrize("run_id", ["../x", "..", "a/b"])
def test_a_run_id_that_is_not_a_plain_name_fails(capsys, published, run_id):
    site = published.site
    before = disk(site)

    result = _rollback(capsys, site, run_id=run_id)

    assert_failed_with(result, f"run id {run_id!r} is not a plain name ([A-Za-z0-9._-], at most 128)")
    assert disk(site) == before


def test_a_symlinked_state_root_fails(capsys, published, tmp_path):
    site = published.site
    link = tmp_path / "state-link"
    link.symlink_to(site.state_root)
    before = disk(site)

    result = _rollback(capsys, site, state_root=str(link))

    assert_failed_with(result, f"{link} is a symbolic link (in {link}); symlink components are refused")
    assert disk(site) == before


def test_a_run_whose_old_tree_gc_removed_fails(capsys, published):
    site = published.site
    commands.collect_garbage(str(site.state_root), 0, 0.0)
    sibling = site.software / "TinyApp" / f".1.0.{RUN}"
    before = disk(site)

    result = _rollback(capsys, site)

    assert_failed_with(result, f"run {RUN}: the retired tree {sibling} is gone (collected by gc?)")
    assert disk(site) == before
    assert site.payload(APP) == "new build"


def test_a_rollback_stopped_between_moving_the_file_back_and_its_journal_is_finished_by_the_next(
    capsys, retired
):
    # The state a rollback leaves when its last journal write fails (a full disk, a runs/
    # swapped for a link): the file is back, the journal still says retired.
    site, run_id, data = retired
    journal = site.state_root / "runs" / run_id / "journal.json"
    os.rename(json.loads(journal.read_text())["retired_to"], site.module_file(APP))

    result = _rollback(capsys, site, run_id=run_id)

    assert "failed" not in result
    assert (result["changed"], result["state"]) == (True, "rolled_back")
    assert json.loads(journal.read_text())["state"] == "rolled_back"
    assert site.module_file(APP).read_bytes() == data


def test_a_retire_whose_module_file_exists_again_fails(capsys, retired):
    site, run_id = retired.site, retired.run_id
    module_file = site.module_file(APP)
    module_file.write_text('local root = "/elsewhere"\n')
    before = disk(site)

    result = _rollback(capsys, site, run_id=run_id)

    assert_failed_with(result, f"{module_file} exists again; refusing to overwrite it with the retired copy")
    assert disk(site) == before


def test_a_negative_lock_timeout_fails(capsys, published):
    site = published.site
    before = disk(site)

    result = _rollback(capsys, site, lock_timeout=-1)

    assert_failed_with(result, "lock_timeout must be 0 or more seconds, not -1.0", error="usage")
    assert disk(site) == before
