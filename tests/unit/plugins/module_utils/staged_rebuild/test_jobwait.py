"""``jobwait``: when a submission's jobs are over, and the line and verdict of each target.

The waiting itself, the journals and Slurm's answers are the cluster's
(``tests/integration/cluster/test_cluster_jobs.py``); here the decisions on given states.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import jobwait
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.slurmjob import JobState


@pytest.mark.parametrize(
    ("state", "ended"),
    [
        ("PENDING", False),
        ("RUNNING", False),
        ("COMPLETING", False),
        ("COMPLETED", True),
        ("FAILED", True),
        ("CANCELLED", True),
        ("TIMEOUT", True),
        ("unknown", True),
    ],
)
def test_a_job_has_ended_in_an_end_state_or_when_slurm_no_longer_knows_it(state, ended):
    assert jobwait.job_ended(JobState("12", state)) is ended


def test_a_job_slurm_did_not_answer_for_has_not_ended():
    assert jobwait.job_ended(None) is False


def _run(state):
    return SimpleNamespace(state=state)


@pytest.mark.parametrize(
    ("run_state", "job_state", "done"),
    [
        (RunState.QUEUED, "PENDING", False),
        (RunState.BUILDING, "RUNNING", False),
        (RunState.STAGED, "COMPLETED", True),
        (RunState.PUBLISHED, "COMPLETED", True),
        (RunState.FAILED, "FAILED", True),
        # Cancelled while pending: the run stays queued, and nothing more will happen to it.
        (RunState.QUEUED, "CANCELLED", True),
        # The job ended, but its run is still building (a SIGKILL): resume's, not the wait's.
        (RunState.BUILDING, "CANCELLED", True),
    ],
)
def test_a_target_is_done_when_its_run_ended_or_its_job_did(run_state, job_state, done):
    states = {"12": JobState("12", job_state)}
    assert jobwait._done([(_run(run_state), "12")], states, None) is done


def test_published_together_is_done_only_once_the_last_job_ended():
    runs = [(_run(RunState.STAGED), "12"), (_run(RunState.STAGED), "13")]
    states = {"12": JobState("12", "COMPLETED"), "13": JobState("13", "COMPLETED")}
    assert jobwait._done(runs, dict(states, **{"14": JobState("14", "PENDING")}), "14") is False
    assert jobwait._done(runs, dict(states, **{"14": JobState("14", "RUNNING")}), "14") is False
    assert jobwait._done(runs, dict(states, **{"14": JobState("14", "CANCELLED")}), "14") is True


def _entry(target, state, **extra):
    entry = {
        "target": target,
        "job_id": "12",
        "node": "c1",
        "job_state": "COMPLETED",
        "state": state,
        "published": state == "published",
        "cancelled": False,
        "reason": None,
    }
    entry.update(extra)
    return entry


def test_each_target_s_line_says_where_its_job_ran_and_what_became_of_it():
    assert jobwait._line(_entry("zen3", "published")) == "zen3: published, job 12 on c1 COMPLETED, published"
    assert jobwait._line(_entry("zen3", "staged")) == "zen3: staged, job 12 on c1 COMPLETED, not published"
    failed = _entry("icelake", "failed", job_state="FAILED", reason="Installation of x failed: no source")
    assert jobwait._line(failed) == (
        "icelake: failed, job 12 on c1 FAILED, not published: Installation of x failed: no source"
    )
    cancelled = _entry("haswell", "failed", job_state="CANCELLED", cancelled=True, reason="terminated")
    assert jobwait._line(cancelled).endswith("not published, cancelled: terminated")
    queued = _entry(None, "queued", node=None, job_state="CANCELLED")
    assert jobwait._line(queued) == "the trees given: queued, job 12 CANCELLED, not published"


def test_a_submission_fails_unless_every_target_was_published_and_names_the_first_reason():
    published = [_entry("zen3", "published"), _entry("icelake", "published")]
    assert jobwait.failed({"run_id": "r1", "targets": published}, together=True) is None

    staged = [_entry("zen3", "staged"), _entry("icelake", "failed", reason="no source")]
    assert jobwait.failed({"run_id": "r1", "targets": staged}, together=True) == (
        "run r1 published none of its targets: icelake: no source"
    )
    each = [_entry("zen3", "published"), _entry("icelake", "failed", reason="no source")]
    assert jobwait.failed({"run_id": "r1", "targets": each}, together=False) == (
        "run r1 did not publish icelake: icelake: no source"
    )


def test_the_wait_gives_up_after_its_timeout_while_a_job_is_still_pending(monkeypatch):
    # Slurm's answer and the journal are given (no Slurm here): a job pending for ever.
    monkeypatch.setattr(
        jobwait.slurmjob, "job_states", lambda ids, environ: {i: JobState(i, "PENDING") for i in ids}
    )
    monkeypatch.setattr(jobwait, "_runs", lambda submitted: [_run(RunState.QUEUED)])
    submitted = {"run_id": "r1", "jobs": [{"job_id": "12", "target": "zen3", "state_root": "/s"}]}
    asked = []
    monkeypatch.setattr(jobwait, "_runs", lambda submitted: asked.append(1) or [_run(RunState.QUEUED)])

    with pytest.raises(jobwait.WaitTimeout, match=r"^the jobs of run r1 had not ended after 0.05 s$"):
        jobwait.wait(submitted, {}, 0.05)

    assert len(asked) == 2, "it asked once, then once more when the timeout cut its pause short"


def test_the_wait_returns_slurm_s_last_answer_once_every_job_ended(monkeypatch):
    answers = iter([{"12": JobState("12", "RUNNING")}, {"12": JobState("12", "COMPLETED", node="c1")}])
    runs = iter([[_run(RunState.BUILDING)], [_run(RunState.PUBLISHED)]])
    monkeypatch.setattr(jobwait.slurmjob, "job_states", lambda ids, environ: next(answers))
    monkeypatch.setattr(jobwait, "_runs", lambda submitted: next(runs))
    submitted = {"run_id": "r1", "jobs": [{"job_id": "12", "target": "zen3", "state_root": "/s"}]}

    monkeypatch.setattr(jobwait, "POLL_SECONDS", 0.01)

    states = jobwait.wait(submitted, {}, 60)

    assert states == {"12": JobState("12", "COMPLETED", node="c1")}
