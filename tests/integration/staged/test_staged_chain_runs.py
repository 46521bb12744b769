"""A stack rebuild (``--with-dependants``) after it ran: ``status``, ``rollback``, ``resume`` and
``gc`` treat it as the multi-module run it is.

The live tree holds the chain TinyLib <- TinyApp <- TinyTop (each built on the one before, as
its easyconfig copy and its module file say) and TinyOther, built on nothing. The chain is
rebuilt as ``--module TinyLib/1.0 --with-dependants -- TinyLib-1.0.eb`` by the test builder in
the userns sandbox (a chain needs a backend that shows the new builds at their live paths).
``status`` shows the members in build order and the plan (why each is in); a rollback puts
every member back or, when it cannot, none; a run killed while building is resumed from the
easyconfig copies it took; ``gc`` removes a finished chain's build area and its easyconfig
copies, and keeps them while it must.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.harness import staged_matrix as matrix
from tests.integration.harness.staged_checks import refusal_line

CHAIN = matrix.CHAIN
OTHER = "TinyOther/1.0"
CRASH_AT = "EB_STAGED_REBUILD_CRASH_AT"


@pytest.fixture
def site(staged_site):
    """The chain and TinyOther installed live (payload ``old``)."""
    matrix.install(staged_site, (*CHAIN, OTHER))
    return staged_site


def _env(**extra):
    return matrix.builder_env(CHAIN, **extra)


def _run(site, *args, **env):
    return site.run(*args, env=_env(**env))


def _json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _rebuild(site, *extra, **env):
    return _run(site, "--json", *matrix.rebuild_args(site, CHAIN, extra=extra), **env)


def _live_state(site, modules):
    """Each module's live directory (inode and bytes), module file and class link."""
    return {
        module: {
            "tree": matrix.subtree(matrix.site_snapshot(site), site.live(module)),
            "module_file": site.module_file(module).read_bytes(),
            "class_link": os.readlink(matrix.class_link(site, module)),
        }
        for module in modules
    }


def _run_dir(site, run_id):
    return site.state_root / "runs" / run_id


def _copies(site, run_id):
    return _run_dir(site, run_id) / "easyconfigs"


def _published_chain(site, run_id="chain1"):
    result = _json(_rebuild(site, "--run-id", run_id))
    assert (result["state"], [entry["module"] for entry in result["modules"]]) == ("published", list(CHAIN))
    return result


# status


def test_status_shows_a_chain_run_s_members_in_build_order_and_why_each_is_in(site):
    _published_chain(site)
    live = site.software

    text = _run(site, "status", "chain1")
    one = _json(_run(site, "--json", "status", "chain1"))["run"]
    (listed,) = _json(_run(site, "--json", "status"))["runs"]

    assert text.returncode == 0, text.stderr
    assert (
        "\nplan: 3 modules, in build order\n"
        "  1. TinyLib/1.0 (named) from TinyLib-1.0.eb\n"
        f"  2. TinyApp/1.0 (depends on TinyLib/1.0) from {live}/TinyApp/1.0/easybuild/TinyApp-1.0.eb\n"
        "  3. TinyTop/1.0 (depends on TinyApp/1.0 -> TinyLib/1.0) from "
        f"{live}/TinyTop/1.0/easybuild/TinyTop-1.0.eb\n"
    ) in text.stdout
    assert [line for line in text.stdout.splitlines() if line.startswith("Module ")] == [
        f"Module {module}" for module in CHAIN
    ]
    for shown in (one, listed):
        assert [entry["module"] for entry in shown["modules"]] == list(CHAIN)
        plan = shown["plan"]
        assert (plan["target"], plan["excluded"]) == ("TinyLib/1.0", [])
        assert [(member["module"], member["reason"], member["kind"]) for member in plan["members"]] == [
            ("TinyLib/1.0", ["TinyLib/1.0"], "runtime"),
            ("TinyApp/1.0", ["TinyApp/1.0", "TinyLib/1.0"], "runtime"),
            ("TinyTop/1.0", ["TinyTop/1.0", "TinyApp/1.0", "TinyLib/1.0"], "runtime"),
        ]
        assert [member["easyconfig"] for member in plan["members"]] == [
            "TinyLib-1.0.eb",
            str(live / "TinyApp/1.0/easybuild/TinyApp-1.0.eb"),
            str(live / "TinyTop/1.0/easybuild/TinyTop-1.0.eb"),
        ]


