"""The delta: what changes between the helper's before and after, applied to the task's view."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import envdelta
from tests.support.guard_reference import OMITTED_NAMES

REFERENCE_OMITTED = sorted(OMITTED_NAMES)
PREFIXED = ("BASH_FUNC_module%%", "BASH_FUNC_", "SLURM_", "SLURM_JOB_ID", "SLURM_LOCALID")


def test_the_omitted_names_are_exactly_the_references():
    assert set(REFERENCE_OMITTED) == envdelta.OMITTED_NAMES


@pytest.mark.parametrize("name", REFERENCE_OMITTED + list(PREFIXED))
def test_an_omitted_name_is_never_in_the_delta(name):
    task = {name: "task"}
    assert envdelta.is_omitted(name)
    assert envdelta.compute(task, {name: "before"}, {name: "after"}) == []
    assert envdelta.compute(task, {}, {name: "new"}) == []
    assert envdelta.compute(task, {name: "before"}, {}) == []


@pytest.mark.parametrize(
    "name",
    ["PATH", "SLURM", "SLURMX", "BASH_FUNCX", "BASH", "PS1", "PS3", "PROMPT_COMMAND", "pwd", "_X", "TMP"],
)
def test_names_near_the_omitted_ones_are_in_the_delta(name):
    assert not envdelta.is_omitted(name)
    assert envdelta.compute({name: "a"}, {name: "a"}, {name: "b"}) == [(name, "b")]


def test_a_changed_name_is_exported_with_the_value_after():
    task = {"MODULEPATH": "/login/modules"}
    before = {"MODULEPATH": "/login/modules"}
    after = {"MODULEPATH": "/node/modules"}
    assert envdelta.compute(task, before, after) == [("MODULEPATH", "/node/modules")]


def test_a_new_name_is_exported():
    assert envdelta.compute({}, {}, {"EESSI_CPU_FAMILY": "x86_64"}) == [("EESSI_CPU_FAMILY", "x86_64")]


def test_a_vanished_name_is_unset_when_the_task_has_it():
    assert envdelta.compute({"OLD": "1"}, {"OLD": "1"}, {}) == [("OLD", None)]


def test_a_vanished_name_the_task_lacks_is_not_unset():
    assert envdelta.compute({}, {"OLD": "1"}, {}) == []


def test_a_name_the_reload_left_alone_keeps_the_tasks_value():
    # Equal before and after: whatever the task holds stays, even if it differs.
    assert envdelta.compute({"HOME": "/task"}, {"HOME": "/shell"}, {"HOME": "/shell"}) == []
    assert envdelta.compute({"PS1": "$ "}, {}, {}) == []


def test_a_change_the_task_already_has_is_not_repeated():
    assert envdelta.compute({"A": "new"}, {"A": "old"}, {"A": "new"}) == []


def test_changes_are_sorted_by_name():
    before = {"B": "1", "A": "1", "C": "1"}
    after = {"C": "2", "A": "2", "D": "2"}
    changes = envdelta.compute(before, before, after)
    assert changes == [("A", "2"), ("B", None), ("C", "2"), ("D", "2")]


def test_values_keep_their_bytes():
    odd = os.fsdecode(b"\xff\xfe quote' newline\n tab\t")
    changes = envdelta.compute({}, {}, {"ODD": odd})
    assert changes == [("ODD", odd)]
    assert os.fsencode(changes[0][1]) == b"\xff\xfe quote' newline\n tab\t"


def test_an_empty_value_differs_from_an_unset_name():
    assert envdelta.compute({"E": ""}, {"E": ""}, {}) == [("E", None)]
    assert envdelta.compute({}, {}, {"E": ""}) == [("E", "")]


def test_invalid_names_are_passed_on_for_the_emitter_to_judge():
    assert envdelta.compute({}, {}, {"a-b": "1"}) == [("a-b", "1")]


@pytest.mark.parametrize(
    "name", ["BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "BASH_XTRACEFD", "PS4", "BASH_FUNC_ls%%"]
)
def test_the_child_environment_drops_what_a_bash_child_would_run(name):
    task = {name: "x", "PATH": "/bin"}
    assert envdelta.child_environment(task) == {"PATH": "/bin"}


def test_the_child_environment_keeps_everything_else_and_copies():
    task = {"PATH": "/bin", "SLURM_LOCALID": "0", "PS1": "$ ", "TMPDIR": "/tmp/x", "_": "/bin/x"}
    child = envdelta.child_environment(task)
    assert child == task
    assert child is not task


# node facts: EESSI's cached detections about the node it ran on


FACT = "EESSI_CUDA_DRIVER_VERSION"


def test_the_node_facts_are_the_driver_version():
    assert envdelta.NODE_FACTS == (FACT,)


def test_the_reload_starts_without_the_node_facts():
    task = {FACT: "11.4", "PATH": "/usr/bin", "BASH_ENV": "/x"}

    env = envdelta.reload_environment(task)

    assert env == {"PATH": "/usr/bin"}
    assert task[FACT] == "11.4"  # the task's own environment is not changed


def test_a_node_fact_the_reload_detected_replaces_the_inherited_one():
    # The helper started without it, so before lacks it; after holds this node's answer.
    changes = envdelta.compute({FACT: "11.4"}, {}, {FACT: "12.2"})

    assert changes == [(FACT, "12.2")]


def test_a_node_fact_the_reload_did_not_detect_is_unset():
    assert envdelta.compute({FACT: "12.2", "A": "1"}, {"A": "1"}, {"A": "1"}) == [(FACT, None)]


def test_a_node_fact_equal_to_the_task_s_is_not_repeated():
    assert envdelta.compute({FACT: "12.2"}, {}, {FACT: "12.2"}) == []


def test_a_node_fact_neither_side_has_changes_nothing():
    assert envdelta.compute({"A": "1"}, {"A": "1"}, {"A": "1"}) == []


def test_a_name_the_helper_restarted_with_another_value_is_compared_with_the_task_s():
    # The helper's first Lmod call started without the job's LMOD_RC: even when the reload
    # leaves it as the helper started it, the task's own value must go.
    task = {"LMOD_RC": "/login/.lmod/lmodrc.lua", "LMOD_PACKAGE_PATH": "/login/.lmod"}
    before = after = {"LMOD_RC": "/site/lmodrc.lua"}

    assert envdelta.compute(task, before, after, restarted={"LMOD_RC": "/site/lmodrc.lua"}) == [
        ("LMOD_RC", "/site/lmodrc.lua")
    ]
    assert envdelta.compute(task, {}, {}, restarted={"LMOD_PACKAGE_PATH": None}) == [
        ("LMOD_PACKAGE_PATH", None)
    ]
    assert envdelta.compute(task, before, after) == []  # without it the task keeps the login's
