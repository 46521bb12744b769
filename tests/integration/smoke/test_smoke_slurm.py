"""The session's Slurm cluster works, and its TaskProlog behaves as the guard expects.

These pin down Slurm 22.05 behaviour the EESSI guard is built on: a TaskProlog's ``export``
and ``print`` lines reach each task, and a non-zero exit kills the task.
"""

from __future__ import annotations

import os
import time
import uuid

from tests.integration.harness.slurm import SLURM

pytestmark = SLURM


def test_srun_two_tasks_each_get_the_prolog_export_and_print_once(slurm_cluster, tmp_path):
    value = f"smoke-{uuid.uuid4().hex}"
    text = f"prolog-print-{uuid.uuid4().hex}"
    slurm_cluster.set_task_prolog(
        f'#!/bin/sh\necho "export HPCSTACK_SMOKE={value}"\necho "print {text} task=$SLURM_PROCID"\n'
    )
    try:
        # --label prefixes every output line with the task's rank ("0: ", "1: ").
        done = slurm_cluster.run(
            ["srun", "--label", "-n2", "sh", "-c", 'echo "task=$SLURM_PROCID smoke=$HPCSTACK_SMOKE"'],
            cwd=tmp_path,
        )
    finally:
        slurm_cluster.reset_task_prolog()

    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    for rank in (0, 1):
        assert f"{rank}: task={rank} smoke={value}" in lines, done.stdout
        assert lines.count(f"{rank}: {text} task={rank}") == 1, done.stdout
    assert done.stdout.count(text) == 2, done.stdout


def test_sinfo_reports_the_node_idle(slurm_cluster):
    # Right after another test's job the node may still say "completing" for a moment.
    give_up = time.monotonic() + 30
    while True:
        done = slurm_cluster.run(["sinfo", "--noheader", "--Node", "--format=%N %T"])
        if done.returncode != 0 or done.stdout.split()[-1:] == ["idle"] or time.monotonic() > give_up:
            break
        time.sleep(0.5)

    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1, done.stdout
    node, state = done.stdout.split()
    assert node == os.uname().nodename.split(".")[0]
    assert state == "idle", done.stdout


def test_failing_task_prolog_kills_the_task_before_its_command_runs(slurm_cluster, tmp_path):
    marker = tmp_path / "task-ran"
    slurm_cluster.set_task_prolog("#!/bin/sh\nexit 3\n")
    try:
        done = slurm_cluster.run(
            ["srun", "-n1", "sh", "-c", f'echo task-ran; touch "{marker}"'],
            cwd=tmp_path,
        )
    finally:
        slurm_cluster.reset_task_prolog()

    assert done.returncode != 0
    assert "TaskProlog failed status=3" in done.stderr
    assert "task-ran" not in done.stdout
    assert not marker.exists()


def test_task_prolog_runs_as_the_unprivileged_job_user_with_its_environment(
    slurm_cluster, unprivileged_user, user_tmp_path
):
    slurm_cluster.set_task_prolog(
        '#!/bin/sh\necho "print prolog uid=$(id -u) submitted=$HPCSTACK_SUBMIT_VAR"\n'
    )
    env = dict(unprivileged_user.env(), SLURM_CONF=str(slurm_cluster.conf), HPCSTACK_SUBMIT_VAR="from-login")
    try:
        done = unprivileged_user.run(["srun", "-n1", "id", "-u"], cwd=user_tmp_path, env=env)
    finally:
        slurm_cluster.reset_task_prolog()

    assert done.returncode == 0, done.stderr
    uid = str(unprivileged_user.uid)
    assert done.stdout.splitlines() == [f"prolog uid={uid} submitted=from-login", uid]
