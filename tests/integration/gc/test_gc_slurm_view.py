"""What ``squeue`` shows ``gc``: every job of the cluster, whoever asks and whatever their
environment, and asked under the lock, against the session's real Slurm.

Each case is a job of another user (the attacker user) whose working directory is the live
tree of ``TinyApp/1.0`` when a rebuild swaps that tree out: the job works in the retired tree
from then on, and only Slurm's answer can keep it. gc runs as it would on the build host
while the job runs on a compute node: root's gc in a pid namespace of its own
(``unshare --pid --mount-proc``), where the job's processes are not in ``/proc``; the build
account's gc cannot read another user's processes anyway. The grace period is the default
144 hours: where Slurm answers it plays no part, so an answer that misses the job removes the
tree at once.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import runningjobs
from ansible_collections.hpcstack.ops.plugins.modules import staged_gc
from tests.integration.harness.slurm import HIDDEN, RESTRICTED, SLURM, RunningJob
from tests.support.module_runner import run_on_site
from tests.support.slurm_env import CLIENT_VARIABLES
from tests.support.staged import FAKE_EB, TOOL_TIMEOUT, StagedSite
from tests.support.users import UnprivilegedUser

pytestmark = SLURM

APP = "TinyApp/1.0"
# squeue gives start times to the second: a second apart, before and after are certain.
APART = 1.2
WAIT_TIMEOUT = 60
# gc as on another host than the job's: this node's processes are not in its /proc.
ELSEWHERE = ["unshare", "--pid", "--fork", "--mount-proc"]


@pytest.fixture
def open_site(package_root, slurm_cluster):
    """A live tree of root's in a directory every user may search, so that another user's
    job can work in it."""
    root = Path(tempfile.mkdtemp(prefix="hpcstack-gc-view-", dir="/tmp"))
    root.chmod(0o755)
    site = StagedSite(installpath=root / "apps", state_root=root / "state", package_root=package_root)
    site.install(APP, payload="old")
    site.env["SLURM_CONF"] = str(slurm_cluster.conf)
    yield site
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class AccountSite:
    """A live tree, state root and tool of the build account (``user``), run as it."""

    site: StagedSite
    user: UnprivilegedUser
    conf: Path

    def env(self, **extra: str) -> dict:
        return dict(
            self.user.env(),
            PYTHONPATH=str(self.site.package_root),
            EB_STAGED_REBUILD_EB=str(FAKE_EB),
            SLURM_CONF=str(self.conf),
            **extra,
        )

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return self.user.run(self.site.command(*args), env=self.env(**extra), timeout=TOOL_TIMEOUT)


@pytest.fixture
def account_site(user_tmp_path, unprivileged_user, slurm_cluster) -> AccountSite:
    user_tmp_path.chmod(0o755)  # the attacker's job works in the live tree
    package_root = checkout.link_package(user_tmp_path / "pkg")
    site = StagedSite(
        installpath=user_tmp_path / "apps", state_root=user_tmp_path / "state", package_root=package_root
    )
    site.install(APP, payload="old")
    for path in [site.installpath, *site.installpath.rglob("*")]:
        os.chown(path, unprivileged_user.uid, unprivileged_user.gid, follow_symlinks=False)
    return AccountSite(site, unprivileged_user, slurm_cluster.conf)


def _working_dirs(uid: int) -> set:
    """The working directories of the processes of ``uid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                found.add(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue  # ended meanwhile
    return found


def _wait_until(what: str, ready) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"never {what}")
        time.sleep(0.05)


def _job_in(cluster, tree: Path, user: UnprivilegedUser, partition=None) -> RunningJob:
    """``user``'s job, working in ``tree``; returned once its process runs there."""
    job = RunningJob(cluster, tree, user=user, partition=partition)
    try:
        _wait_until(f"saw job {job.job_id} work in {tree}", lambda: str(tree) in _working_dirs(user.uid))
    except BaseException:
        job.cancel()
        raise
    return job


