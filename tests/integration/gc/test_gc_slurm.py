"""``gc``'s Slurm rule, against the session's real Slurm: a retired tree is kept while a running
job started before it was swapped out, even one that holds nothing of it open; a job that
started after the swap keeps nothing; where ``squeue`` does not answer, the grace period
decides and the report says why.

The job is ``sleep`` submitted with ``sbatch``: it touches no file of the tree, so only the
rule can keep it. ``gc --grace-hours 0`` runs with the cluster's ``SLURM_CONF``: the grace
period has passed, so whatever is kept is kept by the rule.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import pytest

import checkout
from tests.integration.harness.slurm import SLURM, RunningJob
from tests.support.staged import StagedSite

pytestmark = SLURM

APP = "TinyApp/1.0"
# squeue gives start times to the second: a second apart, before and after are certain.
APART = 1.2


@pytest.fixture
def site(staged_site: StagedSite, slurm_cluster) -> StagedSite:
    staged_site.install(APP, payload="old")
    staged_site.env["SLURM_CONF"] = str(slurm_cluster.conf)
    return staged_site


def _rebuild(site: StagedSite) -> str:
    done = site.run("--json", *site.rebuild_args(APP), env={"FAKE_EB_PAYLOAD": "new"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["modules"][0]["retired_path"]


def _gc(site: StagedSite, *args: str, env=None) -> dict:
    done = site.run("--json", "gc", *args, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_job_that_started_before_the_swap_keeps_the_tree_until_it_ends(site, slurm_cluster, tmp_path):
    job = RunningJob(slurm_cluster, tmp_path)
    try:
        time.sleep(APART)
        retired = _rebuild(site)

        kept = _gc(site, "--grace-hours", "0")

        assert kept["slurm"] == {"answered": True, "running": 1}
        assert kept["removed"] == []
        (entry,) = [entry for entry in kept["kept"] if entry["path"] == retired]
        assert entry["why"] == f"1 running job started before the swap ({job.job_id})"
        assert [found["job_id"] for found in entry["jobs"]] == [job.job_id]
        assert Path(retired).is_dir()
    finally:
        job.cancel()

    removed = _gc(site, "--grace-hours", "0")

    assert [found["path"] for found in removed["removed"]] == [retired]
    assert not Path(retired).exists()


def test_a_job_that_started_after_the_swap_keeps_nothing_even_within_the_grace_period(
    site, slurm_cluster, tmp_path
):
    retired = _rebuild(site)
    time.sleep(APART)
    job = RunningJob(slurm_cluster, tmp_path)
    try:
        collected = _gc(site)  # the default grace period of 144 h has not passed
    finally:
        job.cancel()

    assert collected["slurm"] == {"answered": True, "running": 1}
    assert [found["path"] for found in collected["removed"]] == [retired]
    assert not Path(retired).exists()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_where_the_controller_does_not_answer_the_grace_period_decides_and_the_report_says_why(
    site, slurm_cluster, tmp_path
):
    # The cluster's own configuration, its controller moved to a port nobody listens on.
    conf = slurm_cluster.conf.read_text()
    conf = re.sub(r"^SlurmctldPort=.*$", f"SlurmctldPort={_closed_port()}", conf, flags=re.M)
    unreachable = tmp_path / "slurm.conf"
    unreachable.write_text(conf + "MessageTimeout=2\n")
    retired = _rebuild(site)

    collected = _gc(site, env={"SLURM_CONF": str(unreachable)})

    assert collected["slurm"]["answered"] is False
    assert collected["slurm"]["why"].startswith("squeue exited 1: ")
    assert "slurm_load_jobs error" in collected["slurm"]["why"]
    assert collected["slurm"]["fallback"] == "grace period"
    assert collected["removed"] == []
    assert [entry["why"] for entry in collected["kept"] if entry["path"] == retired] == ["grace period"]
    assert Path(retired).is_dir()


def test_without_squeue_on_path_the_grace_period_decides(site, tmp_path):
    retired = _rebuild(site)

    collected = _gc(site, env={"PATH": "/nonexistent"})

    assert collected["slurm"] == {
        "answered": False,
        "why": "squeue not found on PATH",
        "fallback": "grace period",
    }
    assert [entry["path"] for entry in collected["kept"]] == [retired]


def test_no_squeue_asks_nothing_and_keeps_the_tree_for_the_grace_period(site, slurm_cluster, tmp_path):
    retired = _rebuild(site)

    collected = _gc(site, "--no-squeue")

    assert collected["slurm"] == {
        "answered": False,
        "why": "not asked (--no-squeue)",
        "fallback": "grace period",
    }
    assert [entry["path"] for entry in collected["kept"]] == [retired]


ASK = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.staged_rebuild import runningjobs
answer = runningjobs.running_jobs(os.environ)
print(json.dumps({"ids": [job.job_id for job in answer.jobs or ()], **answer.summary()}))
"""


def test_another_user_sees_every_job_where_private_data_hides_none(
    slurm_cluster, tmp_path, user_tmp_path, unprivileged_user
):
    # As another user than root, squeue is believed only after scontrol says that
    # PrivateData does not hide other users' jobs; the session's cluster hides none.
    package_root = checkout.link_package(user_tmp_path / "pkg")
    job = RunningJob(slurm_cluster, tmp_path)
    try:
        env = dict(unprivileged_user.env(), SLURM_CONF=str(slurm_cluster.conf))
        done = unprivileged_user.run([sys.executable, "-I", "-c", ASK, str(package_root)], env=env)
    finally:
        job.cancel()

    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["answered"] is True
    assert job.job_id in answer["ids"]  # root's job, seen by the other user
