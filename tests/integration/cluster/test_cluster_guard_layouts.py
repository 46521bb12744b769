"""eessi-arch-guard rolled out where many nodes read one Slurm configuration: one
``/etc/slurm`` that the controller, the login node and the compute nodes mount (a shared
filesystem), and configless Slurm (every slurmd runs the controller's file).

Users keep working meanwhile: a loop on the login node submits ``srun -N3`` every two seconds
for the whole rollout (``guard_rollout.yml``: canary, batches, report) and the whole removal.
Not one of its jobs may fail, every task of a job submitted after the rollout shows the
guard's reload, and every task after the removal runs without it. The TaskProlog the site had
before is chained (its output first, its variable set) and its line comes back byte for byte.
A node that reads the configuration and is not in the inventory stops the play before the
line is touched.

Each layout's tests run in file order: the refusal, then the rollout and removal.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.harness.cluster import CLUSTER_GUARD
from tests.integration.harness.cluster_guard import (
    JOB_TIMEOUT,
    RUNLOG,
    SLURM_CONF,
    ClusterGuard,
    LoopJob,
)
from tests.integration.harness.guard_slurm import job_output

pytestmark = CLUSTER_GUARD

PREFIX = "/opt/hpcstack/arch-guard"
LAUNCHER = f"{PREFIX}/bin/eessi-arch-guard"
WRAPPER = f"{PREFIX}/bin/task-prolog"
STATE_FILE = "/var/lib/hpcstack/arch-guard/previous-task-prolog.json"
# The site's own TaskProlog: a message, then a variable, for every task.
SITE_PROLOG = """#!/bin/sh
echo "print site-prolog on ${SLURMD_NODENAME-}"
echo "export SITE_TASK_PROLOG=ran"
"""
# Jobs the loop must have finished after each phase, to show what users see then.
JOBS_AFTER = 2
# A decision of a step that repaired the environment: the guard's archdetect runs (cpupath,
# accelpath) and the two of the EESSI module that the restore helper loads again.
REPAIR_RUNS = 4
# Where a configless slurmd keeps the configuration it fetched.
CONF_CACHE = "/var/spool/slurmd/conf-cache/slurm.conf"


@pytest.fixture(scope="module")
def guard(cluster_guard: ClusterGuard) -> Iterator[ClusterGuard]:
    """The worker's guard root (conftest.py), this module's plays timed apart."""
    del cluster_guard.timings[:]
    yield cluster_guard
    for what, seconds in cluster_guard.timings:
        print(f"play {what}: {seconds:.1f} s")


@pytest.fixture(scope="module")
def login_env(guard: ClusterGuard) -> dict:
    """A login on the login node: EESSI for its own CPU, wrong on every compute node."""
    return guard.login_env(guard.login)


def _inventory(guard: ClusterGuard, name: str, compute: list, **groups) -> Path:
    return guard.inventory(name, {"slurm_compute": compute, "guard_nodes": compute, **groups})


def _assert_nothing_installed(guard: ClusterGuard) -> None:
    for node in guard.compute:
        assert node.run(["test", "-e", PREFIX], check=False).returncode == 1, node.name
        assert node.run(["test", "-e", STATE_FILE], check=False).returncode == 1, node.name


def _conf(guard: ClusterGuard) -> str:
    """The configuration every node reads: the controller's slurm.conf."""
    return guard.cluster.controller.read(SLURM_CONF)


def _cleanup(guard: ClusterGuard, before: str) -> None:
    """What a failed test left: the configuration as it was, Slurm told, the guard gone."""
    if _conf(guard) != before:
        guard.cluster.controller.write(SLURM_CONF, before)
        guard.cluster.controller.run(["scontrol", "reconfigure"])
    for node in guard.compute:
        node.run(["rm", "-rf", PREFIX, "/var/lib/hpcstack"])


def _assert_refused_for_a_missing_node(guard: ClusterGuard, name: str, groups: dict, **more) -> None:
    """guard_rollout.yml over c1 and c2 only: c3 reads the configuration too."""
    before = _conf(guard)
    inventory = _inventory(guard, name, ["c1", "c2"], **groups)
    try:
        play = guard.playbook(
            f"{name}: rollout, c3 not in the inventory",
            "guard_rollout",
            inventory,
            guard.rollout_settings(**more),
        )

        assert play.done.returncode == 2, play.output[-6000:]
        assert "is the configuration of Slurm nodes that are not in this play: c3." in play.stdout
        # One message, for the play: not one per host.
        assert play.stdout.count("fatal: [") == 1, play.stdout[-6000:]
        # Stopped before the guard was even installed: nothing of it anywhere, the line as it was.
        assert "Set TaskProlog in slurm.conf" not in play.stdout
        assert _conf(guard) == before
        _assert_nothing_installed(guard)
    finally:
        _cleanup(guard, before)


