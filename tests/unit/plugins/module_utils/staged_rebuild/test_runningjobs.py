"""``runningjobs``: squeue's lines as jobs, and a report of why there are none.

Parsing only: ``tests/integration/test_gc_slurm.py`` asks the session's real Slurm.
"""

from __future__ import annotations

import datetime

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import runningjobs


def test_each_line_is_a_job_with_its_start_in_local_time():
    (first, second) = runningjobs.parse(
        "4242|2026-12-02T13:00:05|alice|n[1-3]\n4243|2026-12-02T14:00:00|bob|n4\n"
    )

    assert (first.job_id, first.user, first.nodes) == ("4242", "alice", "n[1-3]")
    assert first.started == datetime.datetime(2026, 12, 2, 13, 0, 5).astimezone()
    assert second.started.tzinfo is not None


def test_blank_lines_are_no_jobs():
    assert runningjobs.parse("\n  \n") == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("4242|2026-12-02T13:00:05|alice", "has 3 fields, not 4"),
        ("4242|N/A|alice|n1", "started at 'N/A', not a time"),
        ("4242|2026-12-02 13:00:05|alice|n1", "not a time"),
    ],
)
def test_a_line_that_is_not_a_job_is_refused_whole(line, problem):
    with pytest.raises(ValueError, match=problem):
        runningjobs.parse(f"1|2026-12-02T13:00:00|root|n1\n{line}\n")


def test_jobs_started_before_a_moment_are_the_ones_that_keep_a_tree():
    jobs = runningjobs.RunningJobs(
        runningjobs.parse("1|2026-12-02T13:00:00|a|n1\n2|2026-12-02T13:00:02|b|n1\n")
    )
    swap = datetime.datetime(2026, 12, 2, 13, 0, 1).astimezone()

    assert [job.job_id for job in jobs.started_before(swap)] == ["1"]
    assert jobs.summary() == {"answered": True, "running": 2}


def test_no_answer_reports_why_and_that_the_grace_period_decides():
    assert runningjobs.RunningJobs(None, "squeue not found on PATH").summary() == {
        "answered": False,
        "why": "squeue not found on PATH",
        "fallback": "grace period",
    }
    assert not runningjobs.NOT_ASKED.known
    assert runningjobs.NOT_ASKED.started_before(datetime.datetime.now().astimezone()) == []


def test_without_squeue_on_path_nothing_is_run_and_the_reason_is_given(tmp_path):
    answer = runningjobs.running_jobs({"PATH": str(tmp_path)})

    assert answer.summary()["why"] == "squeue not found on PATH"
