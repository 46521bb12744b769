"""``status --target``'s closing lines: what publishes or discards a run left staged."""

from __future__ import annotations

import datetime

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import text

CONTEXT = text.Context(state_root="/apps/zen3/.eb-staged-rebuild", now=datetime.datetime.now())


def _target(name, state):
    return {"target": name, "state_root": f"/apps/{name}/.s", "run": {"run_id": "r1", "state": state}}


def test_a_run_left_staged_names_the_publish_and_discard_of_every_target_shown():
    result = {
        "targets_file": "/apps/targets.ini",
        "targets": [_target("zen3", "staged"), _target("icelake", "failed"), _target("haswell", "staged")],
    }
    every = "--targets-file /apps/targets.ini --target zen3 --target icelake --target haswell"
    shown = text._staged_next(result, CONTEXT)
    # A command too long for a line continues on the next with " \\" (as a shell reads it).
    pasted = " ".join(shown.replace(" \\\n", " ").split())
    assert (
        pasted
        == f"Publish: eb-staged-rebuild publish r1 {every} Discard: eb-staged-rebuild discard r1 {every}"
    )
    assert shown.startswith("\nPublish:")


def test_nothing_is_suggested_when_no_run_is_staged():
    result = {
        "targets_file": None,
        "targets": [_target("zen3", "published"), {"target": "x", "state_root": "/x"}],
    }
    assert text._staged_next(result, CONTEXT) == ""
