"""eb-staged-rebuild end to end: rebuild, rollback, status, gc and retire on a live tree."""

from __future__ import annotations

import json
import os
from pathlib import Path

APP = "TinyApp/1.0"
LIB = "TinyLib/1.0"


def _json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_rebuild_swaps_in_the_new_tree_and_keeps_the_old_one_retired(staged_site):
    staged_site.install(APP)
    old_inode = staged_site.live(APP).stat().st_ino

    result = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))

    assert result["state"] == "published"
    live = staged_site.live(APP)
    assert live.stat().st_ino != old_inode
    assert staged_site.payload(APP) == "new build"
    (module,) = result["modules"]
    retired = module["retired_path"]
    assert retired == str(staged_site.software / "TinyApp" / f".1.0.{result['run_id']}")
    assert os.stat(retired).st_ino == old_inode
    assert Path(retired, "PAYLOAD").read_text().strip() == "old"
    assert f'local root = "{live}"' in staged_site.module_file(APP).read_text()


def test_rollback_puts_the_old_tree_and_module_file_back(staged_site):
    staged_site.install(APP)
    old_inode = staged_site.live(APP).stat().st_ino
    old_module = staged_site.module_file(APP).read_bytes()
    run_id = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))["run_id"]

    result = _json(staged_site.run("--json", "rollback", run_id))

    assert result == {"run_id": run_id, "changed": True, "state": "rolled_back"}
    assert staged_site.live(APP).stat().st_ino == old_inode
    assert staged_site.payload(APP) == "old"
    assert staged_site.module_file(APP).read_bytes() == old_module


def test_rolling_back_twice_changes_nothing_the_second_time(staged_site):
    staged_site.install(APP)
    run_id = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))["run_id"]
    _json(staged_site.run("--json", "rollback", run_id))
    before = staged_site.snapshot()

    again = _json(staged_site.run("--json", "rollback", run_id))

    assert again["changed"] is False
    assert staged_site.snapshot() == before


def test_three_modules_publish_in_dependency_order(staged_site):
    modules = ("TinyTop/1.0", APP, LIB)
    depends = "TinyTop/1.0:TinyApp/1.0,TinyApp/1.0:TinyLib/1.0"
    staged_site.install(*modules, depends=depends)

    result = _json(
        staged_site.run("--json", *staged_site.rebuild_args(*modules), env={"FAKE_EB_DEPENDS": depends})
    )

    assert [module["module"] for module in result["modules"]] == [LIB, APP, "TinyTop/1.0"]
    assert all(staged_site.payload(module) == "new build" for module in modules)


def test_a_failed_build_changes_nothing_live_and_says_where_the_log_is(staged_site):
    staged_site.install(APP)
    before = staged_site.snapshot()

    done = staged_site.rebuild(APP, env={"FAKE_EB_FAIL": "1"})

    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("eb-staged-rebuild: EasyBuild failed (exit 1)")
    assert "build.log" in done.stderr.splitlines()[-1]
    assert staged_site.snapshot() == before


def test_a_build_without_evidence_is_not_swapped(staged_site):
    staged_site.install(APP)
    before = staged_site.snapshot()

    done = staged_site.rebuild(APP, env={"FAKE_EB_EVIDENCE": "none"})

    assert done.returncode == 2
    assert "the build installed no TinyApp/1.0: " in done.stderr
    assert "(check that the easyconfigs given to EasyBuild build TinyApp/1.0)" in done.stderr
    assert staged_site.snapshot() == before


def test_status_lists_the_runs_and_their_state(staged_site):
    staged_site.install(APP)
    first = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))["run_id"]
    _json(staged_site.run("--json", "rollback", first))
    second = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))["run_id"]

    runs = _json(staged_site.run("--json", "status"))["runs"]

    assert [(run["run_id"], run["state"]) for run in runs] == [(first, "rolled_back"), (second, "published")]


def test_gc_removes_only_the_recorded_hidden_sibling_after_the_grace_period(staged_site):
    staged_site.install(APP)
    result = _json(staged_site.run("--json", *staged_site.rebuild_args(APP)))
    retired = result["modules"][0]["retired_path"]

    waiting = _json(staged_site.run("--json", "gc"))
    assert waiting["removed"] == []
    assert os.path.isdir(retired)

    collected = _json(staged_site.run("--json", "gc", "--grace-hours", "0"))

    assert collected["removed"] == [{"path": retired, "run_id": result["run_id"]}]
    assert not os.path.exists(retired)
    assert staged_site.payload(APP) == "new build"
    assert _json(staged_site.run("--json", "gc", "--grace-hours", "0"))["changed"] is False


def test_retire_moves_the_module_file_away_and_rollback_brings_it_back(staged_site):
    staged_site.install(APP)
    module_file = staged_site.module_file(APP)
    data = module_file.read_bytes()

    retired = _json(staged_site.run("--json", "retire", str(module_file), "--reason", "now on CVMFS"))

    assert not module_file.exists()
    assert Path(retired["retired_to"]).read_bytes() == data
    assert staged_site.live(APP).is_dir()
    back = _json(staged_site.run("--json", "rollback", retired["run_id"]))
    assert back["state"] == "rolled_back"
    assert module_file.read_bytes() == data
