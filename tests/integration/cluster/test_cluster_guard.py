"""eessi-arch-guard on a real multi-node cluster: the arch_guard role and the rollout playbook
over SSH, and jobs that span three compute nodes of three CPU targets, submitted from a login
node of a fourth.

A user on the login node loads EESSI and two user modules there (the login's own CPU) and
submits ``srun -N3`` or ``sbatch -N3``. Every task on every node must end up with what a fresh
``module load`` of the same modules gives ON that node, decided once per step per node (the
archdetect runs logged on each node), with the guard's message once per node and step that
it repaired.

The role owns every compute node's own slurm.conf (installed by ``guard_rollout.yml``:
canary, batches, fleet report); after the removal every slurm.conf is back byte for byte and
jobs run without the guard. Where many nodes read one configuration (a shared file,
configless Slurm) is ``test_cluster_guard_layouts.py``'s.

The tests run in file order: install (a module fixture), jobs, removal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import pytest

import eessilike
from tests.integration.harness.cluster import CLUSTER_GUARD
from tests.integration.harness.cluster_guard import (
    PARTIAL_VERSION,
    RUNLOG,
    SLURM_CONF,
    VERSION,
    ClusterGuard,
)

pytestmark = CLUSTER_GUARD

PREFIX = "/opt/hpcstack/arch-guard"
LAUNCHER = f"{PREFIX}/bin/eessi-arch-guard"
STATE_FILE = "/var/lib/hpcstack/arch-guard/previous-task-prolog.json"
# One decision of a step that it repaired: the guard's archdetect runs (cpupath, accelpath)
# and the two of the EESSI module that the restore helper loads again.
REPAIR_RUNS = 4
# A decision that the environment already matches the node: the guard's two archdetect runs.
MATCH_RUNS = 2
# Set per job by Slurm or by the test, not by a login.
OWN = {"TMPDIR", "HOME", "USER", "LOGNAME"}


@pytest.fixture(scope="module")
def guard(cluster_guard: ClusterGuard) -> Iterator[ClusterGuard]:
    """The worker's guard root (conftest.py), this module's plays timed apart."""
    del cluster_guard.timings[:]
    yield cluster_guard
    cluster_guard.clear_runlogs()
    for what, seconds in cluster_guard.timings:
        print(f"play {what}: {seconds:.1f} s")


@pytest.fixture(scope="module")
def views(guard: ClusterGuard) -> dict:
    """Node name -> what task.sh prints after a fresh login there."""
    found = {node.name: guard.node_view(node) for node in guard.compute}
    assert len({view["EESSI_SOFTWARE_SUBDIR"] for view in found.values()}) == 3
    return found


@pytest.fixture(scope="module")
def login_env(guard: ClusterGuard) -> dict:
    """A login on the login node: EESSI for its own CPU, wrong on every compute node."""
    env = guard.login_env(guard.login)
    assert env["EESSI_SOFTWARE_SUBDIR"] == guard.targets["login"]
    assert guard.targets["login"] not in [guard.targets[node.name] for node in guard.compute]
    return env


def _restore(guard: ClusterGuard, before: dict) -> None:
    """Whatever a failed test left: each slurm.conf as it was, Slurm told, the guard gone."""
    changed = [name for name, text in guard.slurm_confs(list(before)).items() if text != before[name]]
    for name in changed:
        guard.cluster.node(name).write(SLURM_CONF, before[name])
    if changed:
        guard.cluster.controller.run(["scontrol", "reconfigure"])
    for node in guard.compute:
        node.run(["rm", "-rf", PREFIX, "/var/lib/hpcstack"])


# ------------------------------------------------------------------ the role owns slurm.conf


@pytest.fixture(scope="module")
def rollout(guard: ClusterGuard):
    """guard_rollout.yml over the three compute nodes, the role owning each one's slurm.conf:
    c1 the canary (a test job submitted from the login node's target), then one node per
    batch. The slurm.conf of every node, the controller's too, taken before."""
    names = ["ctl", *[node.name for node in guard.compute]]
    before = guard.slurm_confs(names)
    inventory = guard.inventory("rollout", {"slurm_compute": [node.name for node in guard.compute]})
    settings = guard.rollout_settings()
    play = guard.playbook(
        "guard_rollout.yml (canary, 2 batches, report)", "guard_rollout", inventory, settings
    )
    try:
        yield play, before
    finally:
        _restore(guard, before)


def _report(play) -> list:
    """The fleet report's lines, as the rollout's last task printed them."""
    section = play.stdout.split("TASK [One report for the fleet]", 1)[1]
    found = re.search(r"^ok: \[\w+\] => (\{.*?^\})$", section, re.M | re.S)
    assert found, play.stdout[-4000:]
    return json.loads(found.group(1))["msg"]


def test_rollout_over_ssh_tests_the_canary_then_rolls_on_by_batches_and_reports_each_node_s_target(
    guard, rollout
):
    play, before = rollout
    login, targets = guard.targets["login"], guard.targets

    assert (play.done.returncode, play.failed, play.unreachable) == (0, 0, 0), play.output[-6000:]
    canary = f"a task on c1 submitted from {login} got {targets['c1']}"
    assert canary in play.stdout
    # The canary's job ran, on c1 alone, before any other node's batch.
    assert play.stdout.index(canary) < play.stdout.index("PLAY [Roll the guard out to the other nodes")
    # The canary is not rolled out to again: c2, then c3.
    assert play.stdout.count("PLAY [Roll the guard out to the other nodes, in batches]") == 2
    report = _report(play)
    assert report[0] == "eessi-arch-guard on 3 nodes: installed on 3"
    assert report[2:] == [
        f"EESSI {VERSION}:",
        *sorted(f"  {targets[name]}: 1 node ({name})" for name in ("c1", "c2", "c3")),
        f"EESSI {PARTIAL_VERSION}:",
        *sorted(
            [
                f"  {targets['c1']}: 1 node (c1)",
                f"  {targets['c2']}: 1 node (c2)",
                "  no-software-dir: 1 node (c3)",
            ]
        ),
    ]
    # Each node's own slurm.conf names the guard; the controller's is its own, untouched.
    after = guard.slurm_confs(list(before))
    assert after["ctl"] == before["ctl"]
    for name in ("c1", "c2", "c3"):
        assert after[name] == before[name] + f"TaskProlog={LAUNCHER}\n"


def _message(now: str, was: str) -> str:
    return f"eessi-arch-guard: reloaded EESSI for {now} (job environment was {was})"


def _assert_tasks_see_their_node(out, views: dict, step: str, markers: dict, per_node: int = 2) -> dict:
    """Every task of ``step`` sees what a fresh login on its node sees, ``markers[node]`` its
    marker; ``per_node`` tasks on each node. Returns rank -> node."""
    ranks = {rank: view["node"] for (section, rank), view in out.tasks.items() if section == step}
    assert sorted(ranks.values()) == sorted(name for name in views for _task in range(per_node)), out.text
    for (section, rank), view in out.tasks.items():
        if section == step:
            node = view["node"]
            assert view == dict(views[node], EESSI_ARCH_GUARD_RELOADED=markers[node]), (step, rank)
    return ranks


def _assert_messages(out, ranks: dict, expected: dict, step: str) -> None:
    """The guard's message once on each node of ``expected`` (node -> text), from its local rank 0."""
    seen = {}
    for section, rank, text in out.messages:
        if section == step:
            node = ranks[rank] if rank is not None else "batch"
            assert node not in seen, f"a second message on {node} in step {step}: {out.messages}"
            seen[node] = text
    assert seen == expected, out.text


def _assert_one_cache_file_per_node(work: Path, names: list) -> None:
    """The step's decision cached once per node (``.eessi-arch-guard.<uid>.<node>....``)."""
    cached = [path.name for path in (work / "tmp").iterdir() if not path.name.endswith(".lock")]
    assert sorted(name.split(".")[3] for name in cached) == sorted(names), cached


def test_srun_over_three_nodes_gives_every_task_its_own_node_s_environment_decided_once_per_node(
    guard, rollout, views, login_env
):
    login = guard.targets["login"]
    work = guard.workdir("srun")
    guard.clear_runlogs()

    out = guard.srun(work, dict(login_env, TMPDIR=str(work / "tmp"), EESSI_ARCHDETECT_STANDIN_RUNLOG=RUNLOG))

    markers = {name: f"{login}->{guard.targets[name]}" for name in views}
    ranks = _assert_tasks_see_their_node(out, views, "0", markers)
    _assert_messages(out, ranks, {name: _message(guard.targets[name], login) for name in views}, "0")
    assert {name: len(runs) for name, runs in guard.runlogs().items()} == dict.fromkeys(views, REPAIR_RUNS)
    _assert_one_cache_file_per_node(work, list(views))
    _assert_dumps_match_fresh_logins(guard, work, ranks, "0")


def _assert_dumps_match_fresh_logins(guard, work: Path, ranks: dict, step: str) -> None:
    """Each task's whole environment has every variable of a fresh login on its node, with its value."""
    fresh = {node.name: guard.login_env(node) for node in guard.compute}
    dumps = {}
    for path in sorted(work.glob(f"env.{step}.*")):
        dumps[int(path.name.rsplit(".", 1)[1])] = eessilike.parse_env0(path.read_bytes())
    assert sorted(dumps) == sorted(ranks)
    for rank, env in dumps.items():
        expected = fresh[ranks[rank]]
        differ = sorted(name for name in expected if env.get(name) != expected[name] and name not in OWN)
        assert differ == [], (rank, {name: (env.get(name), expected[name]) for name in differ})


def test_sbatch_over_three_nodes_repairs_the_batch_step_then_each_other_node_once_in_the_step(
    guard, rollout, views, login_env
):
    login, targets = guard.targets["login"], guard.targets
    work = guard.workdir("sbatch")
    guard.clear_runlogs()

    out = guard.sbatch(
        work, dict(login_env, TMPDIR=str(work / "tmp"), EESSI_ARCHDETECT_STANDIN_RUNLOG=RUNLOG)
    )

    batch = out.tasks[("batch", 0)]["node"]
    assert out.tasks[("batch", 0)] == dict(
        views[batch], EESSI_ARCH_GUARD_RELOADED=f"{login}->{targets[batch]}"
    )
    # The srun step starts from the batch step's environment, repaired for its node: right
    # there (the batch step's marker kept, nothing said), wrong on the other two.
    markers = {
        name: f"{login}->{targets[name]}" if name == batch else f"{targets[batch]}->{targets[name]}"
        for name in views
    }
    ranks = _assert_tasks_see_their_node(out, views, "0", markers)
    _assert_messages(out, ranks, {"batch": _message(targets[batch], login)}, "batch")
    others = {name: _message(targets[name], targets[batch]) for name in views if name != batch}
    _assert_messages(out, ranks, others, "0")
    runs = guard.runlogs()
    assert {name: len(runs[name]) for name in others} == dict.fromkeys(others, REPAIR_RUNS), runs
    # The batch step's repair, then the step's decision that the node already matches.
    assert len(runs[batch]) == REPAIR_RUNS + MATCH_RUNS, runs
    _assert_dumps_match_fresh_logins(guard, work, ranks, "0")


WRAPPER = f"{PREFIX}/bin/task-prolog"
STATE_DIR = str(Path(STATE_FILE).parent)


def test_a_rerun_over_ssh_puts_back_what_changed_on_one_node_and_writes_nothing_on_the_others(guard, rollout):
    """A rerun writes only what its survey of each node found changed: on c2 the launcher's
    bytes, the bin directory's and the state directory's modes, a FIFO where the wrapper would
    be (the survey reads no FIFO: it must not hang) and blanks after the TaskProlog line are
    all put back; c1 and c3 report no change; a run after that changes nothing anywhere."""
    _play, _before = rollout
    c1, c2 = guard.cluster.node("c1"), guard.cluster.node("c2")
    guarded = {name: guard.cluster.node(name).read(SLURM_CONF) for name in ("c1", "c2", "c3")}
    launcher = c1.read(LAUNCHER)
    c2.run(["sh", "-c", f"echo '# changed by hand' >> {LAUNCHER}"])
    c2.run(["chmod", "0775", f"{PREFIX}/bin"])
    c2.run(["chmod", "0755", STATE_DIR])
    c2.run(["mkfifo", "-m", "0644", WRAPPER])
    c2.write(SLURM_CONF, guarded["c2"].replace(f"TaskProlog={LAUNCHER}\n", f"TaskProlog={LAUNCHER}  \n"))
    assert c2.read(SLURM_CONF) != guarded["c2"]
    nodes = guard.inventory("rerun", {"guard_nodes": [node.name for node in guard.compute]})

    rerun = guard.role("rerun after changes on c2", nodes, arch_guard_manage_slurm_conf=True)
    again = guard.role("rerun, nothing changed", nodes, arch_guard_manage_slurm_conf=True)

    assert (rerun.done.returncode, rerun.failed, rerun.unreachable) == (0, 0, 0), rerun.output[-6000:]
    changed = {host: counts[1] for host, counts in rerun.recap.items()}
    # The launcher, bin, the state directory, the FIFO, the line; and the handler.
    assert changed["c2"] >= 5, rerun.output[-6000:]
    assert (changed["c1"], changed["c3"]) == (0, 0), rerun.output[-6000:]
    assert c2.read(LAUNCHER) == launcher
    modes = c2.run(["stat", "-c", "%a %U", LAUNCHER, f"{PREFIX}/bin", STATE_DIR]).stdout.split("\n")
    assert modes[:3] == ["755 root", "755 root", "700 root"]
    assert c2.run(["test", "-e", WRAPPER], check=False).returncode == 1
    assert guard.slurm_confs(list(guarded)) == guarded
    assert (again.done.returncode, again.failed, again.changed) == (0, 0, 0), again.output[-6000:]


def test_removal_over_ssh_is_refused_unless_the_role_owns_slurm_conf_then_puts_every_file_back(
    guard, rollout, login_env
):
    _play, before = rollout
    guard_nodes = guard.inventory("removal", {"guard_nodes": [node.name for node in guard.compute]})

    refused = guard.role(
        "absent, slurm.conf not the role's (refused)", guard_nodes, arch_guard_state="absent"
    )

    assert refused.done.returncode == 2, refused.output[-4000:]
    assert refused.failed == 3
    for name in ("c1", "c2", "c3"):
        assert f"fatal: [{name}]" in refused.stdout
    assert f"arch_guard: {SLURM_CONF} still names the guard as TaskProlog" in refused.stdout
    for node in guard.compute:
        assert node.run(["test", "-x", LAUNCHER], check=False).returncode == 0, node.name

    removed = guard.role(
        "absent, owning slurm.conf", guard_nodes, arch_guard_state="absent", arch_guard_manage_slurm_conf=True
    )

    assert (removed.done.returncode, removed.failed) == (0, 0), removed.output[-6000:]
    assert guard.slurm_confs(list(before)) == before
    for node in guard.compute:
        gone = node.run(["sh", "-c", f"test ! -e {PREFIX} && test ! -e {STATE_FILE}"], check=False)
        assert gone.returncode == 0, node.name
    _assert_jobs_run_without_the_guard(guard, login_env)


def _assert_jobs_run_without_the_guard(guard, login_env) -> None:
    """slurmd on every node has read the file without the guard: the login's EESSI everywhere."""
    work = guard.workdir("unguarded")
    out = guard.srun(work, dict(login_env, TMPDIR=str(work / "tmp")))
    assert out.messages == []
    assert sorted(view["node"] for view in out.tasks.values()) == ["c1", "c1", "c2", "c2", "c3", "c3"]
    for view in out.tasks.values():
        assert view["EESSI_SOFTWARE_SUBDIR"] == guard.targets["login"]
        assert view["EESSI_ARCH_GUARD_RELOADED"] == ""
