"""hpcstack.ops.staged_probe: the path probe, and the lock contention of one host, through
``main()``. Several hosts at once are in tests/integration/ansible/test_probe_playbook.py."""

from __future__ import annotations

import os

from ansible_collections.hpcstack.ops.plugins.modules import staged_probe
from tests.support.module_runner import assert_failed_with, run_module
from tests.support.staged import snapshot

PROBE_KEYS = {"path", "filesystem", "exchange", "bwrap", "userns", "auto_backend", "recommendations"}


def test_the_path_probe_reports_what_the_directory_and_host_can_do_and_changes_nothing(capsys, tmp_path):
    before = snapshot(tmp_path)

    result = run_module(capsys, staged_probe, {"path": str(tmp_path), "eb": "/no/such/eb"})

    assert result["changed"] is False
    assert set(result["probe"]) >= PROBE_KEYS
    assert (result["probe"]["path"], result["probe"]["exchange"]) == (str(tmp_path), True)
    assert result["probe"]["easybuild_version"] is None
    assert "lock" not in result
    assert snapshot(tmp_path) == before


def test_one_host_contending_alone_finds_the_lock_coherent_in_check_mode_too(capsys, tmp_path):
    state_root = tmp_path / "state"
    state_root.mkdir()
    args = {
        "path": str(tmp_path),
        "eb": "/no/such/eb",
        "state_root": str(state_root),
        "lock_contention": True,
        "probe_id": "p1",
        "host": "build1",
        "rounds": 2,
        "hold_seconds": 0.01,
    }

    result = run_module(capsys, staged_probe, args, check_mode=True)

    assert result["changed"] is False
    assert result["lock"] == {
        "host": "build1",
        "probe_id": "p1",
        "participants": 1,
        "rounds": 2,
        "overlaps": [],
        "coherent": True,
    }
    assert os.listdir(state_root / "lock-probe") == []


def test_lock_contention_needs_a_probe_id(capsys, tmp_path):
    result = run_module(capsys, staged_probe, {"path": str(tmp_path), "lock_contention": True})

    assert result["failed"] is True
    assert result["msg"] == "lock_contention is True but all of the following are missing: probe_id"


def test_lock_contention_needs_a_state_root(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("EB_STAGED_REBUILD_STATE_ROOT", raising=False)

    result = run_module(
        capsys, staged_probe, {"path": str(tmp_path), "eb": "eb", "lock_contention": True, "probe_id": "p1"}
    )

    assert_failed_with(
        result, "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT", error="usage"
    )


def test_a_path_that_is_not_a_directory_fails_with_the_core_line(capsys, tmp_path):
    result = run_module(capsys, staged_probe, {"path": str(tmp_path / "missing"), "eb": "eb"})

    assert_failed_with(result, f"probe path {tmp_path / 'missing'}: not a directory")


def test_a_state_root_that_does_not_exist_fails_with_the_core_line(capsys, tmp_path):
    args = {
        "path": str(tmp_path),
        "eb": "eb",
        "state_root": str(tmp_path / "missing"),
        "lock_contention": True,
        "probe_id": "p1",
    }

    result = run_module(capsys, staged_probe, args)

    assert_failed_with(
        result, f"state root {tmp_path / 'missing'} is not a directory (the build_host role creates it)"
    )
