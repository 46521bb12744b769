"""``slurmjob``: sbatch's options and script, and Slurm's answers read.

Building and parsing only: ``tests/integration/staged/test_staged_jobs.py`` submits to the
session's real Slurm and asks it the states.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import slurmjob
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.slurmjob import JobOptions, JobState


def test_a_job_s_options_are_easybuild_s_and_its_target_s():
    argv = slurmjob.sbatch_options(
        "eb-staged-rebuild:run1:zen3",
        "/state/runs/run1/job-%j.out",
        JobOptions(cores=8, max_walltime_hours=1.5),
        constraint="zen3",
        partition="batch",
    )
    assert argv == [
        "--parsable",
        "--job-name=eb-staged-rebuild:run1:zen3",
        "--output=/state/runs/run1/job-%j.out",
        "--cpus-per-task=8",
        "--time=90",
        "--constraint=zen3",
        "--partition=batch",
    ]


def test_options_not_given_are_left_to_sbatch_and_its_variables():
    # SBATCH_TIMELIMIT, SBATCH_PARTITION... reach sbatch: no option of ours overrides them.
    assert slurmjob.sbatch_options("n", "o", JobOptions()) == ["--parsable", "--job-name=n", "--output=o"]


def test_a_walltime_is_never_shortened_to_whole_minutes():
    (time,) = [
        arg for arg in slurmjob.sbatch_options("n", "o", JobOptions(max_walltime_hours=0.01)) if "time" in arg
    ]
    assert time == "--time=1"


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"cores": 0}, "--job-cores must be 1 or more, not 0"),
        ({"max_walltime_hours": 0.0}, "--job-max-walltime must be a number of hours above 0"),
        ({"max_walltime_hours": float("nan")}, "--job-max-walltime must be a number of hours above 0"),
        ({"max_walltime_hours": float("inf")}, "--job-max-walltime must be a number of hours above 0"),
    ],
)
def test_job_options_out_of_range_are_refused(options, what):
    with pytest.raises(errors.UsageError, match=what):
        JobOptions(**options)


def test_the_publish_job_waits_for_every_target_job_and_dies_with_any():
    assert slurmjob.dependency_options(["12", "13"]) == [
        "--dependency=afterok:12:13",
        "--kill-on-invalid-dep=yes",
    ]
    assert slurmjob.dependency_options([]) == []


def test_job_names_carry_the_run_and_the_target():
    assert slurmjob.job_name("run1", "zen3") == "eb-staged-rebuild:run1:zen3"
    assert slurmjob.job_name("run1", None) == "eb-staged-rebuild:run1"


def test_the_script_execs_the_tool_so_that_scancel_s_sigterm_reaches_it():
    text = slurmjob.script(["/opt/bin/eb-staged-rebuild", "job-start", "run 1", "--state-root", "/st'ate"])
    assert text == (
        "#!/bin/sh\nexec /opt/bin/eb-staged-rebuild job-start 'run 1' --state-root '/st'\"'\"'ate'\n"
    )
    # What the shell runs is exactly the argv, whatever it holds.
    echoed = subprocess.run(
        ["sh", "-c", text.replace("exec ", "exec printf '%s\\n' ", 1)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.splitlines() == [
        "/opt/bin/eb-staged-rebuild",
        "job-start",
        "run 1",
        "--state-root",
        "/st'ate",
    ]


@pytest.mark.parametrize(
    ("answer", "job_id"), [("123\n", "123"), ("124;cluster_a\n", "124"), ("note\n125\n", "125")]
)
def test_sbatch_s_parsable_answer_is_the_job_id(answer, job_id):
    assert slurmjob.parse_parsable(answer) == job_id


@pytest.mark.parametrize("answer", ["", "Submitted batch job 123\n", "12a\n"])
def test_an_answer_without_a_job_id_is_a_failed_submission(answer):
    with pytest.raises(slurmjob.SubmitError, match="not a job id"):
        slurmjob.parse_parsable(answer)


def test_the_script_reaches_sbatch_s_stdin(tmp_path):
    # A stand-in for sbatch (the real one is in the integration test): it keeps what it read.
    kept = tmp_path / "script"
    stand_in = tmp_path / "sbatch"
    stand_in.write_text(f'#!/bin/sh\ncat >{kept}\necho "$@" >{kept}.args\necho 77\n')
    stand_in.chmod(0o755)

    job_id = slurmjob.submit(
        str(stand_in),
        ["--parsable", "--job-name=x"],
        "#!/bin/sh\nexec true\n",
        dict(os.environ),
        Deadline(10),
    )

    assert job_id == "77"
    assert kept.read_text() == "#!/bin/sh\nexec true\n"
    assert (tmp_path / "script.args").read_text() == "--parsable --job-name=x\n"


def test_sbatch_s_refusal_is_one_line_with_its_message(tmp_path):
    stand_in = tmp_path / "sbatch"
    stand_in.write_text(
        "#!/bin/sh\n"
        "echo 'sbatch: error: invalid partition specified: nowhere' >&2\n"
        "echo 'sbatch: error: Batch job submission failed' >&2\n"
        "exit 1\n"
    )
    stand_in.chmod(0o755)
    with pytest.raises(slurmjob.SubmitError) as refused:
        slurmjob.submit(str(stand_in), [], "", {}, Deadline(10))
    assert str(refused.value) == (
        "sbatch exited 1: sbatch: error: invalid partition specified: nowhere "
        "sbatch: error: Batch job submission failed"
    )
    assert refused.value.exit_code == 1
    with pytest.raises(slurmjob.SubmitError, match="sbatch cannot run: No such file"):
        slurmjob.submit(str(tmp_path / "none"), [], "", {}, Deadline(10))


def test_squeue_lines_are_job_states():
    states = slurmjob.parse_squeue("12|PENDING||Dependency\n13|RUNNING|node1|None\n\n")
    assert states == {
        "12": JobState("12", "PENDING", None, "Dependency"),
        "13": JobState("13", "RUNNING", "node1", None),
    }


@pytest.mark.parametrize("line", ["12|PENDING|", "x|RUNNING|n|None", "12||n|None"])
def test_a_squeue_line_that_is_not_a_job_state_is_refused(line):
    with pytest.raises(ValueError):
        slurmjob.parse_squeue(line)


SCONTROL = (
    "JobId=41 JobName=eb-staged-rebuild:run1:zen3 UserId=root(0) GroupId=root(0) Priority=1 "
    "JobState=CANCELLED Reason=None Dependency=(null) ExitCode=0:15 NodeList=node1 "
    "WorkDir=/tmp/a dir\n"
)


def test_scontrol_s_line_gives_a_finished_job_s_state_and_node():
    assert slurmjob.parse_scontrol("41", SCONTROL) == JobState("41", "CANCELLED", "node1", None)
    assert slurmjob.parse_scontrol("42", SCONTROL) is None
    pending = SCONTROL.replace(
        "JobState=CANCELLED Reason=None", "JobState=PENDING Reason=Dependency"
    ).replace("NodeList=node1", "NodeList=(null)")
    assert slurmjob.parse_scontrol("41", pending) == JobState("41", "PENDING", None, "Dependency")


def test_without_squeue_every_state_is_unknown_with_why(tmp_path):
    states = slurmjob.job_states(["5", "6"], {"PATH": str(tmp_path)})
    assert states == {
        "5": JobState("5", "unknown", why="squeue not found on PATH"),
        "6": JobState("6", "unknown", why="squeue not found on PATH"),
    }


def test_this_node_is_slurm_s_name_for_it():
    assert slurmjob.this_node({"SLURMD_NODENAME": "node3"}) == "node3"
    assert slurmjob.this_node({}) == os.uname().nodename


def test_whether_a_job_is_alive_is_unknown_where_slurm_cannot_be_asked(tmp_path):
    # resume leaves a queued run alone then, rather than end a run whose job may still start.
    assert slurmjob.job_alive("5", {"PATH": str(tmp_path)}) is None
    assert slurmjob.job_alive("not-a-job", {"PATH": str(tmp_path)}) is False
