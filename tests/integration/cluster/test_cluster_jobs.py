"""Rebuilds as Slurm jobs on the cluster: one tree per CPU target on the shared filesystem,
each rebuilt by a job on a node of its target, all of them published together by a last job.

The three compute nodes report three CPU targets (zen3, icelake and haswell on x86_64) and
advertise each as a Slurm feature; the site file names, per target, its tree on the shared
filesystem, archdetect's answer on its nodes and the constraint that reaches them. Everything
runs as the build account, which owns the trees: the submission on the login node (a Slurm
client), the jobs on the compute nodes (EasyBuild, Lmod and the tool of this checkout, which
every node sees under /work). The trees are on one disk every node sees (``one_disk``); the
file's tests share one set-up (the account's trees, their first install, the site file),
and each test rebuilds TinyLib with a greeting of its own, so a module that loads the new
build shows which one it got.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

import checkout
import stackenv
import tinypkgs
from tests.integration.harness.cluster import CLUSTER_GUARD, ClusterPlaybooks, build_account

# In the guard's group: the storage group's files take longer already (see the harness).
pytestmark = CLUSTER_GUARD

__all__ = ["build_account"]  # the fixture, used by the tests below

LIB = f"{tinypkgs.LIB}/{tinypkgs.VERSION}"
APP = f"{tinypkgs.APP}/{tinypkgs.VERSION}"
SUBMIT_NODE = "login"
ARCHDETECT = checkout.REPO / "testbed" / "eessi_like" / "eessi_archdetect.sh"
JOB_TIMEOUT = 300
# Slurm's states of a job that is over.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class Targets:
    """The build account's per-target trees on the shared filesystem, the site file that
    describes them, and the tool and EasyBuild the account runs on every node."""

    def __init__(self, cluster, account, shared, lmod) -> None:
        self.cluster, self.account, self.lmod = cluster, account, lmod
        self.login = cluster.node(SUBMIT_NODE)
        # target name -> its compute node: the node's Slurm feature is the target's name.
        self.nodes = {node.spec.feature: node for node in cluster.by_role("compute")}
        self.root = Path(shared.mountpoint) / f"targets-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(mode=0o755)
        self.markers = self.root / "markers"
        for directory in (self.root / "trees", self.markers):
            directory.mkdir(mode=0o755)
            os.chown(directory, account.uid, account.gid)
        self.trees = {name: self.root / "trees" / name for name in self.nodes}
        self.site_file = self.write_site(
            "site.ini", {name: (node.spec.target, name) for name, node in self.nodes.items()}
        )
        self.tool = self.write_tool()

    # --- the site ------------------------------------------------------------------------
    def write_site(self, filename: str, targets: dict) -> Path:
        """A site file: ``targets`` {name: (cpu, constraint)}, each with its tree here."""
        lines = ["[site]", f"archdetect = {ARCHDETECT}", ""]
        for name, (cpu, constraint) in targets.items():
            lines += [
                f"[target {name}]",
                f"cpu = {cpu}",
                f"installpath = {self.trees[name]}",
                f"constraint = {constraint}",
                "",
            ]
        path = self.root / filename
        path.write_text("\n".join(lines))
        return path

    def write_tool(self) -> Path:
        """``eb-staged-rebuild`` of this checkout, as a command every node runs."""
        package_root = checkout.link_package(self.root / "package")
        tool = self.root / "bin" / "eb-staged-rebuild"
        tool.parent.mkdir()
        tool.write_text(
            "#!/bin/sh\n"
            f'PYTHONPATH={package_root} exec {sys.executable} -m hpcstack_ops.staged_rebuild.cli "$@"\n'
        )
        tool.chmod(0o755)
        return tool

    def state_root(self, name: str) -> Path:
        return self.trees[name] / ".eb-staged-rebuild"

    def live(self, name: str, module: str = LIB) -> Path:
        return self.trees[name] / "software" / module

    def module_file(self, name: str, module: str = LIB) -> Path:
        return self.trees[name] / "modules" / "all" / f"{module}.lua"

    def inodes(self) -> dict:
        """Each target's live TinyLib directory and module file, by inode."""
        return {
            name: (self.live(name).stat().st_ino, self.module_file(name).stat().st_ino) for name in self.trees
        }

    # --- what the account runs -----------------------------------------------------------
    def packages(self, label: str, greeting: str) -> tinypkgs.TinyPackages:
        return tinypkgs.write_packages(self.root / "packages" / label, greeting=greeting)

    def env(
        self, packages: tinypkgs.TinyPackages, installpath: Path | None = None, sources: str = ""
    ) -> dict:
        """The account's environment for EasyBuild: Lmod, offline sources, EasyBuild's own
        state in the account's home (each node's own: concurrent builds never meet)."""
        home = Path(self.account.home)
        env = stackenv.easybuild_env(
            self.lmod,
            prefix=home / "easybuild",
            installpath=installpath or self.root,
            sources=Path(sources) if sources else packages.sources,
            easyconfigs=packages.easyconfigs,
            base=self.account.env(),
        )
        env.pop("EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES", None)
        if installpath is None:  # a job's target names its tree
            del env["EASYBUILD_INSTALLPATH"]
            env["MODULEPATH"] = ""
        env.update(
            {
                "TMPDIR": str(home),
                "EB_STAGED_REBUILD_EB": str(stackenv.find_eb()),
                "EB_STAGED_REBUILD_COMMAND": str(self.tool),
            }
        )
        return env

    def first_install(self) -> None:
        """Plain EasyBuild, as the account, on each target's own node, all at once."""
        packages = self.packages("gen1", tinypkgs.GREETING)
        started = {}
        for name, node in self.nodes.items():
            self.trees[name].mkdir()
            os.chown(self.trees[name], self.account.uid, self.account.gid)
            argv = self.account.command(
                [str(stackenv.find_eb()), str(packages.easyconfig(tinypkgs.APP)), "--robot"]
            )
            started[name] = node.popen(
                argv, env=self.env(packages, self.trees[name]), stdout=-1, stderr=-2, text=True
            )
        for name, process in started.items():
            output, _ = process.communicate(timeout=JOB_TIMEOUT)
            assert process.returncode == 0, f"{name}: {output[-3000:]}"

    def tool_run(self, *args: str, env: dict, node=None):
        """The tool, as the account, on the login node (or ``node``)."""
        return (node or self.login).run(self.account.command([str(self.tool), *args]), env=env, check=False)

    def submit(self, packages: tinypkgs.TinyPackages, *extra: str, env: dict | None = None) -> dict:
        """``rebuild --job`` of TinyLib for every target of the site file, published together."""
        done = self.tool_run(
            "rebuild", "--module", LIB, "--job", "--targets-file", str(self.site_file),
            "--target", "all", "--publish", "together", *extra, "--json",
            "--", str(packages.easyconfig(tinypkgs.LIB)),
            env=env or self.env(packages),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def status(self, run_id: str, *, site_file: Path | None = None):
        return self.tool_run(
            "status", run_id, "--targets-file", str(site_file or self.site_file), "--target", "all",
            env=self.account.env(),
        )  # fmt: skip

    def discard(self, run_id: str, names) -> None:
        """Discard the staged runs of targets ``names`` (the others' runs ended otherwise),
        as a site would after a failure; the next test then starts from published trees."""
        chosen = [word for name in names for word in ("--target", name)]
        done = self.tool_run(
            "discard", run_id, "--targets-file", str(self.site_file), *chosen, env=self.account.env()
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for name in names:
            assert self.journal(name, run_id)["state"] == "failed", "a discarded run ends failed"

    def journal(self, name: str, run_id: str) -> dict:
        return json.loads((self.state_root(name) / "runs" / run_id / "journal.json").read_text())

    def loads_on_its_node(self, name: str) -> str:
        """What TinyApp prints when a job's shell on the target's node loads it from its tree."""
        env = self.lmod.env([self.trees[name] / "modules" / "all"], base=self.account.env())
        done = self.nodes[name].run(
            self.account.command(self.lmod.shell_command(f"module load {APP} && tinyapp")),
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    # --- Slurm, as the controller sees it --------------------------------------------------
    def job(self, job_id: str) -> dict:
        """``scontrol show job``'s fields of a job (Slurm keeps an ended one for MinJobAge)."""
        done = self.cluster.controller.run(["scontrol", "show", "job", "-o", str(job_id)])
        return dict(field.split("=", 1) for field in shlex.split(done.stdout) if "=" in field)

    def wait_ended(self, *job_ids: str) -> dict:
        """Each job's fields once all of them ended."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            jobs = {job_id: self.job(job_id) for job_id in job_ids}
            if all(job["JobState"] in ENDED for job in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs not ended in {JOB_TIMEOUT} s: {jobs}")
            time.sleep(0.2)

    def scontrol(self, *args: str) -> None:
        self.cluster.controller.run(["scontrol", *args])


@pytest.fixture(scope="module")
def targets(cluster, build_account, one_disk, lmod):
    """The set-up the file's tests share: three trees, installed by the account on their nodes."""
    site = Targets(cluster, build_account, one_disk, lmod)
    site.first_install()
    return site


def _jobs_by_target(submitted: dict) -> dict:
    return {job["target"]: str(job["job_id"]) for job in submitted["jobs"]}


def test_one_command_rebuilds_each_target_on_its_node_and_publishes_them_together(targets):
    packages = targets.packages("together", "hello from TinyLib 1.0, built per target")
    before = targets.inodes()

    submitted = targets.submit(packages)
    # The last job waits for the targets' jobs; held, it shows the trees between the two.
    targets.scontrol("hold", str(submitted["publish_job"]))
    jobs = _jobs_by_target(submitted)
    ended = targets.wait_ended(*jobs.values())
    staged_inodes = targets.inodes()
    staged = {name: targets.journal(name, submitted["run_id"]) for name in jobs}
    targets.scontrol("release", str(submitted["publish_job"]))
    published = targets.wait_ended(str(submitted["publish_job"]))[str(submitted["publish_job"])]

    assert sorted(jobs) == sorted(targets.nodes), submitted
    for name, job_id in jobs.items():
        node = targets.nodes[name].name
        assert (ended[job_id]["JobState"], ended[job_id]["NodeList"]) == ("COMPLETED", node), ended[job_id]
        assert ended[job_id]["UserId"].startswith(f"{targets.account.name}("), ended[job_id]
        assert staged[name]["state"] == "staged", staged[name]
        assert staged[name]["job"]["job_id"] == job_id
        assert (staged[name]["job"]["node"], staged[name]["job"]["target"]) == (node, name)
    assert staged_inodes == before, "a live tree changed before the last job"
    assert published["JobState"] == "COMPLETED", published
    after = targets.inodes()
    for name in jobs:
        assert targets.journal(name, submitted["run_id"])["state"] == "published"
        assert after[name][0] != before[name][0], f"{name}'s live TinyLib was not exchanged"
        assert targets.loads_on_its_node(name) == "hello from TinyLib 1.0, built per target"


def _blocks(report: str) -> dict:
    """``status --target``'s text, by target: each target's block of lines, blanks folded
    (a long value is wrapped over lines)."""
    blocks: dict = {}
    name = None
    for line in report.splitlines():
        if line.startswith("Target "):
            name = line.split()[1]
            blocks[name] = ""
        elif name is not None:  # a long command continues on the next line after " \\"
            blocks[name] += " " + " ".join(line.split())
    return blocks


def test_a_build_that_fails_on_one_target_publishes_none_and_the_report_says_why(targets):
    packages = targets.packages("fails-on-one", "hello from TinyLib 1.0, never published")
    # EasyBuild's source directory on each node's own disk, the account's, empty on one node:
    # its build fails there, the source not found (and no URL to download it from).
    sources = f"/opt/hpcstack-sources-{uuid.uuid4().hex[:8]}"
    failing = sorted(targets.nodes)[1]
    account = targets.account
    for name, node in targets.nodes.items():
        node.run(["install", "-d", "-o", str(account.uid), "-g", str(account.gid), sources])
        if name != failing:
            node.run(["cp", "-r", f"{packages.sources}/.", sources])
            node.run(["chown", "-R", f"{account.uid}:{account.gid}", sources])
    before, was = targets.inodes(), targets.loads_on_its_node(failing)
    try:
        submitted = targets.submit(packages, env=targets.env(packages, sources=sources))
        jobs = _jobs_by_target(submitted)
        ended = targets.wait_ended(*jobs.values(), str(submitted["publish_job"]))
        report = targets.status(submitted["run_id"])
        journals = {name: targets.journal(name, submitted["run_id"]) for name in jobs}
    finally:
        for node in targets.nodes.values():
            node.run(["rm", "-rf", sources])

    assert ended[jobs[failing]]["JobState"] == "FAILED", ended
    assert ended[str(submitted["publish_job"])]["JobState"] == "CANCELLED", "the last job must never run"
    assert targets.inodes() == before, "nothing is published when one target failed"
    assert journals[failing]["state"] == "failed", journals[failing]
    reason = journals[failing]["error"]
    assert "TinyLib-1.0.tar.gz" in reason, reason  # EasyBuild's own words: the source it lacked
    assert report.returncode == 0, report.stderr
    blocks = _blocks(report.stdout)
    assert sorted(blocks) == sorted(jobs), report.stdout  # one block per target
    for name in jobs:
        if name != failing:
            assert journals[name]["state"] == "staged", journals[name]
            assert "staged" in blocks[name], report.stdout
    assert " ".join(reason.split()) in blocks[failing], report.stdout
    targets.discard(submitted["run_id"], [name for name in jobs if name != failing])
    assert targets.inodes() == before
    assert targets.loads_on_its_node(failing) == was


# Appended to TinyLib's easyconfig: the build says on which node it runs, then waits for the
# test's word, so that a job can be cancelled while EasyBuild builds.
WAIT_FOR_WORD = "touch {markers}/building-$(uname -n); while [ ! -e {markers}/go ]; do sleep 0.1; done"


def test_scancel_of_one_target_s_job_during_its_build_reverses_it_and_publishes_none(targets):
    packages = targets.packages("cancelled", "hello from TinyLib 1.0, cancelled")
    markers = targets.markers / uuid.uuid4().hex[:8]
    markers.mkdir()
    os.chown(markers, targets.account.uid, targets.account.gid)
    command = WAIT_FOR_WORD.format(markers=markers)
    easyconfig = packages.easyconfig(tinypkgs.LIB)
    easyconfig.write_text(easyconfig.read_text() + f"\npostinstallcmds = [{command!r}]\n")
    cancelled = sorted(targets.nodes)[2]
    before = targets.inodes()

    submitted = targets.submit(packages)
    jobs = _jobs_by_target(submitted)
    deadline = time.monotonic() + JOB_TIMEOUT
    while len(list(markers.glob("building-*"))) < len(jobs):
        assert time.monotonic() < deadline, f"not every build started: {list(markers.iterdir())}"
        time.sleep(0.1)
    targets.login.run(targets.account.command(["scancel", jobs[cancelled]]), env=targets.account.env())
    targets.wait_ended(jobs[cancelled])
    (markers / "go").touch()
    ended = targets.wait_ended(*jobs.values(), str(submitted["publish_job"]))
    report = targets.status(submitted["run_id"])
    journals = {name: targets.journal(name, submitted["run_id"]) for name in jobs}

    assert ended[jobs[cancelled]]["JobState"] == "CANCELLED", ended
    assert ended[str(submitted["publish_job"])]["JobState"] == "CANCELLED", ended
    assert targets.inodes() == before, "a live tree changed"
    assert journals[cancelled]["state"] == "failed", journals[cancelled]
    assert journals[cancelled]["cancelled"] is True, journals[cancelled]
    for name in jobs:
        if name != cancelled:
            assert journals[name]["state"] == "staged", journals[name]
    blocks = _blocks(report.stdout)
    assert "(cancelled)" in blocks[cancelled], report.stdout
    # What finishes each staged run: publish it, or discard it.
    for name in jobs:
        if name != cancelled:
            shown = blocks[name].replace(" \\ ", " ")
            for verb in ("publish", "discard"):
                assert f"--state-root {targets.state_root(name)} {verb} {submitted['run_id']}" in shown, shown
    targets.discard(submitted["run_id"], [name for name in jobs if name != cancelled])
    assert targets.inodes() == before


def test_a_job_on_a_node_whose_archdetect_disagrees_refuses_before_building(targets):
    packages = targets.packages("misplaced", "hello from TinyLib 1.0, misplaced")
    names = sorted(targets.nodes)
    # A site file whose first target's constraint reaches the second target's node.
    wrong = targets.write_site(
        "misplaced.ini",
        {names[0]: (targets.nodes[names[0]].spec.target, targets.nodes[names[1]].spec.feature)},
    )
    before = targets.inodes()

    done = targets.tool_run(
        "rebuild", "--module", LIB, "--job", "--targets-file", str(wrong), "--target", names[0], "--json",
        "--", str(packages.easyconfig(tinypkgs.LIB)), env=targets.env(packages),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    submitted = json.loads(done.stdout)
    (job_id,) = _jobs_by_target(submitted).values()
    ended = targets.wait_ended(job_id)[job_id]
    journal = targets.journal(names[0], submitted["run_id"])
    run_dir = targets.state_root(names[0]) / "runs" / submitted["run_id"]

    assert ended["NodeList"] == targets.nodes[names[1]].name, ended
    assert ended["JobState"] == "FAILED", ended
    assert journal["state"] == "failed", journal
    assert journal["job"]["node"] == targets.nodes[names[1]].name
    assert targets.nodes[names[1]].spec.target in journal["error"], journal["error"]
    assert targets.nodes[names[0]].spec.target in journal["error"], journal["error"]
    assert not [step for step in journal["steps"] if step["step"].startswith("build")], journal["steps"]
    assert not (run_dir / "build.log").exists(), "EasyBuild ran"
    assert targets.inodes() == before


def _playbook_vars(targets, packages, **extra) -> dict:
    environment = {
        name: value
        for name, value in targets.env(packages).items()
        if name.startswith(("EASYBUILD_", "LMOD", "EB_")) or name in ("PATH", "HOME", "MODULEPATH", "TMPDIR")
    }
    return {
        "staged_hosts": "submit_hosts",
        "staged_modules": [LIB],
        "staged_easyconfigs": [str(packages.easyconfig(tinypkgs.LIB))],
        "staged_rebuild_when": "always",
        "staged_environment": environment,
        "staged_job": True,
        "staged_targets_file": str(targets.site_file),
        "staged_targets": ["all"],
        "staged_publish": "together",
        "staged_wait_timeout": JOB_TIMEOUT,
        **extra,
    }


def test_the_rebuild_playbook_lists_the_jobs_in_check_mode_then_submits_waits_and_reports_each_target(
    targets, cluster, tmp_path
):
    tmp_path.chmod(0o755)
    # The login node submits, as the build account (root's SSH, then su: no password, no sudo).
    inventory = cluster.inventory(
        {"submit_hosts": [SUBMIT_NODE]},
        path=tmp_path / "inventory.yml",
        ansible_become=True,
        ansible_become_method="su",
        ansible_become_user=targets.account.name,
    )
    plays = ClusterPlaybooks(cluster, tmp_path / "ansible", inventory)
    packages = targets.packages("playbook", "hello from TinyLib 1.0, by the playbook")
    variables = _playbook_vars(targets, packages)
    runs_before = {name: set(os.listdir(targets.state_root(name) / "runs")) for name in targets.trees}
    before = targets.inodes()

    checked = plays.run("rebuild", "-e", json.dumps(variables), "--check")

    assert checked.failed == 0, checked.output
    would = [line for line in checked.stdout.splitlines() if "would submit" in line]
    assert len(would) == len(targets.trees) + 1, checked.stdout  # a job per target, the publish job
    for node in targets.nodes.values():
        assert any(f"--constraint={node.spec.feature}" in line for line in would), would
    assert any("--dependency=afterok:" in line for line in would), would
    assert {name: set(os.listdir(targets.state_root(name) / "runs")) for name in targets.trees} == runs_before
    assert cluster.controller.run(["squeue", "-h", "--all"]).stdout.strip() == "", "check mode submitted"

    played = plays.run("rebuild", "-e", json.dumps(variables))

    assert played.failed == 0, played.output
    assert played.recap[SUBMIT_NODE][1] == 1, played.output  # the one change: the submission
    after = targets.inodes()
    (run_id,) = (
        set(os.listdir(targets.state_root(sorted(targets.trees)[0]) / "runs"))
        - runs_before[sorted(targets.trees)[0]]
    )
    for name, node in targets.nodes.items():
        journal = targets.journal(name, run_id)
        assert (journal["state"], journal["job"]["node"]) == ("published", node.name), journal
        assert f"{name}: published, job {journal['job']['job_id']} on {node.name} COMPLETED, published" in (
            played.stdout
        ), played.stdout
        assert after[name][0] != before[name][0]
        assert targets.loads_on_its_node(name) == "hello from TinyLib 1.0, by the playbook"
