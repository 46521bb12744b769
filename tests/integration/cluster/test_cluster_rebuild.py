"""Staged rebuilds on the cluster: the build_host role over SSH onto a build node, and a
publish by ``hpcstack.ops.rebuild`` while a job on a compute node runs a program from the
live tree, on each real shared filesystem.

The live tree is on the shared filesystem, mounted on the build node and on the compute
nodes: GlusterFS and CephFS (both FUSE, where ``probe`` finds no directory exchange), and a
directory of the machine's own disk that every node sees (one kernel under all the nodes,
where it finds one). The job opens the library's install directory once per run, as a job does
(``tests/support/tree_reader.py``). Where ``probe`` says the directory exchange works on that
filesystem, the job must never see the install missing or partial; where it says the
fallback is taken, the live name may be missing for the moment between two renames (the
documented behaviour), never partial. The test also reads the run's journal: the fallback's
renames are journaled, so it says which of the two the publish really did, and that must be
what ``probe`` predicted.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

import checkout
import stackenv
import tinypkgs
from tests.integration.harness.cluster import CLUSTER, ClusterPlaybooks

pytestmark = CLUSTER

BUILD_NODE = "b1"
JOB_NODE = "c1"
READER = checkout.REPO / "tests" / "support" / "tree_reader.py"
WHEELHOUSE = Path(stackenv.find_eb()).parent.parent / "wheelhouse"
PREFIX = "/opt/hpcstack/eb-staged-rebuild"
COMMAND = "/usr/local/bin/eb-staged-rebuild"
SLURM_CONF = "/etc/slurm/slurm.conf"
LIB = f"{tinypkgs.LIB}/{tinypkgs.VERSION}"
APP = f"{tinypkgs.APP}/{tinypkgs.VERSION}"
NEW_GREETING = "hello from TinyLib 1.0, rebuilt"
# Runs of the job after the publish, so that the report shows the new tree for certain.
RUNS_AFTER = 20
JOB_TIMEOUT = 120

ROLE_PLAY = """\
- name: Prepare the build hosts
  hosts: build_hosts
  gather_facts: false
  roles:
    - role: hpcstack.ops.build_host
