"""What ``status`` and the job commands print for people about runs submitted as jobs."""

from __future__ import annotations

import datetime

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import text
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal, trees_of

NOW = datetime.datetime(2026, 12, 5, 3, 0, tzinfo=datetime.timezone.utc)


def _context(state_root):
    return text.Context(state_root=str(state_root), now=NOW, command=("eb-staged-rebuild",))


def test_a_job_is_its_id_target_and_slurm_s_state_node_and_reason():
    assert text.job_state(
        {"job_id": "12", "target": "zen3", "slurm": {"state": "RUNNING", "node": "n1"}}
    ) == ("12 zen3 RUNNING on n1")
    assert text.job_state({"job_id": "13", "slurm": {"state": "PENDING", "reason": "Resources"}}) == (
        "13 PENDING (Resources)"
    )
    assert text.job_state({"job_id": "14", "slurm": {"state": "unknown", "why": "finished"}}) == (
        "14 unknown (finished)"
    )
    # Slurm is asked only while the run waits or builds; after, the node it ran on.
    assert text.job_state({"job_id": "15", "node": "n2"}) == "15 ran on n2"
    assert text.job_state({"job_id": None}) == "not submitted"
    assert text.job_state(None) == ""


def test_a_job_s_values_are_shown_escaped():
    assert text.job_state({"job_id": "1", "slurm": {"state": "PENDING", "reason": "\x1b[2Jx"}}) == (
        "1 PENDING (\\x1b[2Jx)"
    )


def test_status_has_a_job_column_when_a_run_has_a_job(tmp_path):
    state_root = tmp_path / "state"
    trees = trees_of(tmp_path / "apps")
    publish_journal(state_root / "runs", "run1", trees, state=RunState.QUEUED)
    result = {
        "runs": [
            {
                "run_id": "run1",
                "kind": "publish",
                "state": "queued",
                "created": NOW.isoformat(),
                "job": {
                    "job_id": "4242",
                    "target": "zen3",
                    "slurm": {"state": "PENDING", "reason": "Priority"},
                },
                "modules": [{"module": "TinyApp/1.0"}],
            }
        ],
        "incomplete": [],
    }

    lines = text.status(result, _context(state_root)).splitlines()

    # The job leaves the modules too little room on the line: they go on the next.
    assert lines[0].split() == ["RUN", "KIND", "STATE", "CREATED", "JOB"]
    assert lines[1].strip() == "MODULES"
    assert lines[2].startswith("run1 ")
    assert lines[2].endswith("4242 zen3 PENDING (Priority)")
    assert lines[3].strip() == "TinyApp/1.0"


def test_a_staged_run_s_next_commands_are_publish_and_discard(tmp_path):
    result = {
        "runs": [
            {
                "run_id": "run1",
                "kind": "publish",
                "state": "staged",
                "created": NOW.isoformat(),
                "job": None,
                "modules": [],
            }
        ],
        "incomplete": [],
    }
    context = text.Context(
        state_root=str(tmp_path), now=NOW, command=("eb-staged-rebuild", "--state-root", "/s")
    )

    out = text.status(result, context)

    assert out.endswith(
        "Run run1 is staged; next:\n"
        "Publish: eb-staged-rebuild --state-root /s publish run1\n"
        "Discard: eb-staged-rebuild --state-root /s discard run1\n"
    )


def test_a_submission_is_one_line_with_every_job():
    result = {
        "run_id": "run1",
        "jobs": [
            {"target": "zen3", "job_id": "123", "state_root": "/a"},
            {"target": "icelake", "job_id": "124", "state_root": "/b"},
        ],
        "publish_job": "125",
    }

    out = text.rebuild(result, text.Context(state_root="", now=NOW))

    assert out.splitlines() == [
        "submitted run run1: job 123 (zen3), job 124 (icelake), publish job 125",
        "Status: eb-staged-rebuild status run1",
    ]


def test_publish_says_what_is_live_and_how_to_undo_each():
    result = {"published": [{"state_root": "/a", "run_id": "run1"}, {"state_root": "/b", "run_id": "run1"}]}

    out = text.published_staged(result, text.Context(state_root="", now=NOW))

    assert out.splitlines() == [
        "Published run run1 in /a.",
        "Undo: eb-staged-rebuild --state-root /a rollback run1",
        "Published run run1 in /b.",
        "Undo: eb-staged-rebuild --state-root /b rollback run1",
    ]
