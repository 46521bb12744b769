"""``rebuild --job`` on the session's real single-node Slurm: runs submitted as batch jobs,
their journals, their states in ``status``, ``scancel``, the archdetect check on the node,
``--publish together`` and a refused submission.

The trees are built by the test builder (``tests/builders/fake-eb``), which builds in a
fraction of a second and whose ``FAKE_EB_GATE`` holds a build until the test lets it go:
what is tested is the jobs around the build. Each job runs the tool as the test runs it
(``python -m hpcstack_ops.staged_rebuild.cli``, with the environment sbatch exports).

One node plays every target. Each target's job must find its own CPU there, so the site's
``archdetect`` is a wrapper of the repository's stand-in of EESSI's script that picks the
cpuinfo dump archdetect reads (``EESSI_PROC_CPUINFO``, ``EESSI_MACHINE_TYPE``) from the
job's own environment: ``SLURM_JOB_NAME``, ``eb-staged-rebuild:<run>:<target>``. The target
``liar`` says it is zen3, but its jobs' node reports icelake: the node that disagrees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import checkout
from tests.integration.harness.slurm import SLURM, RunningJob
from tests.support.staged import StagedSite, snapshot

pytestmark = SLURM

APP = "TinyApp/1.0"
EESSI_LIKE = checkout.REPO / "testbed" / "eessi_like"
CPUINFO = {
    "zen3": EESSI_LIKE / "cpuinfo" / "x86_64-amd-zen3-epyc-7763.cpuinfo",
    "icelake": EESSI_LIKE / "cpuinfo" / "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo",
    "liar": EESSI_LIKE / "cpuinfo" / "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo",
}
CPU = {"zen3": "x86_64/amd/zen3", "icelake": "x86_64/intel/icelake", "liar": "x86_64/amd/zen3"}
WAIT = 90  # a job of the idle single-node cluster starts within seconds


class JobSite:
    """Three targets' trees with APP live, the site file naming them, and the tool."""

    def __init__(self, root: Path, package_root: Path, conf: Path) -> None:
        self.root = root
        self.trees = {
            name: StagedSite(
                installpath=root / name, state_root=root / name / "state", package_root=package_root
            )
            for name in CPU
        }
        for tree in self.trees.values():
            tree.install(APP, payload="old")
        self.gate = root / "gate"
        self.gate.mkdir()
        self.archdetect = root / "archdetect.sh"
        cases = "".join(f"  *:{name}) cpuinfo={path} ;;\n" for name, path in CPUINFO.items())
        self.archdetect.write_text(
            "# The node of the job's target: its name ends the job's name.\n"
            f'case "$SLURM_JOB_NAME" in\n{cases}esac\n'
            'export EESSI_PROC_CPUINFO="$cpuinfo" EESSI_MACHINE_TYPE=x86_64\n'
            f'exec bash {EESSI_LIKE / "eessi_archdetect.sh"} "$@"\n'
        )
        self.site_file = root / "site.ini"
        self.write_site()
        self.env = {"SLURM_CONF": str(conf), "FAKE_EB_PAYLOAD": "new"}

    def write_site(self, **partitions: str) -> None:
        """The site file; each target in the partition ``partitions`` names, else ``debug``."""
        self.site_file.write_text(
            f"[site]\narchdetect = {self.archdetect}\n\n"
            + "".join(
                f"[target {name}]\ncpu = {CPU[name]}\ninstallpath = {tree.installpath}\n"
                f"state-root = {tree.state_root}\npartition = {partitions.get(name, 'debug')}\n\n"
                for name, tree in self.trees.items()
            )
        )

    def run(self, *args: str, env=None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli", *args],
            env=self.trees["zen3"].tool_env(**self.env, **(env or {})),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def submit(self, run_id: str, *targets: str, extra=(), env=None) -> subprocess.CompletedProcess:
        chosen = [arg for name in targets for arg in ("--target", name)]
        return self.run(
            "--json",
            "rebuild",
            "--job",
            f"--targets-file={self.site_file}",
            *chosen,
            "--module",
            APP,
            f"--run-id={run_id}",
            "--backend=installpath",
            *extra,
            "--",
            "TinyApp-1.0.eb",
            env=env,
        )

    def status(self, run_id: str, target: str) -> dict:
        done = self.run("--json", "status", run_id, f"--targets-file={self.site_file}", "--target", target)
        assert done.returncode == 0, done.stderr
        (entry,) = json.loads(done.stdout)["targets"]
        return entry["run"]

    def wait_for(self, run_id: str, target: str, ready) -> dict:
        deadline = time.monotonic() + WAIT
        while True:
            run = self.status(run_id, target)
            if ready(run):
                return run
            if time.monotonic() > deadline:
                pytest.fail(f"run {run_id} of {target} is still {run['state']}: {run}")
            time.sleep(0.3)

    def job_output(self, run_id: str, target: str) -> str:
        return "".join(
            path.read_text() for path in (self.trees[target].state_root / "runs" / run_id).glob("job-*.out")
        )

    def live(self) -> dict:
        """Every tree whole: what a run that ended must have left as it was."""
        return {name: tree.snapshot() for name, tree in self.trees.items()}

    def installs(self) -> dict:
        """APP's live install and module file in each tree (a staged run's stage is beside them)."""
        return {name: snapshot(tree.live(APP), tree.module_file(APP)) for name, tree in self.trees.items()}


@pytest.fixture
def jobs(tmp_path, package_root, slurm_cluster) -> JobSite:
    tmp_path.chmod(0o755)
    return JobSite(tmp_path, package_root, slurm_cluster.conf)


def _ended(run: dict) -> bool:
    """The run's job is done with it: published, failed, or staged for the publish job."""
    return run["state"] not in ("queued", "building", "planning", "publishing", "rolling_back")


def test_a_job_returns_at_once_with_its_id_and_its_run_is_shown_queued_then_running_then_published(
    jobs, slurm_cluster, tmp_path
):
    gate = jobs.gate / "a"
    gate.mkdir()
    # The node's two cores: one taken by another job, the rebuild's job (--job-cores 2) waits.
    blocker = RunningJob(slurm_cluster, tmp_path)
    try:
        # An SBATCH_* variable reaches sbatch as EasyBuild's jobs let it.
        done = jobs.submit(
            "job-a",
            "zen3",
            extra=("--job-cores", "2"),
            env={"SBATCH_TIMELIMIT": "29", "FAKE_EB_GATE": str(gate)},
        )
        assert done.returncode == 0, done.stderr
        submitted = json.loads(done.stdout)
        (job,) = submitted["jobs"]
        assert submitted["run_id"] == "job-a"
        assert submitted["publish_job"] is None
        assert (job["target"], job["state_root"]) == ("zen3", str(jobs.trees["zen3"].state_root))
        assert job["job_id"].isdigit()
        shown = slurm_cluster.run(["scontrol", "show", "job", "-o", job["job_id"]]).stdout
        assert " TimeLimit=00:29:00 " in shown
        assert " NumCPUs=2 " in shown
        assert " JobName=eb-staged-rebuild:job-a:zen3 " in shown

        queued = jobs.wait_for(
            "job-a", "zen3", lambda run: run["job"].get("slurm", {}).get("reason") == "Resources"
        )
        assert queued["state"] == "queued"
        assert queued["job"]["job_id"] == job["job_id"]
        assert queued["job"]["slurm"]["state"] == "PENDING"
        assert queued["job"]["node"] is None
    finally:
        blocker.cancel()
    # The build waits at the gate: the run is building, its job running.
    running = jobs.wait_for(
        "job-a",
        "zen3",
        lambda run: run["state"] == "building" and run["job"].get("slurm", {}).get("state") == "RUNNING",
    )
    node = slurm_cluster.run(["scontrol", "show", "job", job["job_id"]]).stdout
    assert f"NodeList={running['job']['slurm']['node']}" in node
    assert running["job"]["node"] == running["job"]["slurm"]["node"]

    (gate / "go").touch()
    published = jobs.wait_for("job-a", "zen3", _ended)
    assert published["state"] == "published", jobs.job_output("job-a", "zen3")
    assert published["job"]["started"] >= published["job"]["submitted"]
    assert jobs.trees["zen3"].payload(APP) == "new"
    assert jobs.trees["icelake"].payload(APP) == "old"


def test_resume_ends_failed_a_queued_run_whose_job_was_cancelled_before_it_started(
    jobs, slurm_cluster, tmp_path
):
    before = jobs.live()
    blocker = RunningJob(slurm_cluster, tmp_path)  # the rebuild's job (two cores) waits
    try:
        done = jobs.submit("job-q", "zen3", extra=("--job-cores", "2"))
        assert done.returncode == 0, done.stderr
        (job,) = json.loads(done.stdout)["jobs"]
        left = jobs.run("--json", "--state-root", str(jobs.trees["zen3"].state_root), "resume", "job-q")
        assert left.returncode == 0, left.stderr
        assert jobs.status("job-q", "zen3")["state"] == "queued"  # its job is pending: left alone
        slurm_cluster.run(["scancel", job["job_id"]], check=True)
    finally:
        blocker.cancel()

    ended = jobs.run("--json", "--state-root", str(jobs.trees["zen3"].state_root), "resume", "job-q")

    assert ended.returncode == 0, ended.stderr
    run = jobs.status("job-q", "zen3")
    assert run["state"] == "failed"
    assert run["error"] == f"its job {job['job_id']} ended before it started"
    assert jobs.live() == before


def test_scancel_during_the_build_reverses_the_run_within_killwait(jobs, slurm_cluster):
    gate = jobs.gate / "c"
    gate.mkdir()
    before = jobs.live()
    done = jobs.submit("job-c", "zen3", env={"FAKE_EB_GATE": str(gate)})
    assert done.returncode == 0, done.stderr
    (job,) = json.loads(done.stdout)["jobs"]
    deadline = time.monotonic() + WAIT
    while not (gate / "started").exists():
        assert time.monotonic() < deadline, jobs.job_output("job-c", "zen3")
        time.sleep(0.2)

    cancelled_at = time.monotonic()
    slurm_cluster.run(["scancel", job["job_id"]], check=True)
    ended = jobs.wait_for("job-c", "zen3", _ended)
    took = time.monotonic() - cancelled_at

    assert ended["state"] == "failed", jobs.job_output("job-c", "zen3")
    assert ended["cancelled"] is True
    assert ended["error"]
    assert jobs.live() == before
    kill_wait = _config(slurm_cluster, "KillWait")
    assert took < float(kill_wait.split()[0]), f"ended {took:.1f} s after scancel, KillWait is {kill_wait}"


def test_a_node_whose_archdetect_disagrees_with_the_target_refuses_before_building(jobs):
    before = jobs.live()
    done = jobs.submit("job-l", "liar")
    assert done.returncode == 0, done.stderr

    ended = jobs.wait_for("job-l", "liar", _ended)

    assert ended["state"] == "failed"
    assert ended["error"].startswith("this node (")
    assert ended["error"].endswith(
        ") is x86_64/intel/icelake, not x86_64/amd/zen3 (target liar): nothing was built"
    )
    assert not ended.get("modules"), "nothing was built, so no module was staged"
    assert jobs.live() == before


def test_publish_together_stages_each_target_then_the_last_job_publishes_both(jobs, slurm_cluster):
    gate = jobs.gate / "t"
    gate.mkdir()
    before = jobs.installs()
    done = jobs.submit(
        "job-t", "zen3", "icelake", extra=("--publish", "together"), env={"FAKE_EB_GATE": str(gate)}
    )
    assert done.returncode == 0, done.stderr
    submitted = json.loads(done.stdout)
    assert [job["target"] for job in submitted["jobs"]] == ["zen3", "icelake"]
    publish_job = submitted["publish_job"]
    assert publish_job.isdigit()
    waits = slurm_cluster.run(["scontrol", "show", "job", "-o", publish_job]).stdout
    ids = [job["job_id"] for job in submitted["jobs"]]
    assert f"Dependency=afterok:{ids[0]}(unfulfilled),afterok:{ids[1]}(unfulfilled)" in waits
    # Held, so that the test sees both runs staged before it runs (the builds wait at the gate).
    slurm_cluster.run(["scontrol", "hold", publish_job], check=True)

    (gate / "go").touch()
    staged = {name: jobs.wait_for("job-t", name, _ended) for name in ("zen3", "icelake")}
    assert {name: run["state"] for name, run in staged.items()} == {"zen3": "staged", "icelake": "staged"}
    assert jobs.installs() == before  # built, checked and planned; nothing live changed
    slurm_cluster.run(["scontrol", "release", publish_job], check=True)
    published = {
        name: jobs.wait_for("job-t", name, lambda run: _ended(run) and run["state"] != "staged")
        for name in ("zen3", "icelake")
    }

    assert {name: run["state"] for name, run in published.items()} == {
        "zen3": "published",
        "icelake": "published",
    }, jobs.job_output("job-t", "zen3")
    assert jobs.trees["zen3"].payload(APP) == "new"
    assert jobs.trees["icelake"].payload(APP) == "new"
    assert jobs.trees["liar"].payload(APP) == "old"


def test_publish_together_with_a_target_that_fails_publishes_none_and_discard_ends_the_staged(
    jobs, slurm_cluster
):
    before = jobs.live()
    done = jobs.submit("job-f", "zen3", "liar", extra=("--publish", "together"))
    assert done.returncode == 0, done.stderr
    publish_job = json.loads(done.stdout)["publish_job"]

    ended = {name: jobs.wait_for("job-f", name, _ended) for name in ("zen3", "liar")}

    assert ended["zen3"]["state"] == "staged"
    assert ended["liar"]["state"] == "failed"
    assert "(target liar): nothing was built" in ended["liar"]["error"]
    # Slurm cancels the publish job, whose dependency can never be satisfied.
    deadline = time.monotonic() + WAIT
    while (
        " JobState=CANCELLED " not in slurm_cluster.run(["scontrol", "show", "job", "-o", publish_job]).stdout
    ):
        assert time.monotonic() < deadline, "the publish job was not cancelled"
        time.sleep(0.3)
    assert jobs.status("job-f", "zen3")["state"] == "staged"

    discarded = jobs.run("--json", "discard", "job-f", f"--targets-file={jobs.site_file}", "--target", "zen3")

    assert discarded.returncode == 0, discarded.stderr
    assert jobs.status("job-f", "zen3")["state"] == "failed"
    assert jobs.live() == before


def test_sbatch_s_refusal_is_one_line_exit_1_and_the_queued_runs_end_failed(jobs):
    # A partition that does not exist: sbatch refuses the second target's job.
    jobs.write_site(icelake="nowhere")
    before = jobs.live()

    done = jobs.submit("job-s", "zen3", "icelake")

    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("eb-staged-rebuild: sbatch exited 1: ")
    assert "invalid partition" in done.stderr.lower()
    for name in ("zen3", "icelake"):
        run = jobs.status("job-s", name)
        assert run["state"] == "failed"
        assert "invalid partition" in run["error"].lower()
    # The zen3 job that went in was cancelled: nothing changed, now or later.
    time.sleep(2)
    assert jobs.live() == before


def _config(cluster, name: str) -> str:
    for line in cluster.run(["scontrol", "show", "config"]).stdout.splitlines():
        key, _sep, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    raise AssertionError(f"scontrol show config names no {name}")