"""


class LiveTree:
    """One test's live tree on a shared filesystem, and what runs on and around it."""

    def __init__(self, cluster, shared, scratch: Path, lmod: stackenv.Lmod) -> None:
        self.cluster, self.shared, self.scratch, self.lmod = cluster, shared, scratch, lmod
        self.installpath = f"{shared.mountpoint}/apps-{uuid.uuid4().hex[:8]}"
        self.state_root = f"{self.installpath}/.eb-staged-rebuild"
        self.build = cluster.node(BUILD_NODE)
        inventory = cluster.inventory({"build_hosts": [BUILD_NODE]}, path=scratch / "inventory.yml")
        self.plays = ClusterPlaybooks(cluster, scratch / "ansible", inventory)

    def easybuild_env(self, packages: tinypkgs.TinyPackages) -> dict:
        """EasyBuild's settings on the build node: offline sources, Lmod, the live tree."""
        env = stackenv.easybuild_env(
            self.lmod,
            prefix=self.scratch / "eb-state",
            installpath=Path(self.installpath),
            sources=packages.sources,
            easyconfigs=packages.easyconfigs,
            base={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8"},
        )
        env["TMPDIR"] = str(self.scratch)
        return env

    def install_role(self):
        (self.scratch / "role.yml").write_text(ROLE_PLAY)
        return self.plays.run(
            str(self.scratch / "role.yml"),
            "-e", f"build_host_installpath={self.installpath}",
            "-e", json.dumps({"build_host_pip_args": ["--no-index", "--find-links", str(WHEELHOUSE)]}),
        )  # fmt: skip

    def first_install(self, packages: tinypkgs.TinyPackages) -> None:
        """Plain EasyBuild on the build node, as the site installed the software at first."""
        env = self.easybuild_env(packages)
        done = self.build.run(
            [str(stackenv.find_eb()), str(packages.easyconfig(tinypkgs.APP)), "--robot"],
            env=env, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def probe(self) -> dict:
        done = self.cluster.ssh(
            self.build, [COMMAND, "probe", "--path", f"{self.installpath}/software", "--json"], check=False
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def rebuild(self, packages: tinypkgs.TinyPackages):
        env = self.easybuild_env(packages)
        environment = {name: value for name, value in env.items() if name.startswith(("EASYBUILD_", "LMOD"))}
        environment.update(
            {"EB_STAGED_REBUILD_EB": f"{PREFIX}/venv/bin/eb", "EB_PYTHON": f"{PREFIX}/venv/bin/python"}
        )
        variables = {
            "staged_hosts": "build_hosts",
            "staged_state_root": self.state_root,
            "staged_installpath": self.installpath,
            "staged_modules": [LIB],
            "staged_easyconfigs": [str(packages.easyconfig(tinypkgs.LIB))],
            "staged_environment": environment,
        }
        return self.plays.run("rebuild", "-e", json.dumps(variables))

    def journal_steps(self) -> list:
        runs = self.build.run(["ls", f"{self.state_root}/runs"]).stdout.split()
        assert len(runs) == 1, runs
        journal = json.loads(self.build.read(f"{self.state_root}/runs/{runs[0]}/journal.json"))
        return [step["step"] for step in journal["steps"]]


class Clock:
    """Wall time per phase, for the test's report."""

    def __init__(self) -> None:
        self.start, self.laps = time.monotonic(), []

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{what} {now - self.start:.1f} s")
        self.start = now

    def __str__(self) -> str:
        return ", ".join(self.laps)


class Job:
    """``tree_reader.py`` as a Slurm job on the compute node, submitted from the login node."""

    def __init__(self, cluster, live: LiveTree) -> None:
        self.report = live.scratch / "reader.json"
        self.stop_file = live.scratch / "reader.stop"
        argv = [
            "srun", "-N1", "-w", JOB_NODE, "--chdir=/", "/usr/bin/python3", str(READER),
            f"{live.installpath}/software/{APP}/bin/tinyapp", f"{live.installpath}/software/{LIB}",
            str(self.stop_file), str(self.report),
        ]  # fmt: skip
        self.process = cluster.node("login").popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.wait_for_runs(None, 1)

    def counts(self) -> dict:
        return json.loads(self.report.read_text())["counts"] if self.report.exists() else {}

    def wait_for_runs(self, greeting: str | None, runs: int) -> None:
        """Until the job has made ``runs`` runs (that saw ``greeting``, if given)."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            counts = self.counts()
            if (counts.get(greeting, 0) if greeting else sum(counts.values())) >= runs:
                return
            if self.process.poll() is not None:
                raise AssertionError(f"the job ended early: {self.process.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the job made no {runs} runs of {greeting} in {JOB_TIMEOUT} s: {counts}"
                )
            time.sleep(0.05)

    def stop(self) -> dict:
        end_job(self.process, self.stop_file)
        return json.loads(self.report.read_text())


def end_job(process: subprocess.Popen, stop_file: Path) -> None:
    """Ask a job's program to stop (its stop file), wait for its srun, kill it if need be."""
    stop_file.touch()
    try:
        process.wait(timeout=JOB_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


@pytest.fixture(scope="module")
def prepared(cluster, one_disk, lmod, tmp_path_factory):
    """The build node prepared by the build_host role over SSH, for a live tree on one disk.

    Once per module: the role's first install (EasyBuild into its environment) is the slow
    part, and the publishes on the other filesystems name their live trees themselves.
    """
    scratch = tmp_path_factory.mktemp("prepared")
    scratch.chmod(0o755)
    tree = LiveTree(cluster, one_disk, scratch, lmod)
    tree.first_install(tinypkgs.write_packages(scratch / "gen1"))
    started = time.monotonic()
    tree.role_play = tree.install_role()
    tree.role_seconds = time.monotonic() - started
    return tree


@pytest.fixture(params=["one_disk", "glusterfs", "cephfs"])
def live(request, prepared, cluster, lmod, tmp_path):
    if request.param == "one_disk":
        return prepared
    tmp_path.chmod(0o755)
    tree = LiveTree(cluster, request.getfixturevalue(request.param), tmp_path, lmod)
    tree.first_install(tinypkgs.write_packages(tmp_path / "gen1"))
    return tree


def test_the_build_host_role_prepares_the_build_node_over_ssh(prepared, cluster):
    play = prepared.role_play
    assert play.failed == 0, play.output
    assert play.unreachable == 0, play.output
    assert list(play.recap) == [BUILD_NODE], "only the build node, reached over SSH"
    assert play.changed > 0, play.output
    # The role's command runs on the build node and names the role's EasyBuild.
    done = cluster.ssh(prepared.build, [COMMAND, "--json", "probe", "--path", prepared.state_root])
    pinned = yaml.safe_load((checkout.REPO / "roles/build_host/defaults/main.yml").read_text())
    assert json.loads(done.stdout)["easybuild_version"] == pinned["build_host_easybuild_version"]
    assert cluster.node(JOB_NODE).run(["test", "-e", COMMAND], check=False).returncode == 1, "only on b1"
    print(f"build_host role over SSH, first install: {prepared.role_seconds:.1f} s")


def test_a_publish_on_the_shared_filesystem_is_what_probe_said_to_a_running_job(live, cluster):
    clock = Clock()
    probed = live.probe()
    assert probed["filesystem"] == live.shared.fstype, probed
    clock.lap("probe")

    job = Job(cluster, live)
    try:
        published = live.rebuild(tinypkgs.write_packages(live.scratch / "gen2", greeting=NEW_GREETING))
        assert published.failed == 0, published.output
        assert published.changed == 1, published.output
        clock.lap("rebuild playbook")
        # The publish is over: the job must now see the new tree, run after run.
        job.wait_for_runs(NEW_GREETING, RUNS_AFTER)
    finally:
        seen = job.stop()

    counts = seen["counts"]
    # What the closing figures quote: the filesystem, probe's answer, the job's runs, the times.
    print(
        f"{live.shared.kind} {live.shared.version}: exchange={probed['exchange']} "
        f"job runs {json.dumps(counts)}; {clock}"
    )
    assert seen["order"] == [tinypkgs.GREETING, NEW_GREETING], seen
    assert counts.get("partial", 0) == 0, seen
    steps = live.journal_steps()
    fell_back = any(step.startswith("fallback-") for step in steps)
    assert fell_back == (not probed["exchange"]), (probed, steps)
    if probed["exchange"]:
        assert counts.get("missing", 0) == 0, seen
    assert set(counts) <= {tinypkgs.GREETING, NEW_GREETING, "missing"}, seen


# Holds a file of the live tree open and runs the tree's program in a loop, as a job does,
# until the stop file exists; writes its SLURM_JOB_ID to the ready file once the file is open.
HOLDER = """
import os, pathlib, subprocess, sys, time
held = open(sys.argv[1], "rb")
stop, ready = pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])
ready.write_text(os.environ["SLURM_JOB_ID"])
while not stop.exists():
    subprocess.run([sys.argv[2]], stdout=subprocess.DEVNULL, check=False)
    time.sleep(0.1)
"""
COMPUTE_NODES = ("c1", "c2", "c3")


class HoldingJob:
    """A Slurm job on the compute node that keeps a file of the live tree open."""

    def __init__(self, cluster, live: LiveTree, held: str) -> None:
        self.stop_file = live.scratch / "holder.stop"
        ready = live.scratch / "holder.ready"
        program = f"{live.installpath}/software/{APP}/bin/tinyapp"
        argv = ["srun", "-N1", "-w", JOB_NODE, "--chdir=/", "/usr/bin/python3", "-c", HOLDER,
                held, program, str(self.stop_file), str(ready)]  # fmt: skip
        self.process = cluster.node("login").popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + JOB_TIMEOUT
        while not (ready.exists() and ready.read_text()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                _out, said = self.process.communicate()
                raise AssertionError(f"the holding job never started: {said}")
            time.sleep(0.05)
        self.job_id = ready.read_text()

    def stop(self) -> None:
        end_job(self.process, self.stop_file)


def _fleet_gc(live: LiveTree, inventory: Path, *extra: str):
    variables = {
        "staged_hosts": "build_hosts",
        "staged_state_root": live.state_root,
        "staged_fleet_group": "compute",
        "staged_grace_hours": 0,
        "staged_squeue": False,
    }
    return live.plays.run("gc", "-e", json.dumps(variables), *extra, inventory=str(inventory))


def _report_lines(play) -> list:
    """The fleet report's lines, as the playbook's last task prints them."""
    found = re.search(r'"msg": \[(.*?)\]', play.stdout, re.S)
    assert found, play.output
    return [line.strip().strip('",') for line in found.group(1).splitlines() if line.strip()]


class SleepJob:
    """A ``sleep`` job on a compute node, submitted from the login node: it holds nothing of
    the tree, so only gc's Slurm rule can keep a tree for it."""

    def __init__(self, cluster, node: str) -> None:
        self.login = cluster.node("login")
        submitted = self.login.run(
            ["sbatch", "--parsable", "-w", node, "--output=/dev/null", "--wrap", "sleep 600"]
        )
        self.job_id = submitted.stdout.strip().split(";")[0]
        deadline = time.monotonic() + JOB_TIMEOUT
        while self.state() != "RUNNING":
            if time.monotonic() > deadline:
                self.cancel()
                raise AssertionError(f"job {self.job_id} never ran")
            time.sleep(0.1)

    def state(self) -> str:
        return _job_state(self.login, self.job_id)

    def cancel(self) -> None:
        self.login.run(["scancel", self.job_id], check=False)
        _gone(self.login, self.job_id)


def _job_state(login, job_id: str) -> str:
    """Slurm's state of job ``job_id``, "" once it no longer lists it."""
    return login.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()


def _gone(login, job_id: str) -> bool:
    """Whether Slurm stopped listing job ``job_id`` (ended, not completing) within JOB_TIMEOUT."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while _job_state(login, job_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_fleet_gc_keeps_a_tree_a_process_or_an_earlier_job_holds_and_removes_it_once_neither_is_left(
    prepared, cluster
):
    """One publish retires a tree that a job on c1 holds open (a process of the fleet) while
    a job on c2 that holds nothing started before the swap (gc's Slurm rule). gc keeps it for
    the process, names a fleet host that does not answer, shows the removal in check mode
    and, with Slurm asked, keeps it for the earlier job; once that job ends it removes it,
    whatever job started after the swap, and the next run finds nothing to do."""
    live = prepared
    inventory = cluster.inventory(
        {"build_hosts": [BUILD_NODE], "compute": list(COMPUTE_NODES)}, path=live.scratch / "fleet.yml"
    )
    # The same fleet with one more compute node that cannot be reached (nothing listens there).
    fleet = json.loads(inventory.read_text())
    fleet["all"]["children"]["compute"]["hosts"]["dead1"] = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    with_dead = live.scratch / "fleet-dead.yml"
    with_dead.write_text(json.dumps(fleet))
    # The build node asks the cluster's controller, as a build host that is a Slurm client does.
    live.build.write(SLURM_CONF, cluster.controller.read(SLURM_CONF))  # the node's own /etc
    held = f"{live.installpath}/software/{LIB}/share/tinylib/greeting.txt"
    lib_dir = f"{live.installpath}/software/{tinypkgs.LIB}"
    earlier = set(live.build.run(["ls", "-a", lib_dir]).stdout.split())  # other tests' old trees
    before = SleepJob(cluster, "c2")
    after = None
    try:
        job = HoldingJob(cluster, live, held)
        try:
            time.sleep(1.2)  # squeue gives start times to the second
            published = live.rebuild(tinypkgs.write_packages(live.scratch / "gen-fleet", greeting="held"))
            assert published.failed == 0, published.output
            names = set(live.build.run(["ls", "-a", lib_dir]).stdout.split()) - earlier
            (retired,) = [f"{lib_dir}/{name}" for name in names if name.startswith(".1.0.")]

            held_play = _fleet_gc(live, inventory)
        finally:
            job.stop()
        assert _gone(cluster.node("login"), job.job_id), f"job {job.job_id} still listed"

        assert held_play.failed == 0, held_play.output
        lines = _report_lines(held_play)
        (kept,) = [line for line in lines if line.startswith(f"kept {retired}:")]
        assert f"in use on {JOB_NODE} by 1 process" in kept, lines
        assert f"jobs {job.job_id}" in kept, lines
        assert live.build.run(["test", "-d", retired], check=False).returncode == 0

        unanswered = _fleet_gc(live, with_dead)
        checked = _fleet_gc(live, inventory, "--check")
        by_slurm = _fleet_gc(live, inventory, "-e", "staged_squeue=true")

        assert unanswered.failed == 0, unanswered.output
        assert f"kept {retired}: no answer from dead1: every tree is kept" in _report_lines(unanswered)
        assert "no answer from dead1: every tree is kept" in _report_lines(unanswered)
        assert f"removed {retired}" in _report_lines(checked)
        assert live.build.run(["test", "-d", retired], check=False).returncode == 0, "check mode removed it"
        assert by_slurm.failed == 0, by_slurm.output
        assert f"kept {retired}: 1 running job started before the swap ({before.job_id})" in _report_lines(
            by_slurm
        )

        after = SleepJob(cluster, "c3")
        before.cancel()
        removed = _fleet_gc(live, inventory, "-e", "staged_squeue=true")
        again = _fleet_gc(live, inventory, "-e", "staged_squeue=true")
    finally:
        before.cancel()
        if after is not None:
            after.cancel()
        live.build.run(["rm", "-f", SLURM_CONF])

    assert removed.failed == 0, removed.output
    assert f"removed {retired}" in _report_lines(removed), removed.output
    assert removed.recap[BUILD_NODE][1] == 1, removed.output  # the one change: the removal
    assert live.build.run(["test", "-e", retired], check=False).returncode == 1
    assert again.failed == 0, again.output
    assert again.recap[BUILD_NODE][1] == 0, again.output
    assert not any(line.startswith("removed ") for line in _report_lines(again))
