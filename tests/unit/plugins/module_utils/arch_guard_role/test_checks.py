"""The node's own checks on real directories, and what a check in the table takes to reach the
role's refusal: the survey reports its fact and its problem, the plan refuses the node for it."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import checks, plan, survey
from ansible_collections.hpcstack.ops.plugins.module_utils.common import dirfd

HOSTNAME = "/proc/sys/kernel/hostname"
ALONE = "must be a directory (not a symlink) owned by root and writable by root alone"


@pytest.mark.parametrize(
    "kind", ["writable by others", "writable by its group", "a user's", "a symlink", "a file"]
)
def test_a_prefix_users_could_replace_is_the_parents_check_s_problem(tmp_path, kind):
    unsafe = tmp_path / "unsafe"
    if kind == "a symlink":
        (tmp_path / "real").mkdir()
        unsafe.symlink_to(tmp_path / "real")
    elif kind == "a file":
        unsafe.write_text("")
    else:
        unsafe.mkdir()
        # Not sticky: whoever may write here may rename what root makes in it.
        unsafe.chmod({"writable by others": 0o777, "writable by its group": 0o775}.get(kind, 0o755))
        if kind == "a user's":
            os.chown(unsafe, 65534, 65534)
    prefix = str(unsafe / "arch-guard")

    fact, problem = checks.parents({"prefix": prefix})

    assert fact[-1]["path"] == str(unsafe)
    assert problem == (
        f"arch_guard: {unsafe} {ALONE}: the guard runs in every job, and whoever can replace {prefix} runs "
        "code in them"
    )


@pytest.mark.parametrize("mode", [0o755, 0o1777])
def test_a_prefix_under_root_s_directories_or_a_sticky_one_is_no_problem(tmp_path, mode):
    above = tmp_path / "above"
    above.mkdir()
    above.chmod(mode)
    prefix = above / "arch-guard"
    prefix.mkdir()

    fact, problem = checks.parents({"prefix": str(prefix)})

    assert (fact[-1]["path"], fact[-1]["type"], problem) == (str(prefix), "directory", "")


def test_without_a_prefix_the_parents_check_reads_nothing():
    assert checks.parents({"prefix": None, "state_dir": "/var/lib/hpcstack/arch-guard"}) is None


def test_the_survey_reports_each_check_s_fact_and_problem_under_its_name(tmp_path):
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    unsafe.chmod(0o777)

    found = survey.survey(prefix=str(unsafe / "arch-guard"), python=[])
    asked_less = survey.survey(python=[])

    assert found["parents"][-1]["path"] == str(unsafe)
    assert found["problems"]["parents"] == checks.parents({"prefix": str(unsafe / "arch-guard")}).problem
    assert found["problems"]["parents"].startswith(f"arch_guard: {unsafe} {ALONE}")
    assert (asked_less["problems"], "parents" in asked_less) == ({}, False)


def _hostname_is_set(asked):
    """A check as one is added: reads one fact of the node, returns it with its problem."""
    if not asked.get("prefix"):
        return None
    name = dirfd.read_regular(HOSTNAME, "", limit=256).decode("ascii").strip()
    return checks.Finding(name, "" if name != "(none)" else "arch_guard: this node has no hostname")


def test_a_check_added_to_the_table_reaches_the_refusal_with_nothing_else_changed(tmp_path, monkeypatch):
    prefix = str(tmp_path / "arch-guard")
    settings = plan.Settings(
        {"prefix": prefix, "state_dir": str(tmp_path / "state"), "manage_slurm_conf": False}
    )
    before = plan.node(settings, "n1", survey_facts=survey.survey(prefix=prefix))
    monkeypatch.setitem(checks.NODE_CHECKS, "hostname", _hostname_is_set)
    monkeypatch.setitem(
        checks.NODE_CHECKS, "refused", lambda asked: checks.Finding(None, "arch_guard: refused by a check")
    )

    found = survey.survey(prefix=prefix)
    decided = plan.node(settings, "n1", survey_facts=found)

    assert found["hostname"] == dirfd.read_regular(HOSTNAME, "").decode("ascii").strip()
    assert (found["problems"]["hostname"], found["problems"]["refused"]) == (
        "",
        "arch_guard: refused by a check",
    )
    assert [name for name, line in before["refusals"].items() if line] == []
    assert [name for name, line in decided["refusals"].items() if line] == ["node"]
    assert decided["refusals"]["node"] == "arch_guard: refused by a check"
