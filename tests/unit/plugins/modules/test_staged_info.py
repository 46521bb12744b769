"""hpcstack.ops.staged_info: ``main()`` run with module arguments, its JSON result read back.

The runs are real: a rebuild published by the core with the test builder ``fake-eb`` (the
installpath backend) and a retire of another module file. The probe runs for real on the
live software tree, with small scripts standing in for ``eb --version``. Snapshots of the
live tree and the state root (type, mode, owner, inode and bytes of every entry) show that
nothing on disk changes, whatever the mode.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import commands, settings
from ansible_collections.hpcstack.ops.plugins.modules import staged_info
from tests.support.module_runner import APP, assert_failed_with, disk, run_on_site
from tests.support.staged import publish_in_process

OTHER = "TinyLib/1.0"
RUN = "run1"
BANNER = "This is EasyBuild 5.4.2 (framework: 5.4.2, easyblocks: 5.4.2) on host node01."


@pytest.fixture
def runs(site):
    """``site`` after a published rebuild of APP, then a retire of OTHER's module file (whose
    run id is in ``site.retire_run``)."""
    site.install(OTHER)
    publish_in_process(site, APP, RUN)
    retired = commands.retire_module(str(site.state_root), str(site.module_file(OTHER)), "on /cvmfs")
    site.retire_run = retired["run_id"]
    return site


def _eb(tmp_path, banner=BANNER):
    """An ``eb`` that prints ``banner`` for ``--version``, in a directory of its own."""
    bin_dir = tmp_path / "eb-bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "eb"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(f"echo '{banner}'\n"))
    path.chmod(0o755)
    return path


def _info(capsys, site, **args):
    """Run the module; returns its result."""
    return run_on_site(capsys, staged_info, site, **args)


def _without_invocation(result):
    return {key: value for key, value in result.items() if key != "invocation"}


# listing runs, one run, a second call


def test_info_lists_every_run_oldest_first_and_changes_nothing(capsys, runs):
    before = disk(runs)

    result = _info(capsys, runs)

    assert "failed" not in result
    assert result["changed"] is False
    assert [(run["run_id"], run["kind"], run["state"]) for run in result["runs"]] == [
        (RUN, "publish", "published"),
        (runs.retire_run, "retire", "retired"),
    ]
    assert result["runs"][0]["modules"][0]["retired_path_exists"] is True
    assert result["runs"][1]["module_file"] == str(runs.module_file(OTHER))
    assert result["runs"][1]["reason"] == "on /cvmfs"
    assert "run" not in result
    assert "probe" not in result
    assert disk(runs) == before


def test_info_shows_one_run_in_detail(capsys, runs):
    result = _info(capsys, runs, run_id=RUN)

    assert "failed" not in result
    assert result["changed"] is False
    assert result["run"]["run_id"] == RUN
    assert result["run"]["journal"] == str(runs.state_root / "runs" / RUN / "journal.json")
    assert result["run"]["steps"]
    assert "runs" not in result


def test_a_second_call_returns_the_same_and_changes_nothing(capsys, runs):
    first = _info(capsys, runs)
    before = disk(runs)

    again = _info(capsys, runs)

    assert "failed" not in again
    assert again == first
    assert again["changed"] is False
    assert disk(runs) == before


def test_the_state_root_can_come_from_the_hosts_environment(capsys, runs, monkeypatch):
    monkeypatch.setenv(settings.STATE_ROOT_VARIABLE, str(runs.state_root))

    result = _info(capsys, runs, state_root=None)

    assert "failed" not in result
    assert [run["run_id"] for run in result["runs"]] == [RUN, runs.retire_run]


def test_a_state_root_whose_runs_directory_is_empty_lists_no_runs(capsys, site):
    (site.state_root / "runs").mkdir(parents=True)

    result = _info(capsys, site)

    assert "failed" not in result
    assert result["runs"] == []


# check mode


def test_check_mode_returns_what_a_normal_call_returns_and_changes_nothing(capsys, runs):
    normal = _info(capsys, runs, run_id=RUN)
    before = disk(runs)

    checked = _info(capsys, runs, run_id=RUN, check_mode=True)

    assert "failed" not in checked
    assert checked["changed"] is False
    assert _without_invocation(checked) == _without_invocation(normal)
    assert disk(runs) == before


def test_diff_mode_adds_no_diff(capsys, runs):
    result = _info(capsys, runs, diff=True)

    assert "failed" not in result
    assert "diff" not in result


# the probe


def test_the_probe_reports_the_filesystem_and_the_easybuild_version(capsys, runs, tmp_path):
    before = disk(runs)

    result = _info(capsys, runs, probe_path=str(runs.software), eb=str(_eb(tmp_path)))

    assert "failed" not in result
    assert result["changed"] is False
    report = result["probe"]
    assert report["path"] == str(runs.software)
    assert report["easybuild_version"] == "5.4.2"
    assert isinstance(report["exchange"], bool)
    assert isinstance(report["recommendations"], list)
    assert [run["run_id"] for run in result["runs"]] == [RUN, runs.retire_run]
    # Its scratch directory inside the path is gone again: nothing differs, not even an inode.
    assert disk(runs) == before


def test_the_probe_in_check_mode_changes_nothing(capsys, runs, tmp_path):
    before = disk(runs)

    result = _info(capsys, runs, probe_path=str(runs.software), eb=str(_eb(tmp_path)), check_mode=True)

    assert "failed" not in result
    assert result["changed"] is False
    assert result["probe"]["easybuild_version"] == "5.4.2"
    assert disk(runs) == before


def test_the_eb_of_the_probe_can_come_from_the_hosts_environment(capsys, runs, tmp_path, monkeypatch):
    monkeypatch.setenv(settings.EB_VARIABLE, str(_eb(tmp_path, BANNER.replace("5.4.2", "5.4.3"))))

    result = _info(capsys, runs, probe_path=str(runs.software))

    assert "failed" not in result
    assert result["probe"]["easybuild_version"] == "5.4.3"


def test_the_eb_of_the_probe_is_else_found_on_path(capsys, runs, tmp_path, monkeypatch):
    eb = _eb(tmp_path, BANNER.replace("5.4.2", "5.5.0"))
    monkeypatch.setenv("PATH", f"{eb.parent}{os.pathsep}{os.environ['PATH']}")

    result = _info(capsys, runs, probe_path=str(runs.software))

    assert "failed" not in result
    assert result["probe"]["easybuild_version"] == "5.5.0"


def test_an_eb_that_does_not_run_is_reported_not_failed(capsys, runs, tmp_path):
    result = _info(capsys, runs, probe_path=str(runs.software), eb=str(tmp_path / "no-eb"))

    assert "failed" not in result
    assert result["probe"]["easybuild_version"] is None
    assert any(line.startswith("EasyBuild: not found") for line in result["probe"]["recommendations"])


# errors: failed, the core's one line, nothing changed


def test_no_state_root_and_no_variable_fails(capsys, runs):
    result = _info(capsys, runs, state_root=None)

    assert_failed_with(result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT")


def test_a_state_root_without_runs_fails(capsys, site):
    result = _info(capsys, site)

    assert_failed_with(
        result, f"state root {site.state_root} has no runs (nothing was ever published with it)"
    )
    assert not site.state_root.exists()


def test_an_unknown_run_id_fails(capsys, runs):
    before = disk(runs)

    result = _info(capsys, runs, run_id="nope")

    assert_failed_with(result, f"no run nope under {runs.state_root}/runs")
    assert disk(runs) == before


@pytest.mark.parametrize("run_id", ["../x", "..", "a/b"])
def test_a_run_id_that_is_not_a_plain_name_fails(capsys, runs, run_id):
    result = _info(capsys, runs, run_id=run_id)

    assert_failed_with(result, f"run id {run_id!r} is not a plain name ([A-Za-z0-9._-], at most 128)")


def test_a_symlinked_state_root_fails(capsys, runs, tmp_path):
    link = tmp_path / "state-link"
    link.symlink_to(runs.state_root)

    result = _info(capsys, runs, state_root=str(link))

    assert_failed_with(result, f"{link} is a symbolic link (in {link}); symlink components are refused")


def test_an_unreadable_journal_fails_with_its_path(capsys, runs):
    journal = runs.state_root / "runs" / "run2" / "journal.json"
    journal.parent.mkdir()
    journal.write_text("{")

    result = _info(capsys, runs)

    assert_failed_with(result, f"journal {journal}: truncated or not JSON (1 bytes)", error="journal")


def test_a_probe_path_that_is_not_a_directory_fails(capsys, runs, tmp_path):
    missing = tmp_path / "nowhere"
    before = disk(runs)

    result = _info(capsys, runs, probe_path=str(missing), eb=str(_eb(tmp_path)))

    assert_failed_with(result, f"probe path {missing}: not a directory")
    assert disk(runs) == before
    assert not missing.exists()
