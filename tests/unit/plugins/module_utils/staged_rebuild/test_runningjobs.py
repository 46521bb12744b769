"""``runningjobs``: squeue's lines as jobs, and a report of why there are none.

Parsing only: ``tests/integration/gc/test_gc_slurm.py`` asks the session's real Slurm.
"""

from __future__ import annotations

import datetime

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import runningjobs
from tests.support.slurm_env import CLIENT_VARIABLES


def test_each_line_is_a_job_with_its_start_in_utc():
    # squeue runs with TZ=UTC0 (client_environment): its times, printed without a zone, are UTC.
    (first, second) = runningjobs.parse(
        "4242|2026-12-02T13:00:05|alice|n[1-3]\n4243|2026-12-02T14:00:00|bob|n4\n"
    )

    assert (first.job_id, first.user, first.nodes) == ("4242", "alice", "n[1-3]")
    assert first.started == datetime.datetime(2026, 12, 2, 13, 0, 5, tzinfo=datetime.timezone.utc)
    assert second.started.utcoffset() == datetime.timedelta(0)


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
    swap = datetime.datetime(2026, 12, 2, 13, 0, 1, tzinfo=datetime.timezone.utc)

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


def test_the_clients_get_no_variable_they_read_as_an_option_but_the_cluster_and_utc():
    caller = dict(
        CLIENT_VARIABLES, PATH="/usr/bin", HOME="/root", SLURM_CONF="/etc/slurm/x.conf", TZ="Europe/Oslo"
    )

    env = runningjobs.client_environment(caller)

    assert env == {"PATH": "/usr/bin", "HOME": "/root", "SLURM_CONF": "/etc/slurm/x.conf", "TZ": "UTC0"}
    assert caller["SQUEUE_USERS"] == "root"  # the caller's own mapping is left as it was


SHOW_CONFIG = """Configuration data as of 2026-12-03T17:48:16
AccountingStorageType   = accounting_storage/none
PrivateData             = {private}
SlurmUser               = {slurm_user}
SlurmdUser              = root(0)
"""


@pytest.mark.parametrize("private", ["none", "usage,users", "accounts,events,nodes,partitions,reservations"])
def test_a_user_sees_every_job_with_all_where_private_data_hides_no_jobs(private):
    config = SHOW_CONFIG.format(private=private, slurm_user="slurm(64030)")

    assert runningjobs.visibility(config, 1001) == ""


@pytest.mark.parametrize("private", ["jobs", "accounts,jobs,usage", "Jobs"])
def test_private_data_jobs_hides_other_users_jobs_from_a_user_and_says_so(private):
    config = SHOW_CONFIG.format(private=private, slurm_user="slurm(64030)")

    assert runningjobs.visibility(config, 1001) == (
        f"PrivateData={private}: squeue shows uid 1001 (neither root nor SlurmUser) only its own jobs"
    )


def test_slurm_user_sees_every_job_whatever_private_data_says():
    config = SHOW_CONFIG.format(private="jobs", slurm_user="slurm(64030)")

    assert runningjobs.visibility(config, 64030) == ""


def test_a_configuration_without_private_data_is_not_taken_as_showing_everything():
    config = "SlurmUser               = slurm(64030)\n"

    assert runningjobs.visibility(config, 1001) == (
        "scontrol show config names no PrivateData, so whether squeue shows uid 1001 every job is unknown"
    )
