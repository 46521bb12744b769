"""hpcstack.ops.staged_retire: ``main()`` run with module arguments, its JSON result read back.

A retire needs no build: the live tree is laid out by the test builder ``fake-eb`` (a module
file whose ``root`` names its install directory), the state root sits beside it. Each test
compares snapshots of both trees (type, mode, owner, inode and bytes of every entry) to show
what changed on disk and what did not.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    module_support,
    settings,
)
from ansible_collections.hpcstack.ops.plugins.modules import staged_retire
from tests.support.module_runner import APP, assert_failed_with, disk, run_on_site

REASON = "TinyApp/1.0 is now on /cvmfs"


def _retire(capsys, site, module_file=None, **args):
    """Run the module on ``module_file`` (default: APP's); returns its result."""
    params = {"module_file": str(module_file or site.module_file(APP)), "reason": REASON}
    params.update(args)
    return run_on_site(capsys, staged_retire, site, **params)


# a retire, and a second one


def test_a_retire_moves_the_module_file_into_the_state_root(capsys, site):
    module_file = site.module_file(APP)
    data = module_file.read_bytes()

    result = _retire(capsys, site)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["state"] == "retired"
    assert result["run_id"].startswith("retire-")
    assert result["module_file"] == str(module_file)
    assert not os.path.lexists(module_file)
    assert result["retired_to"].startswith(str(site.state_root / "retired") + "/")
    with open(result["retired_to"], "rb") as retired:
        assert retired.read() == data
    assert site.live(APP).is_dir()


def test_a_second_retire_changes_nothing_and_names_the_first_run(capsys, site):
    first = _retire(capsys, site)
    before = disk(site)

    again = _retire(capsys, site)

    assert "failed" not in again
    assert again["changed"] is False
    assert again["run_id"] == first["run_id"]
    assert again["state"] == "retired"
    assert again["retired_to"] == first["retired_to"]
    assert disk(site) == before


def test_the_state_root_can_come_from_the_hosts_environment(capsys, site, monkeypatch):
    monkeypatch.setenv(settings.STATE_ROOT_VARIABLE, str(site.state_root))

    result = _retire(capsys, site, state_root=None)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["retired_to"].startswith(str(site.state_root) + "/")


# check mode


def test_check_mode_predicts_the_retire_and_leaves_both_trees_as_they_were(capsys, site):
    before = disk(site)

    result = _retire(capsys, site, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is True
    assert result["dry_run"] is True
    assert disk(site) == before
    assert not site.state_root.exists()


def test_check_mode_after_a_retire_reports_no_change(capsys, site):
    _retire(capsys, site)
    before = disk(site)

    result = _retire(capsys, site, check_mode=True)

    assert "failed" not in result
    assert result["changed"] is False
    assert disk(site) == before


# diff mode


def test_diff_mode_shows_the_module_file_before_and_its_absence_after(capsys, site):
    module_file = site.module_file(APP)
    text = module_file.read_text()

    result = _retire(capsys, site, diff=True)

    assert result["diff"] == {
        "before": f"# {module_file}\n{text}",
        "after": f"# {module_file}\n{module_support.NO_MODULE_FILE}",
    }


def test_diff_in_check_mode_predicts_the_same_diff_and_changes_nothing(capsys, site):
    module_file = site.module_file(APP)
    text = module_file.read_text()
    before = disk(site)

    result = _retire(capsys, site, diff=True, check_mode=True)

    assert result["diff"] == {
        "before": f"# {module_file}\n{text}",
        "after": f"# {module_file}\n{module_support.NO_MODULE_FILE}",
    }
    assert disk(site) == before


def test_diff_of_a_second_retire_is_empty(capsys, site):
    _retire(capsys, site)

    result = _retire(capsys, site, diff=True)

    assert result["diff"]["before"] == result["diff"]["after"]
    assert result["diff"]["after"].endswith(module_support.NO_MODULE_FILE)


# errors: failed, the core's one line, nothing changed


def test_no_state_root_and_no_variable_fails(capsys, site):
    before = disk(site)

    result = _retire(capsys, site, state_root=None)

    assert_failed_with(result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT")
    assert disk(site) == before


def test_a_missing_module_file_fails(capsys, site):
    missing = site.modules_all / "TinyApp" / "2.0.lua"
    before = disk(site)

    result = _retire(capsys, site, module_file=missing)

    assert_failed_with(result, f"module file {missing} does not exist (already retired?)")
    assert disk(site) == before


def test_a_retire_after_its_rollback_is_a_new_run(capsys, site):
    first = _retire(capsys, site)
    commands.roll_back(str(site.state_root), first["run_id"], 0.0)

    again = _retire(capsys, site)

    assert "failed" not in again
    assert again["changed"] is True
    assert again["run_id"] != first["run_id"]
    assert not os.path.lexists(site.module_file(APP))


def test_a_file_gone_after_its_retire_was_rolled_back_fails_as_missing(capsys, site):
    # Only a retire that still holds the file counts as done; this one gave it back.
    first = _retire(capsys, site)
    commands.roll_back(str(site.state_root), first["run_id"], 0.0)
    site.module_file(APP).unlink()
    before = disk(site)

    result = _retire(capsys, site)

    assert_failed_with(result, f"module file {site.module_file(APP)} does not exist (already retired?)")
    assert disk(site) == before


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_blank_reason_fails(capsys, site, reason):
    before = disk(site)

    result = _retire(capsys, site, reason=reason)

    assert_failed_with(result, "retire needs reason TEXT")
    assert disk(site) == before


def test_a_module_file_without_a_root_assignment_fails(capsys, site):
    module_file = site.modules_all / "Other" / "1.0.lua"
    module_file.parent.mkdir()
    module_file.write_text('help([[no root here]])\nsetenv("OTHER", "1")\n')
    before = disk(site)

    result = _retire(capsys, site, module_file=module_file)

    assert_failed_with(result, f"module file {module_file} has no root assignment; refusing to retire it")
    assert disk(site) == before


def test_a_module_file_that_is_a_symlink_fails(capsys, site):
    link = site.modules_all / "TinyApp" / "latest.lua"
    link.symlink_to(site.module_file(APP))
    before = disk(site)

    result = _retire(capsys, site, module_file=link, diff=True)

    assert_failed_with(result, f"{link} is a symbolic link (in {link}); symlink components are refused")
    assert disk(site) == before


def test_a_module_file_under_a_symlinked_directory_fails(capsys, site):
    linked = site.modules_all / "Linked"
    linked.symlink_to(site.modules_all / "TinyApp")
    module_file = linked / "1.0.lua"
    before = disk(site)

    result = _retire(capsys, site, module_file=module_file)

    assert_failed_with(
        result, f"{linked} is a symbolic link (in {module_file}); symlink components are refused"
    )
    assert disk(site) == before


def test_a_fifo_fails_in_diff_mode_without_blocking_on_it(capsys, site):
    # The diff's snapshot is taken before the core checks the path: it must not open a FIFO
    # for reading (that would wait for a writer forever).
    fifo = site.modules_all / "TinyApp" / "2.0.lua"
    os.mkfifo(fifo)
    before = disk(site)

    result = _retire(capsys, site, module_file=fifo, diff=True)

    assert_failed_with(result, f"{fifo} is not a regular file; only a module file can be retired")
    assert disk(site) == before


def test_a_negative_lock_timeout_fails(capsys, site):
    before = disk(site)

    result = _retire(capsys, site, lock_timeout=-1)

    assert_failed_with(result, "lock_timeout must be 0 or more seconds, not -1.0", error="usage")
    assert disk(site) == before