def _retired_path(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["modules"][0]["retired_path"]


def _report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _gc_elsewhere(site: StagedSite, *args: str, **env: str) -> dict:
    done = subprocess.run(
        [*ELSEWHERE, *site.command("--json", "gc", *args)],
        env=site.tool_env(**env),
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )
    return _report(done)


def _kept_by(report: dict, retired: str) -> dict:
    (entry,) = [entry for entry in report["kept"] if entry["path"] == retired]
    return entry


def _assert_kept_by_the_job(report: dict, retired: str, job: RunningJob) -> None:
    assert report["slurm"]["answered"] is True
    assert report["removed"] == []
    entry = _kept_by(report, retired)
    assert entry["why"] == f"1 running job started before the swap ({job.job_id})"
    assert [found["job_id"] for found in entry["jobs"]] == [job.job_id]
    assert Path(retired).is_dir()


def test_root_with_squeue_users_set_sees_another_users_job_and_keeps_the_tree_it_works_in(
    open_site, slurm_cluster, attacker_user
):
    job = _job_in(slurm_cluster, open_site.live(APP), attacker_user)
    try:
        time.sleep(APART)
        retired = _retired_path(open_site.run("--json", *open_site.rebuild_args(APP)))
        assert retired in _working_dirs(attacker_user.uid)  # the job works in the retired tree

        kept = _gc_elsewhere(open_site, SQUEUE_USERS="root")

        assert kept["processes"]["scanned"] == 0  # gc is alone in its pid namespace: the job is elsewhere
        _assert_kept_by_the_job(kept, retired, job)
    finally:
        job.cancel()

    removed = _gc_elsewhere(open_site, SQUEUE_USERS="root")

    assert [entry["path"] for entry in removed["removed"]] == [retired]
    assert not Path(retired).exists()


def test_the_module_on_a_host_whose_environment_sets_squeue_users_keeps_another_users_jobs_tree(
    open_site, slurm_cluster, attacker_user, capsys, monkeypatch
):
    # The module reads squeue's PATH and SLURM_CONF from the host's environment (a play's
    # ``environment:``), and so would its filters. The job holds nothing of the tree on this
    # node: it loaded the module on another one.
    job = RunningJob(slurm_cluster, Path("/"), user=attacker_user)
    try:
        time.sleep(APART)
        retired = _retired_path(open_site.run("--json", *open_site.rebuild_args(APP)))
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        monkeypatch.setenv("SQUEUE_USERS", "root")

        kept = run_on_site(capsys, staged_gc, open_site)
    finally:
        job.cancel()

    _assert_kept_by_the_job(kept, retired, job)
    assert kept["changed"] is False


@pytest.mark.parametrize("partition", [HIDDEN, RESTRICTED])
def test_the_build_account_sees_a_job_of_a_partition_hidden_from_it_and_keeps_the_tree_it_works_in(
    account_site, slurm_partitions, attacker_user, partition
):
    job = _job_in(slurm_partitions, account_site.site.live(APP), attacker_user, partition)
    try:
        # What the build account's squeue shows without --all: not the job.
        plain = account_site.user.run(
            ["squeue", "--noheader", "--format=%i"], env=account_site.env(), timeout=TOOL_TIMEOUT
        )
        assert plain.returncode == 0, plain.stderr
        assert job.job_id not in plain.stdout.split()
        time.sleep(APART)
        retired = _retired_path(account_site.run("--json", *account_site.site.rebuild_args(APP)))
        assert retired in _working_dirs(attacker_user.uid)

        kept = _report(account_site.run("--json", "gc"))

        # The job's process is another user's: only Slurm's answer can keep the tree.
        assert kept["processes"]["as_uid"] == account_site.user.uid
        assert kept["processes"]["unreadable"] >= 1
        _assert_kept_by_the_job(kept, retired, job)
    finally:
        job.cancel()


def _start_time(cluster, job: RunningJob) -> datetime.datetime:
    """The job's start as ``scontrol show job`` gives it, read in UTC."""
    shown = cluster.run(
        ["scontrol", "--oneliner", "show", "job", job.job_id], env=dict(cluster.env(), TZ="UTC0")
    )
    (stamp,) = [field.split("=", 1)[1] for field in shown.stdout.split() if field.startswith("StartTime=")]
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)


