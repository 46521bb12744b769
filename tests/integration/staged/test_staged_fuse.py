"""The whole command on a real FUSE mount (bindfs), where RENAME_EXCHANGE fails with EINVAL.

The live tree sits inside the mount and the state root outside it, as on a site whose
software lives on a shared filesystem without the exchange. Nothing stands in for the
kernel: the rebuild must publish through the restoring three-rename fallback, journal
each rename before it happens, and rollback and resume must work through the same
ordinary renames.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.harness.staged_checks import module_root, read_journal, run_tool
from tests.support.staged import StagedSite

APP = "TinyApp/1.0"
LIB = "TinyLib/1.0"
FALLBACK = ("fallback-1-live-to-hold", "fallback-2-staged-to-live", "fallback-3-hold-to-staged")


@pytest.fixture
def fuse_site(fuse_dir, tmp_path, package_root):
    return StagedSite(installpath=fuse_dir / "apps", state_root=tmp_path / "state", package_root=package_root)


def _ok_json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _install(site, modules):
    site.install(*modules, payload="old")
    return {
        module: {
            "inode": site.live(module).stat().st_ino,
            "module_file": site.module_file(module).read_bytes(),
        }
        for module in modules
    }


def _probe(site, path):
    return _ok_json(run_tool(site, ["--json", "probe", "--path", str(path)]))


def test_probe_on_the_fuse_mount_reports_no_exchange_with_einval(fuse_site, fuse_dir):
    result = _probe(fuse_site, fuse_dir)

    assert result["exchange"] is False
    assert result["exchange_errno"] == "EINVAL"
    assert result["filesystem"].startswith("fuse")
    assert result["publish_method"].startswith("fallback")
    assert os.listdir(fuse_dir) == []  # the probe's scratch directories are gone


def test_probe_on_a_local_directory_reports_the_exchange(fuse_site, tmp_path):
    probed = tmp_path / "local"
    probed.mkdir()

    result = _probe(fuse_site, probed)

    assert result["exchange"] is True
    assert result["exchange_errno"] is None
    assert result["publish_method"] == "exchange"
    assert os.listdir(probed) == []


@pytest.mark.parametrize("modules", [(APP,), (APP, LIB)], ids=["one-module", "two-modules"])
def test_a_rebuild_on_fuse_publishes_through_the_three_rename_fallback(fuse_site, modules):
    site = fuse_site
    before = _install(site, modules)

    result = _ok_json(site.run("--json", *site.rebuild_args(*modules)))

    journal = read_journal(site.state_root, result["run_id"])
    assert journal["state"] == "published"
    names = [step["step"] for step in journal["steps"]]
    for entry in journal["modules"]:
        module, live, retired = entry["module"], site.live(entry["module"]), entry["retired_path"]
        assert site.payload(module) == "new build"
        assert live.stat().st_ino == entry["stage_ino"]
        assert os.stat(retired).st_ino == before[module]["inode"]
        with open(os.path.join(retired, "PAYLOAD")) as handle:
            assert handle.read().strip() == "old"
        assert not os.path.lexists(retired + ".fallback-old")
        assert module_root(site.module_file(module)) == str(live)
        # The swap went through the fallback: each rename journaled, in order, after the
        # exchange attempt and before the module file.
        swap = names.index(f"swap {module}")
        fallback = [names.index(f"{step} {module}") for step in FALLBACK]
        assert swap < fallback[0] < fallback[1] < fallback[2] < names.index(f"module {module}")
    assert sorted(os.listdir(site.software / "TinyApp")) == ["." + "1.0." + result["run_id"], "1.0"]


def test_every_step_of_a_fallback_publish_is_journaled_as_done(fuse_site):
    # The journal's contract: each step is "started" before it runs and "done" after, so
    # only an interrupted operation is left "started". A finished publish has none.
    site = fuse_site
    _install(site, (APP,))

    run_id = _ok_json(site.run("--json", *site.rebuild_args(APP)))["run_id"]

    steps = read_journal(site.state_root, run_id)["steps"]
    assert [step["step"] for step in steps if step["status"] != "done"] == []


@pytest.mark.parametrize("modules", [(APP,), (APP, LIB)], ids=["one-module", "two-modules"])
def test_rollback_on_fuse_puts_the_old_trees_and_module_files_back(fuse_site, modules):
    site = fuse_site
    before = _install(site, modules)
    published = _ok_json(site.run("--json", *site.rebuild_args(*modules)))
    new_inodes = {module: site.live(module).stat().st_ino for module in modules}

    result = _ok_json(site.run("--json", "rollback", published["run_id"]))

    assert result["state"] == "rolled_back"
    for entry in published["modules"]:
        module, retired = entry["module"], entry["retired_path"]
        assert site.live(module).stat().st_ino == before[module]["inode"]
        assert site.payload(module) == "old"
        assert site.module_file(module).read_bytes() == before[module]["module_file"]
        assert os.stat(retired).st_ino == new_inodes[module]
        assert not os.path.lexists(retired + ".fallback-old")


@pytest.mark.parametrize("step", FALLBACK)
def test_a_crash_between_fallback_renames_on_fuse_is_repaired_by_resume(fuse_site, step):
    site = fuse_site
    before = _install(site, (APP,))
    crash_at = f"{step} {APP}"

    crashed = site.rebuild(APP, env={"EB_STAGED_REBUILD_CRASH_AT": crash_at})

    assert crashed.returncode == -9, crashed.stderr
    (run_id,) = os.listdir(site.state_root / "runs")
    last = read_journal(site.state_root, run_id)["steps"][-1]
    assert (last["step"], last["status"]) == (crash_at, "started")

    resumed = _ok_json(site.run("--json", "resume"))

    assert [run["state"] for run in resumed["runs"]] == ["failed"]
    assert site.live(APP).stat().st_ino == before[APP]["inode"]
    assert site.payload(APP) == "old"
    assert site.module_file(APP).read_bytes() == before[APP]["module_file"]
    retired = site.software / "TinyApp" / f".1.0.{run_id}"
    assert not os.path.lexists(str(retired) + ".fallback-old")
    assert (retired / "PAYLOAD").read_text().strip() == "new build"
    again = _ok_json(site.run("--json", "resume"))
    assert again["changed"] is False


@pytest.mark.parametrize("step", ["rollback module", "rollback swap"])
def test_a_crash_in_a_rollback_on_fuse_is_finished_by_resume(fuse_site, step):
    site = fuse_site
    before = _install(site, (APP,))
    run_id = _ok_json(site.run("--json", *site.rebuild_args(APP)))["run_id"]

    crashed = site.run("rollback", run_id, env={"EB_STAGED_REBUILD_CRASH_AT": f"{step} {APP}"})

    assert crashed.returncode == -9, crashed.stderr
    assert read_journal(site.state_root, run_id)["state"] == "rolling_back"
    resumed = _ok_json(site.run("--json", "resume"))
    assert [run["state"] for run in resumed["runs"]] == ["rolled_back"]
    assert site.live(APP).stat().st_ino == before[APP]["inode"]
    assert site.payload(APP) == "old"
    assert site.module_file(APP).read_bytes() == before[APP]["module_file"]
    assert not os.path.lexists(str(site.software / "TinyApp" / f".1.0.{run_id}") + ".fallback-old")