def _tasks_show(job: LoopJob, reloaded: bool, site: bool, targets: dict, login: str) -> bool:
    """Whether each of the job's three tasks, one per node, shows the guard's reload (or not)
    and the site TaskProlog's variable (or not)."""
    tasks = job.tasks()
    if sorted(tasks) != ["c1", "c2", "c3"]:
        return False
    return all(
        (fields["reloaded"] == f"{login}->{targets[name]}") == reloaded and (fields["site"] == "ran") == site
        for name, fields in tasks.items()
    )


def _assert_site_output_first(job: LoopJob) -> None:
    for rank in ("0", "1", "2"):
        lines = job.lines(rank)
        site = [i for i, line in enumerate(lines) if line.startswith("site-prolog on ")]
        guard = [i for i, line in enumerate(lines) if line.startswith("eessi-arch-guard: reloaded EESSI")]
        assert (len(site), len(guard)) == (1, 1), (rank, lines)
        assert site[0] < guard[0], (rank, lines)


def _assert_one_repair_per_node(guard: ClusterGuard, login_env: dict, name: str) -> None:
    """``srun -N3``, two tasks a node, from the login node: every task gets its node's EESSI,
    the guard says so once per node, and decides once per node (the archdetect runs each
    node logged: two for the CPU and accelerator, two of the EESSI module loaded again).
    Submitted beside the loop's jobs, so not through ``ClusterGuard.srun``, which waits for
    the queue to empty."""
    login, targets = guard.targets["login"], guard.targets
    work = guard.workdir(f"srun-{name}")
    guard.clear_runlogs()
    argv = [
        "srun", "--quiet", "-N3", "--ntasks-per-node=2", "--overcommit", "--label",
        str(work / "task.sh"), str(work),
    ]  # fmt: skip
    env = dict(login_env, TMPDIR=str(work / "tmp"), EESSI_ARCHDETECT_STANDIN_RUNLOG=RUNLOG)
    done = guard.login.run(argv, env=env, workdir=str(work), timeout=JOB_TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = job_output(done.stdout, first="0")
    nodes = sorted(view["node"] for view in out.tasks.values())
    assert nodes == ["c1", "c1", "c2", "c2", "c3", "c3"], out.text
    for view in out.tasks.values():
        target = targets[view["node"]]
        assert view["EESSI_SOFTWARE_SUBDIR"] == target, out.text
        assert view["EESSI_ARCH_GUARD_RELOADED"] == f"{login}->{target}", out.text
    assert sorted(text for _step, _rank, text in out.messages) == sorted(
        f"eessi-arch-guard: reloaded EESSI for {targets[node]} (job environment was {login})"
        for node in ("c1", "c2", "c3")
    ), out.text
    assert {node: len(runs) for node, runs in guard.runlogs().items()} == dict.fromkeys(
        ("c1", "c2", "c3"), REPAIR_RUNS
    )


def _assert_rollout_and_removal_under_load(
    guard: ClusterGuard,
    login_env: dict,
    name: str,
    groups: dict,
    *,
    site: bool,
    owner: str,
    refused_state: str,
    fetched: bool = False,
    **more,
) -> None:
    """The rollout, an idempotent rerun, a refused run of the role (``refused_state``: present
    or absent) with the kept line gone from the configuration's owner, and the removal, with
    the job loop running through the rollout and the removal.
    ``fetched``: every slurmd runs the configuration it fetched from the controller
    (configless), whose file alone the role edits: the nodes' own files stay as they are;
    and a job's tasks are repaired as with the nodes' own files."""
    login, targets = guard.targets["login"], guard.targets
    before = _conf(guard)
    own_before = guard.slurm_confs([node.name for node in guard.compute])
    saved = guard.root / f"{name}.slurm.conf.before"
    saved.write_text(before)
    inventory = _inventory(guard, name, ["c1", "c2", "c3"], **groups)
    # After the canary, c2 and c3 in one batch: one by one is test_cluster_guard.py's rollout.
    settings = guard.rollout_settings(**{"guard_batch": 2, **more})
    work = guard.workdir(f"loop-{name}")
    try:
        # Check mode: the change shown, once, and nothing written anywhere.
        checked = guard.playbook(
            f"{name}: the role, --check --diff",
            str(guard.root / "role.yml"),
            inventory,
            settings,
            "--check",
            "--diff",
        )
        assert (checked.done.returncode, checked.failed) == (0, 0), checked.output[-6000:]
        assert checked.stdout.count(f"+TaskProlog={WRAPPER if site else LAUNCHER}") == 1, checked.stdout[
            -6000:
        ]
        assert _conf(guard) == before
        _assert_nothing_installed(guard)

        with guard.job_loop(work, dict(login_env, TMPDIR=str(work / "tmp"))) as loop:
            loop.wait_for(1, 0)
            play = guard.playbook(f"{name}: guard_rollout.yml", "guard_rollout", inventory, settings)
            switched = time.monotonic()
            assert (play.done.returncode, play.failed) == (0, 0), play.output[-6000:]
            loop.wait_for(JOBS_AFTER, switched)
            installed = _conf(guard)
            own_installed = guard.slurm_confs([node.name for node in guard.compute])
            caches = {node.name: node.read(CONF_CACHE) for node in guard.compute} if fetched else {}
            if fetched:
                _assert_one_repair_per_node(guard, login_env, name)
            kept = {
                node.name: node.run(["test", "-e", STATE_FILE], check=False).returncode == 0
                for node in [guard.cluster.controller, *guard.compute]
            }

            # Plays that write nothing (the checks after them say so): no job is submitted
            # meanwhile; the loop's jobs go on for the removal.
            with loop.paused():
                again = guard.role(f"{name}: the role again", inventory, **settings)
                assert (again.done.returncode, again.failed, again.changed) == (0, 0, 0), again.output[-6000:]

                # The kept line gone from the owner (another host kept it): refused, the line as
                # it is. The state asked for is ``refused_state``: the layouts' tests take one each.
                owner_node = guard.cluster.node(owner)
                owner_node.run(["mv", STATE_FILE, f"{STATE_FILE}.away"])
                try:
                    refused = guard.role(
                        f"{name}: {refused_state}, the kept line elsewhere (refused)",
                        inventory,
                        **dict(settings, arch_guard_state=refused_state),
                    )
                finally:
                    owner_node.run(["mv", f"{STATE_FILE}.away", STATE_FILE])
                assert refused.done.returncode == 2, refused.output[-6000:]
                assert f"but {STATE_FILE} is not there" in refused.stdout
                assert _conf(guard) == installed
                for node in guard.compute:
                    assert node.run(["test", "-x", LAUNCHER], check=False).returncode == 0, node.name

            removing = time.monotonic()
            removal = guard.role(f"{name}: absent", inventory, **dict(settings, arch_guard_state="absent"))
            removed = time.monotonic()
            assert (removal.done.returncode, removal.failed) == (0, 0), removal.output[-6000:]
            loop.wait_for(JOBS_AFTER, removed)

        # Not one job failed, before, during or after the plays.
        assert loop.failed() == [], [(job.returncode, job.stdout, job.stderr) for job in loop.failed()]
        rolled_out = [job for job in loop.jobs if switched < job.started and job.ended < removing]
        assert len(rolled_out) >= JOBS_AFTER
        for job in rolled_out:
            assert _tasks_show(job, reloaded=True, site=site, targets=targets, login=login), job.stdout
            if site:
                _assert_site_output_first(job)
        for job in [job for job in loop.jobs if job.started > removed]:
            assert _tasks_show(job, reloaded=False, site=site, targets=targets, login=login), job.stdout
        # The line changed once, on the configuration's owner; the canary's job ran after it.
        changes = re.findall(
            r"TASK \[hpcstack.ops.arch_guard : Set TaskProlog in slurm.conf\] \**\n(\w+: .*)", play.stdout
        )
        done = [change for change in changes if not change.startswith("skipping")]
        assert len(done) == 1, changes
        assert re.fullmatch(
            r"changed: \[c1\]" if owner == "c1" else rf"changed: \[c1 -> {owner}\b.*\]", done[0]
        )
        assert play.stdout.count("RUNNING HANDLER [hpcstack.ops.arch_guard : Reconfigure Slurm]") == 1
        assert f"a task on c1 submitted from {login} got {targets['c1']}" in play.stdout
        # The line found before the guard's is kept once, on the owner.
        assert kept == {node: node == owner for node in kept}
        assert installed.count(f"TaskProlog={WRAPPER if site else LAUNCHER}\n") == 1, installed
        if fetched:
            # The controller's file alone got the line, and each slurmd runs what it fetched.
            assert installed == before + f"TaskProlog={LAUNCHER}\n"
            assert own_installed == own_before
            for node_name, cache in caches.items():
                assert f"TaskProlog={LAUNCHER}" in cache, node_name
        # Removed: the configuration byte for byte what it was, the guard gone from every node.
        assert guard.cluster.controller.run(["cmp", str(saved), SLURM_CONF], check=False).returncode == 0
        for node in guard.compute:
            assert node.run(["test", "-e", PREFIX], check=False).returncode == 1, node.name
    finally:
        _cleanup(guard, before)


# ------------------------------------------------------------------ one slurm.conf, mounted


@pytest.fixture(scope="class")
def shared(guard: ClusterGuard):
    """One ``/etc/slurm`` for every node, whose TaskProlog line is the site's own (class-long)."""
    site = guard.root / "site"
    site.mkdir(mode=0o755)
    (site / "prolog.sh").write_text(SITE_PROLOG)
    (site / "prolog.sh").chmod(0o755)
    with guard.shared_slurm_conf() as conf:
        with conf.open("a") as handle:
            handle.write(f"TaskProlog = {site / 'prolog.sh'}   # the site's own\n")
        guard.cluster.controller.run(["scontrol", "reconfigure"])
        yield conf


@pytest.fixture(scope="class")
def configless(guard: ClusterGuard):
    """slurmctld with enable_configless, every slurmd with --conf-server (class-long)."""
    guard.restart_slurm(configless=True)
    try:
        yield
    finally:
        guard.restart_slurm(configless=False)


def test_hosts_that_read_a_shared_file_and_their_own_at_once_are_refused(guard):
    before = _conf(guard)
    inventory = _inventory(guard, "mixed", ["c1", "c2", "c3"])
    with guard.shared_slurm_conf(("c1", "c2")):
        play = guard.role("c1 and c2 one file, c3 its own (refused)", inventory, **guard.rollout_settings())

    assert play.done.returncode == 2, play.output[-6000:]
    assert (
        "the hosts of this play read 2 different slurm.conf, some of them shared (c1, c2; c3)" in play.stdout
    )
    assert play.stdout.count("fatal: [") == 1, play.stdout[-6000:]
    assert _conf(guard) == before
    _assert_nothing_installed(guard)


class TestSharedSlurmConf:
    """One ``/etc/slurm`` for every node, whose TaskProlog line is the site's own."""

    def test_a_node_missing_from_the_inventory_stops_the_play_before_the_line_changes(self, guard, shared):
        _assert_refused_for_a_missing_node(guard, "shared-missing", {})

    def test_rollout_and_removal_fail_no_job_chain_the_site_s_prolog_and_put_its_line_back(
        self, guard, shared, login_env
    ):
        _assert_rollout_and_removal_under_load(
            guard, login_env, "shared", {}, site=True, owner="c1", refused_state="present"
        )


# ------------------------------------------------------------------ configless Slurm


class TestConfigless:
    """slurmctld with enable_configless, every slurmd started with --conf-server."""

    def test_a_node_missing_from_the_inventory_stops_the_play_before_the_line_changes(
        self, guard, configless
    ):
        _assert_refused_for_a_missing_node(
            guard, "configless-missing", {"controller": ["ctl"]}, arch_guard_slurm_conf_host="ctl"
        )

    def test_configless_slurm_without_the_controller_named_is_refused(self, guard, configless):
        before = _conf(guard)
        inventory = _inventory(guard, "configless-unnamed", ["c1", "c2", "c3"])

        play = guard.role(
            "configless, no arch_guard_slurm_conf_host (refused)", inventory, **guard.rollout_settings()
        )

        assert play.done.returncode == 2, play.output[-6000:]
        assert "slurmd on c1, c2, c3 runs configless (--conf-server)" in play.stdout
        assert play.stdout.count("fatal: [") == 1, play.stdout[-6000:]
        assert _conf(guard) == before
        _assert_nothing_installed(guard)

    def test_rollout_and_removal_fail_no_job_and_edit_only_the_controller_s_file(
        self, guard, configless, login_env
    ):
        _assert_rollout_and_removal_under_load(
            guard,
            login_env,
            "configless",
            {"controller": ["ctl"]},
            site=False,
            owner="ctl",
            refused_state="absent",
            fetched=True,
            arch_guard_slurm_conf_host="ctl",
        )