def test_status_of_a_run_of_modules_named_one_by_one_shows_no_plan(site):
    named = ("TinyLib/1.0", "TinyApp/1.0")
    done = _run(site, "--json", *site.rebuild_args(*named, extra=("--run-id", "named1")))
    assert _json(done)["state"] == "published"

    text = _run(site, "status", "named1")
    one = _json(_run(site, "--json", "status", "named1"))["run"]
    (listed,) = _json(_run(site, "--json", "status"))["runs"]

    assert "plan:" not in text.stdout
    assert "plan" not in one
    assert "plan" not in listed
    assert [entry["module"] for entry in listed["modules"]] == list(named)


# rollback


def test_rollback_of_a_chain_puts_every_member_back_and_leaves_the_unrelated_package(site):
    old = _live_state(site, (*CHAIN, OTHER))
    _published_chain(site)
    assert all(site.payload(module) == "new build" for module in CHAIN)

    rolled_back = _run(site, "rollback", "chain1")
    after = site.snapshot()
    again = _json(_run(site, "--json", "rollback", "chain1"))

    assert rolled_back.returncode == 0, rolled_back.stderr
    assert _live_state(site, (*CHAIN, OTHER)) == old
    # What undoes it is the stack rebuild again, not a rebuild of its members by name (whose
    # easyconfigs are not among the arguments).
    undo = rolled_back.stdout.split("Undo (build and publish again):\n")[1]
    assert undo.replace(" \\\n", " ").split() == [
        "eb-staged-rebuild",
        "--state-root",
        str(site.state_root),
        "rebuild",
        f"--installpath={site.installpath}",
        "--module=TinyLib/1.0",
        "--with-dependants",
        "--",
        "TinyLib-1.0.eb",
    ], rolled_back.stdout
    assert (again["changed"], again["state"]) == (False, "rolled_back")
    assert site.snapshot() == after


def test_rollback_of_a_chain_whose_middle_member_a_later_run_replaced_is_refused_whole(site):
    _published_chain(site)
    later = _run(site, "--json", *site.rebuild_args("TinyApp/1.0", extra=("--run-id", "later1")))
    assert _json(later)["state"] == "published"
    before = site.snapshot()

    done = _run(site, "rollback", "chain1")

    assert done.returncode == 2, done.stderr
    assert refusal_line(done) == (
        f"eb-staged-rebuild: run chain1 is no longer live at {site.live('TinyApp/1.0')}: "
        "a later run replaced it; roll that run back first"
    )
    # Not even the members no later run touched: a chain goes back whole or not at all.
    assert site.snapshot() == before
    assert _json(_run(site, "--json", "status", "chain1"))["run"]["state"] == "published"


# resume