def test_no_variable_of_the_callers_environment_narrows_or_reshapes_the_answer(
    slurm_partitions, attacker_user
):
    # Every option squeue and scontrol read from the environment, set to hide the job or to
    # change the format, and the caller's clock far from UTC (squeue prints local times).
    hostile = dict(
        os.environ, **CLIENT_VARIABLES, SLURM_CONF=str(slurm_partitions.conf), TZ="Pacific/Kiritimati"
    )
    job = RunningJob(slurm_partitions, Path("/"), user=attacker_user, partition=HIDDEN)
    try:
        answer = runningjobs.running_jobs(hostile)
        started = _start_time(slurm_partitions, job)
    finally:
        job.cancel()

    assert answer.summary()["answered"] is True, answer.why
    (found,) = [found for found in answer.jobs if found.job_id == job.job_id]
    assert (found.user, found.started) == (attacker_user.name, started)


def test_where_private_data_hides_other_users_jobs_the_build_account_keeps_the_tree_and_says_why(
    account_site, private_data_jobs, attacker_user
):
    uid = account_site.user.uid
    why = f"PrivateData=jobs: squeue shows uid {uid} (neither root nor SlurmUser) only its own jobs"
    job = _job_in(private_data_jobs, account_site.site.live(APP), attacker_user)
    try:
        time.sleep(APART)
        retired = _retired_path(account_site.run("--json", *account_site.site.rebuild_args(APP)))

        kept = _report(account_site.run("--json", "gc"))
        text = account_site.run("gc")
    finally:
        job.cancel()

    assert kept["slurm"] == {"answered": False, "why": why, "fallback": "grace period"}
    assert kept["removed"] == []
    assert _kept_by(kept, retired)["why"] == "grace period"
    assert Path(retired).is_dir()
    assert text.returncode == 0, text.stderr
    assert f"Slurm: {why}; trees are kept for the grace period." in " ".join(text.stdout.split())


def _holders_of(path: Path, but: int) -> list:
    """The processes other than ``but`` that hold ``path`` open."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == but:
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if str(path) in links:
            found.append(int(entry))
    return found


def _finish(child: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = child.communicate(timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def test_gc_waiting_for_the_lock_behind_a_rebuild_keeps_the_tree_of_a_job_that_started_meanwhile(
    open_site, slurm_cluster, attacker_user, tmp_path
):
    # The rebuild holds the lock while it builds (the test builder waits at a gate); gc
    # waits for the lock; a job starts in the live tree; the rebuild swaps that tree out
    # and ends; gc takes the lock. Slurm's answer must be the one after the swap.
    gate = tmp_path / "gate"
    gate.mkdir()
    lock = open_site.state_root / ".lock"
    rebuild = subprocess.Popen(
        open_site.command("--json", *open_site.rebuild_args(APP)),
        env=open_site.tool_env(FAKE_EB_PAYLOAD="new", FAKE_EB_GATE=gate),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children = [rebuild]
    job = None
    try:
        _wait_until("saw the rebuild build", (gate / "started").exists)
        gc = subprocess.Popen(
            [*ELSEWHERE, *open_site.command("--lock-timeout", "120", "--json", "gc")],
            env=open_site.tool_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        children.append(gc)
        _wait_until("saw gc wait for the lock", lambda: _holders_of(lock, but=rebuild.pid))
        job = _job_in(slurm_cluster, open_site.live(APP), attacker_user)
        time.sleep(APART)
        (gate / "go").touch()

        retired = _retired_path(_finish(rebuild))
        collected = _report(_finish(gc))
    finally:
        (gate / "go").touch()
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
        if job is not None:
            job.cancel()

    _assert_kept_by_the_job(collected, retired, job)
