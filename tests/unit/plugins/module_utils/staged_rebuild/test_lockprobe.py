"""The lock probe: hosts contend for the state-root lock and report whether another was ever
inside with them. Here the "hosts" are processes of this machine, which share its kernel,
so the lock excludes them; a writer that takes no lock at all shows what the probe reports
when the lock does not exclude (across real mounts that do not pass locks on, see
tests/integration/ansible/test_probe_playbook.py).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import locking, lockprobe

CONTEND = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from hpcstack_ops.staged_rebuild import lockprobe; "
    "print(json.dumps(lockprobe.contend(sys.argv[2], sys.argv[3], 'p1', 2, rounds=10, hold_seconds=0.02)))"
)


@pytest.fixture
def state_root(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    return root


def test_one_host_alone_is_coherent_and_leaves_nothing_behind(state_root):
    result = lockprobe.contend(str(state_root), "build1", "p1", 1, rounds=3, hold_seconds=0.01)

    assert result == {
        "host": "build1",
        "probe_id": "p1",
        "participants": 1,
        "rounds": 3,
        "overlaps": [],
        "coherent": True,
    }
    assert list((state_root / lockprobe.PROBE_DIR).iterdir()) == []
    with locking.StateLock(str(state_root), 0):  # released
        pass


def test_two_processes_on_one_kernel_are_excluded_by_the_lock(state_root, tmp_path):
    package = checkout.link_package(tmp_path / "pkg")
    hosts = [
        subprocess.Popen(
            [sys.executable, "-c", CONTEND, str(package), str(state_root), name],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("build1", "build2")
    ]
    outputs = [host.communicate(timeout=120)[0] for host in hosts]

    assert [host.returncode for host in hosts] == [0, 0]
    assert all('"coherent": true' in output and '"overlaps": []' in output for output in outputs), outputs
    assert list((state_root / lockprobe.PROBE_DIR).iterdir()) == []


def test_a_writer_that_takes_no_lock_is_found_inside(state_root, tmp_path):
    marker = state_root / lockprobe.PROBE_DIR / "p1" / lockprobe.MARKER
    intruder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "path = sys.argv[1]\n"
            "while not os.path.isdir(os.path.dirname(path)):\n    time.sleep(0.001)\n"
            # A short burst: the probe's own rounds go on well past it, to its clean-up.
            "end = time.monotonic() + 0.15\n"
            "while time.monotonic() < end:\n    open(path, 'w').write('intruder')\n    time.sleep(0.005)\n",
            str(marker),
        ]
    )
    try:
        result = lockprobe.contend(str(state_root), "build1", "p1", 1, rounds=8, hold_seconds=0.05)
    finally:
        intruder.kill()
        intruder.wait()

    assert result["coherent"] is False
    assert "intruder" in result["overlaps"]


def test_a_host_that_never_arrives_ends_the_wait_with_one_line(state_root):
    started = time.monotonic()

    with pytest.raises(errors.LockError, match=r"waited 0.3 s for 2 hosts in .*ready; 1 arrived"):
        lockprobe.contend(str(state_root), "build1", "p1", 2, wait_seconds=0.3)

    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("host", "probe_id", "participants", "message"),
    [
        ("build1", "../x", 1, "not a plain name"),
        ("../build1", "p1", 1, "not a plain name"),
        ("build1", "p1", 0, "participants >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    state_root, host, probe_id, participants, message
):
    with pytest.raises(errors.UsageError, match=message):
        lockprobe.contend(str(state_root), host, probe_id, participants)

    assert list(state_root.iterdir()) == []


def test_a_missing_state_root_is_refused(tmp_path):
    with pytest.raises(errors.UsageError, match="is not a directory"):
        lockprobe.contend(str(tmp_path / "missing"), "build1", "p1", 1)