def test_a_chain_killed_as_its_build_began_is_resumed_from_the_easyconfig_copies_it_took(site, tmp_path):
    live_copies = {
        module: (site.live(module) / "easybuild" / (module.replace("/", "-") + ".eb")).read_bytes()
        for module in CHAIN[1:]
    }
    eb_log = tmp_path / "eb-args.jsonl"

    crashed = _rebuild(site, "--run-id", "chain1", **{CRASH_AT: "build", "FAKE_EB_ARGS_LOG": eb_log})
    assert crashed.returncode == matrix.KILLED, crashed.stderr
    assert not eb_log.exists(), "the build had not begun"
    copies = _copies(site, "chain1")
    assert sorted(path.name for path in copies.iterdir()) == ["TinyApp-1.0.eb", "TinyTop-1.0.eb"]

    resumed = _json(_run(site, "--json", "resume", FAKE_EB_ARGS_LOG=eb_log))

    assert [(run["run_id"], run["state"]) for run in resumed["runs"]] == [("chain1", "published")]
    (argv,) = [json.loads(line) for line in eb_log.read_text().splitlines()]
    easyconfigs = [arg for arg in argv if arg.endswith(".eb")]
    assert easyconfigs == ["TinyLib-1.0.eb", str(copies / "TinyApp-1.0.eb"), str(copies / "TinyTop-1.0.eb")]
    assert {module: (copies / (module.replace("/", "-") + ".eb")).read_bytes() for module in CHAIN[1:]} == (
        live_copies
    )
    assert all(site.payload(module) == "new build" for module in CHAIN)
    assert site.payload(OTHER) == "old"


# gc


def _gc(site, *args):
    return _json(_run(site, "--json", "gc", "--no-squeue", *args))


def test_gc_removes_a_finished_chain_s_old_trees_build_area_and_easyconfig_copies(site):
    result = _published_chain(site)
    run_dir = _run_dir(site, "chain1")
    assert _copies(site, "chain1").is_dir()

    report = _gc(site, "--grace-hours", "0")

    assert sorted(entry["path"] for entry in report["removed"]) == sorted(
        entry["retired_path"] for entry in result["modules"]
    )
    assert not _copies(site, "chain1").exists()
    assert not (site.software / ".eb-staged-rebuild" / "chain1").exists()
    # The journal and what status reads stay: the run is still listed, with its plan.
    assert sorted(path.name for path in run_dir.iterdir()) == [
        "backup",
        "build.log",
        "journal.json",
        "live",
        "prepared",
    ]
    assert _json(_run(site, "--json", "status", "chain1"))["run"]["plan"]["target"] == "TinyLib/1.0"


def test_gc_keeps_a_chain_s_easyconfig_copies_while_its_old_trees_are_kept(site):
    _published_chain(site)
    before = sorted(path.name for path in _copies(site, "chain1").iterdir())

    report = _gc(site, "--grace-hours", "144")

    assert report["removed"] == []
    assert len(report["kept"]) == len(CHAIN)
    assert (
        sorted(path.name for path in _copies(site, "chain1").iterdir())
        == before
        == [
            "TinyApp-1.0.eb",
            "TinyTop-1.0.eb",
        ]
    )


def test_gc_keeps_the_easyconfig_copies_of_an_interrupted_chain_for_its_resume(site):
    crashed = _rebuild(site, "--run-id", "chain1", **{CRASH_AT: "build"})
    assert crashed.returncode == matrix.KILLED, crashed.stderr

    done = _run(site, "--json", "gc", "--no-squeue", "--grace-hours", "0")

    assert done.returncode == 1, done.stderr  # an interrupted run is a warning
    report = json.loads(done.stdout)
    assert [(entry["run_id"], entry["state"]) for entry in report["interrupted"]] == [("chain1", "building")]
    assert sorted(path.name for path in _copies(site, "chain1").iterdir()) == [
        "TinyApp-1.0.eb",
        "TinyTop-1.0.eb",
    ]
    resumed = _json(_run(site, "--json", "resume"))
    assert [run["state"] for run in resumed["runs"]] == ["published"]


def test_gc_stops_at_a_link_where_a_chain_s_easyconfig_copies_were(site, tmp_path):
    _published_chain(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.eb").write_text("not the run's\n")
    copies = _copies(site, "chain1")
    for path in copies.iterdir():
        path.unlink()
    copies.rmdir()
    copies.symlink_to(elsewhere)

    done = _run(site, "gc", "--no-squeue", "--grace-hours", "0")

    assert done.returncode != 0
    assert refusal_line(done) == f"eb-staged-rebuild: run chain1: {copies} is not a directory; gc stops"
    assert (elsewhere / "keep.eb").read_text() == "not the run's\n"
    assert copies.is_symlink()
