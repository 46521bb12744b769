"""``gc`` with the other hosts' answers (``inuse.Fleet``): a tree another host's process uses
stays, named with the host; a host that gave no answer keeps every tree; answers that name
nothing let the tree go.

The answers are what ``staged_in_use`` returns on a host (``tests/integration`` runs it for
real over SSH on the cluster); here they are given as data, with real journals and trees.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import inuse
from tests.unit.plugins.module_utils.staged_rebuild.test_gc import GRACE, T0, Site


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


PROCESS = {"pid": 4711, "uid": 1001, "user": "alice", "command": "tinyapp", "uses": ["fd"], "job_id": "4242"}


def test_a_tree_a_process_of_another_host_uses_is_kept_and_names_the_host_and_job(site):
    site.publish_run("run1")
    sibling = str(site.sibling("TinyApp/1.0", "run1"))
    fleet = inuse.Fleet.from_answers({"c1": {sibling: [PROCESS]}, "c2": {sibling: []}})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert report["removed"] == []
    (kept,) = report["kept"]
    assert kept["why"] == "in use on c1 by 1 process (pids 4711; users alice; jobs 4242)"
    assert kept["processes"] == [dict(PROCESS, uses=("fd",), host="c1")]
    assert site.sibling("TinyApp/1.0", "run1").is_dir()
    assert report["fleet"] == {"unanswered": []}


def test_a_host_that_did_not_answer_keeps_every_tree_and_is_named(site):
    site.publish_run("run1")
    site.publish_run("run2", "OtherApp/2.0")
    fleet = inuse.Fleet.from_answers({"c1": {}, "c3": None})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert report["removed"] == []
    assert [entry["why"] for entry in report["kept"]] == ["no answer from c3: every tree is kept"] * 2
    assert report["fleet"] == {"unanswered": ["c3"]}


def test_an_answer_that_is_not_a_list_of_processes_counts_as_no_answer(site):
    site.publish_run("run1")
    sibling = str(site.sibling("TinyApp/1.0", "run1"))
    # c3: what the playbook gives for a host whose scan left no in_use (unreachable, failed).
    fleet = inuse.Fleet.from_answers({"c1": {sibling: [{"pid": "not a number"}]}, "c2": "garbage", "c3": ""})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert fleet.unanswered == ("c1", "c2", "c3")
    assert report["removed"] == []


def test_answers_that_name_no_process_let_the_tree_go_after_the_grace_period(site):
    site.publish_run("run1")
    sibling = str(site.sibling("TinyApp/1.0", "run1"))
    fleet = inuse.Fleet.from_answers({"c1": {sibling: []}, "c2": {sibling: []}})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert report["removed"] == [{"path": sibling, "run_id": "run1"}]
    assert not site.sibling("TinyApp/1.0", "run1").exists()


def test_a_tree_a_host_was_not_asked_about_is_kept_and_names_the_host(site):
    # The playbook lists the candidates, the hosts scan for them, then gc runs: a rebuild in
    # between swaps out a tree that no scan looked for. An answer is about the trees it
    # names, so the tree stays until a scan has looked for it.
    site.publish_run("run1")
    site.publish_run("run2", "OtherApp/2.0")
    listed = str(site.sibling("TinyApp/1.0", "run1"))
    later = str(site.sibling("OtherApp/2.0", "run2"))
    fleet = inuse.Fleet.from_answers({"c1": {listed: []}, "c2": {listed: [], later: []}})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert report["removed"] == [{"path": listed, "run_id": "run1"}]
    (kept,) = report["kept"]
    assert kept == {
        "path": later,
        "run_id": "run2",
        "why": "not asked of c1 (their scans ran before it was a candidate)",
        "not_asked": ["c1"],
    }
    assert site.sibling("OtherApp/2.0", "run2").is_dir()


def test_within_the_grace_period_the_fleet_answers_do_not_remove_anything(site):
    site.publish_run("run1")
    fleet = inuse.Fleet.from_answers({"c1": {str(site.sibling("TinyApp/1.0", "run1")): []}})

    report = site.gc(now=T0, fleet=fleet)

    assert report["removed"] == []
    assert [entry["why"] for entry in report["kept"]] == ["grace period"]


@pytest.mark.parametrize(
    ("value", "is_job"),
    [
        ("4242", True),
        ("4242_7", True),  # an array task
        ("4242+1", True),  # a heterogeneous job's component
        ("", False),
        ("4242_", False),
        ("_7", False),
        ("4242_7+1", False),
        ("42 42", False),
        ("\uff14\uff12", False),  # digits, but not ASCII ones (fullwidth)
        ("4242\x1b[2K", False),
        ("\x1b]52;c;aGk=\x07", False),
    ],
)
def test_a_job_id_has_slurm_s_form(value, is_job):
    assert inuse.is_job_id(value) is is_job


def test_a_job_id_that_is_not_of_slurm_s_form_is_counted_in_the_reason_and_kept_whole_in_the_processes(site):
    site.publish_run("run1")
    sibling = str(site.sibling("TinyApp/1.0", "run1"))
    hostile = "\x1b]52;c;aGk=\x07\x1b[2K\rremoved  /apps/software/TinyApp/.1.0.run1\n"
    fleet = inuse.Fleet.from_answers(
        {"c1": {sibling: [dict(PROCESS, job_id=hostile), dict(PROCESS, pid=4712, job_id="4242_3")]}}
    )

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    (kept,) = report["kept"]
    assert kept["why"] == (
        "in use on c1 by 2 processes (pids 4711, 4712; users alice; jobs 4242_3; "
        "1 SLURM_JOB_ID that is not a job id)"
    )
    assert [process["job_id"] for process in kept["processes"]] == [hostile, "4242_3"]


def test_in_fleet_mode_a_tree_whose_path_is_not_utf_8_is_kept_since_no_host_can_be_asked_about_it(tmp_path):
    site = Site(tmp_path / os.fsdecode(b"site-\xff"))
    site.publish_run("run1")
    sibling = str(site.sibling("TinyApp/1.0", "run1"))
    # What the hosts were asked about: the path as the build host's result gave it, escaped.
    asked = sibling.replace(os.fsdecode(b"\xff"), "\\xff")
    fleet = inuse.Fleet.from_answers({"c1": {asked: []}})

    report = site.gc(now=T0 + GRACE, fleet=fleet)

    assert asked != sibling
    assert report["removed"] == []
    assert report["kept"] == [
        {
            "path": sibling,
            "run_id": "run1",
            "why": "its path is not UTF-8, so the other hosts cannot be asked about it: it is kept",
        }
    ]
    assert site.sibling("TinyApp/1.0", "run1").is_dir()
