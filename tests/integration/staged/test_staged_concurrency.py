"""Several ``eb-staged-rebuild`` processes against one state root at the same time.

Eight real processes start together: rebuilds (one of two modules in one transaction, two
of the same module), rollbacks of runs published just before, a retire (or the rollback
of the previous one) and ``gc --grace-hours 0``; some refuse at once when the lock is
taken (``--lock-timeout 0``), the others wait. Each one must finish, or be refused by the
lock with the one-line message. Afterwards the journals and the trees must agree:

* every journal is readable, none is left in an interrupted state, and ``status`` lists
  exactly the runs that succeeded;
* each live module holds the tree of its latest published, not rolled back run (or the
  original install), as a real directory, its module file's root names the live path, and
  its class link points at its module file;
* every hidden sibling is one a journal recorded; no hold name, no build area, no
  temporary file is left; the lock records no holder.

Only the ordering is left to the scheduler; everything checked holds for every ordering.
The one outcome besides "done" and "refused by the lock" that an ordering can produce is
a rollback that comes after the round's gc removed the tree it would put back: it must
then be refused, name that tree, and leave its run published.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.harness.staged_checks import (
    INTERRUPTED,
    LOCK_REFUSAL,
    all_journals,
    hidden_entries,
    is_lock_refusal,
    module_root,
    refusal_line,
    run_tool,
    temp_leftovers,
    tool_command,
    tool_env,
)
from tests.support.staged import snapshot

MODULES = ("Alpha/1.0", "Beta/1.0", "Gamma/1.0", "Delta/1.0", "Eps/1.0", "Zeta/1.0")
RETIRED = "Retro/1.0"
ORIGINAL = "original"
WAIT = "60"
ROUNDS = 3


@dataclass
class Launch:
    """One process of a round: what it does and how it is judged."""

    kind: str  # rebuild, rollback, retire, retire-rollback, gc
    args: list
    env: dict
    run_id: str = ""
    modules: tuple = ()
    proc: subprocess.Popen = None
    done: subprocess.CompletedProcess = None


def _ok_json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _publish(site, modules, run_id):
    """A sequential rebuild whose PAYLOAD is its run id (so a tree tells which run built it)."""
    return _ok_json(
        run_tool(
            site,
            ["--json", *site.rebuild_args(*modules, extra=("--run-id", run_id))],
            env={"FAKE_EB_PAYLOAD": run_id},
        )
    )


def _rebuild(site, modules, run_id, timeout):
    args = ["--lock-timeout", timeout, "--json", *site.rebuild_args(*modules, extra=("--run-id", run_id))]
    return Launch("rebuild", args, {"FAKE_EB_PAYLOAD": run_id}, run_id=run_id, modules=tuple(modules))


def _start_all(site, launches):
    for launch in launches:
        launch.proc = subprocess.Popen(
            tool_command(site.state_root, *launch.args),
            env=tool_env(site, launch.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for launch in launches:
        out, err = launch.proc.communicate(timeout=300)
        launch.done = subprocess.CompletedProcess(launch.proc.args, launch.proc.returncode, out, err)


def _latest_retire(journals):
    retires = [data for data in journals.values() if data["kind"] == "retire"]
    return max(retires, key=lambda data: data["created"]) if retires else None


def _round_launches(site, number, journals):
    """Two sequential publishes to roll back, then the eight processes of round ``number``."""
    targets = [MODULES[(2 * number) % 6], MODULES[(2 * number + 1) % 6]]
    others = [module for module in MODULES if module not in targets]
    rollback_ids = []
    for module in targets:
        run_id = f"r{number}-prep-{module.split('/')[0]}"
        _publish(site, [module], run_id)
        rollback_ids.append(run_id)
    # Rotate who refuses at once and who waits, so every kind meets both.
    timeouts = [WAIT if (index + number) % 3 else "0" for index in range(8)]
    launches = [
        _rebuild(site, [others[0]], f"r{number}-a", timeouts[0]),
        _rebuild(site, [others[1]], f"r{number}-b", timeouts[1]),
        _rebuild(site, [others[2], others[3]], f"r{number}-cd", timeouts[2]),
        _rebuild(site, [others[0]], f"r{number}-a2", timeouts[3]),
    ]
    for index, run_id in enumerate(rollback_ids):
        args = ["--lock-timeout", timeouts[4 + index], "--json", "rollback", run_id]
        launches.append(Launch("rollback", args, {}, run_id=run_id))
    last = _latest_retire(journals)
    if last is not None and last["state"] == "retired":
        args = ["--lock-timeout", timeouts[6], "--json", "rollback", last["run_id"]]
        launches.append(Launch("retire-rollback", args, {}, run_id=last["run_id"]))
    else:
        args = [
            "--lock-timeout",
            timeouts[6],
            "--json",
            "retire",
            str(site.module_file(RETIRED)),
            "--reason",
            "moved",
        ]
        launches.append(Launch("retire", args, {}))
    launches.append(Launch("gc", ["--lock-timeout", timeouts[7], "--json", "gc", "--grace-hours", "0"], {}))
    return launches


def _gc_removed(launches):
    (gc,) = [launch for launch in launches if launch.kind == "gc"]
    if gc.done.returncode != 0:
        return set()
    return {item["path"] for item in json.loads(gc.done.stdout)["removed"]}


def _judge(site, launches, journals_before):
    """Each process finished, or was refused by the lock, or (a rollback) lost its tree to gc."""
    removed = _gc_removed(launches)
    succeeded = set()
    for launch in launches:
        done = launch.done
        if done.returncode == 0:
            result = json.loads(done.stdout)
            if launch.kind in ("rebuild", "retire"):
                succeeded.add(result["run_id"])
            continue
        line = refusal_line(done)
        if LOCK_REFUSAL in line:
            continue
        assert launch.kind == "rollback", (launch.kind, line)
        retired = journals_before[launch.run_id]["modules"][0]["retired_path"]
        assert retired in removed, f"rollback {launch.run_id} failed but gc did not remove {retired}: {line}"
        assert retired in line, line
    return succeeded


def _expected_live(journals):
    """module -> run id of its latest published, not rolled back run (or ORIGINAL)."""
    expected = {}
    published = [
        data for data in journals.values() if data["kind"] == "publish" and data["state"] == "published"
    ]
    for data in sorted(published, key=lambda data: data["state_since"]):
        for entry in data["modules"]:
            expected[entry["module"]] = data["run_id"]
    return expected


def _check_retired(journals):
    """Each retired module file is in the state root, each other one back at its place."""
    latest = {}
    for data in sorted(journals.values(), key=lambda data: data["created"]):
        if data["kind"] == "retire":
            latest[data["module_file"]] = data
    for module_file, data in latest.items():
        assert os.path.isfile(module_file) == (data["state"] != "retired"), data["run_id"]
        assert os.path.isfile(data["retired_to"]) == (data["state"] == "retired"), data["run_id"]


def _check_trees(site, journals, modules):
    expected = _expected_live(journals)
    for module in modules:
        live = site.live(module)
        assert not live.is_symlink(), live
        assert live.is_dir(), live
        assert site.payload(module) == expected.get(module, ORIGINAL), module
        module_file = site.module_file(module)
        assert module_root(module_file) == str(live)
        link = site.modules / "tools" / (module + ".lua")
        assert os.readlink(link) == str(module_file)
    _check_retired(journals)


def _check_siblings(site, journals):
    recorded = {}
    for data in journals.values():
        for entry in data.get("modules", []) if data["kind"] == "publish" else []:
            recorded[entry["retired_path"]] = data
    for sibling in hidden_entries(site):
        assert sibling in recorded, f"stray hidden entry {sibling}"
        data = recorded[sibling]
        if data["state"] == "rolled_back":
            # After a rollback the sibling holds the run's own tree again.
            assert (Path(sibling) / "PAYLOAD").read_text().strip() == data["run_id"]
    assert temp_leftovers(site) == []
    assert (site.state_root / ".lock").read_bytes() == b""


def _check_state(site, expected_runs, modules=MODULES):
    journals = all_journals(site.state_root)
    status = _ok_json(run_tool(site, ["--json", "status"]))
    assert {run["run_id"] for run in status["runs"]} == expected_runs
    assert set(journals) == expected_runs
    for data in journals.values():
        assert data["state"] not in INTERRUPTED, data["run_id"]
        assert data["state"] in ("published", "rolled_back", "retired"), data["run_id"]
    _check_trees(site, journals, modules)
    assert site.live(RETIRED).is_dir()  # retire never touches the software directory
    _check_siblings(site, journals)
    return journals


def test_eight_processes_on_one_state_root_each_finish_or_are_refused_by_the_lock(staged_site):
    site = staged_site
    site.install(*MODULES, RETIRED, payload=ORIGINAL)
    expected_runs, journals = set(), {}
    kinds_refused, kinds_done = set(), set()

    for number in range(ROUNDS):
        launches = _round_launches(site, number, journals)
        expected_runs.update(f"r{number}-prep-{MODULES[(2 * number + k) % 6].split('/')[0]}" for k in (0, 1))
        journals_before = all_journals(site.state_root)
        _start_all(site, launches)

        expected_runs |= _judge(site, launches, journals_before)
        journals = _check_state(site, expected_runs)
        kinds_refused.update(launch.kind for launch in launches if is_lock_refusal(launch.done))
        kinds_done.update(launch.kind for launch in launches if launch.done.returncode == 0)

    # The premise: the rounds did contend (someone was refused) and did get work done. Which
    # rollbacks succeed depends on whether gc came first; the next test makes them all run.
    assert kinds_refused
    assert "rebuild" in kinds_done


def test_eight_processes_that_wait_for_the_lock_all_complete_one_after_another(staged_site):
    # Rebuilds, rollbacks, a retire, the rollback of an earlier retire and a gc that keeps
    # everything (default grace): all wait, so every one of them must finish.
    site = staged_site
    site.install(*MODULES, RETIRED, "Retro/2.0", payload=ORIGINAL)
    expected_runs = {"p-alpha", "p-beta"}
    _publish(site, ["Alpha/1.0"], "p-alpha")
    _publish(site, ["Beta/1.0"], "p-beta")
    earlier = _ok_json(
        run_tool(site, ["--json", "retire", str(site.module_file("Retro/2.0")), "--reason", "moved"])
    )
    expected_runs.add(earlier["run_id"])
    launches = [
        _rebuild(site, ["Gamma/1.0"], "w-gamma", WAIT),
        _rebuild(site, ["Delta/1.0"], "w-delta", WAIT),
        _rebuild(site, ["Eps/1.0", "Zeta/1.0"], "w-epszeta", WAIT),
        Launch("rollback", ["--lock-timeout", WAIT, "--json", "rollback", "p-alpha"], {}),
        Launch("rollback", ["--lock-timeout", WAIT, "--json", "rollback", "p-beta"], {}),
        Launch(
            "retire",
            ["--lock-timeout", WAIT, "--json", "retire", str(site.module_file(RETIRED)), "--reason", "x"],
            {},
        ),
        Launch("retire-rollback", ["--lock-timeout", WAIT, "--json", "rollback", earlier["run_id"]], {}),
        Launch("gc", ["--lock-timeout", WAIT, "--json", "gc"], {}),
    ]

    _start_all(site, launches)

    assert [launch.done.returncode for launch in launches] == [0] * 8, [
        launch.done.stderr for launch in launches
    ]
    expected_runs |= _judge(site, launches, {})
    journals = _check_state(site, expected_runs)
    assert journals["p-alpha"]["state"] == journals["p-beta"]["state"] == "rolled_back"
    assert journals[earlier["run_id"]]["state"] == "rolled_back"
    assert [site.payload(module) for module in MODULES] == [
        ORIGINAL,
        ORIGINAL,
        "w-gamma",
        "w-delta",
        "w-epszeta",
        "w-epszeta",
    ]
    assert not site.module_file(RETIRED).exists()
    assert site.module_file("Retro/2.0").is_file()


def test_eight_rebuilds_that_do_not_wait_publish_or_are_refused_with_nothing_half_done(staged_site):
    site = staged_site
    modules = [f"Now{index}/1.0" for index in range(8)]
    site.install(*modules, payload=ORIGINAL)
    launches = [_rebuild(site, [module], f"n{index}", "0") for index, module in enumerate(modules)]

    _start_all(site, launches)

    done = {launch.run_id for launch in launches if launch.done.returncode == 0}
    refused = [launch for launch in launches if launch.done.returncode != 0]
    assert done, "at least the first process gets the lock"
    assert all(LOCK_REFUSAL in refusal_line(launch.done) for launch in refused)
    assert set(all_journals(site.state_root)) == done
    for index, module in enumerate(modules):
        assert site.payload(module) == (f"n{index}" if f"n{index}" in done else ORIGINAL)
    assert {os.path.basename(path) for path in hidden_entries(site)} == {f".1.0.{run_id}" for run_id in done}


@pytest.mark.parametrize("order", ["older-first", "newer-left-live"])
def test_rolling_back_a_run_that_a_later_run_superseded_is_refused(staged_site, order):
    # Two administrators on one module: X publishes, then Y over it. Rolling back X now would
    # exchange X's retired tree (the original) with Y's live tree: the original goes live
    # while Y's journal still says published, and X's sibling then holds Y's tree, which a
    # later gc deletes as X's. Only the newest published run of a module may be rolled back.
    site = staged_site
    module = "Alpha/1.0"
    site.install(module, payload=ORIGINAL)
    _publish(site, [module], "X")
    _publish(site, [module], "Y")
    if order == "newer-left-live":
        _ok_json(run_tool(site, ["--json", "rollback", "Y"]))
        _publish(site, [module], "Z")
    before = snapshot(site.software, site.modules, site.state_root / "runs")

    done = run_tool(site, ["rollback", "X"])

    line = refusal_line(done)
    assert "X" in line
    assert snapshot(site.software, site.modules, site.state_root / "runs") == before
