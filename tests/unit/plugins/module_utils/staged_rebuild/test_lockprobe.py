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


def _lagging_client(monkeypatch, misses):
    """``os.makedirs`` as a GlusterFS client that does not yet see the directory another host
    just made: ENOENT ``misses`` times, then the real call. Two clients of one volume cannot
    run in a unit test (the cluster gate runs them); the lag is what they show."""
    real, calls = lockprobe.os.makedirs, []

    def makedirs(path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= misses:
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(lockprobe.os, "makedirs", makedirs)
    return calls


def test_a_probe_directory_another_host_made_but_this_one_does_not_see_yet_is_tried_again(
    state_root, monkeypatch
):
    calls = _lagging_client(monkeypatch, misses=3)

    result = lockprobe.contend(str(state_root), "build1", "p1", 1, rounds=1, hold_seconds=0.01)

    # Past the three misses (os.makedirs also calls itself for the parents it makes).
    assert (result["coherent"], len(calls) > 3) == (True, True)


def test_a_probe_directory_this_host_never_sees_ends_the_wait_with_one_line(state_root, monkeypatch):
    _lagging_client(monkeypatch, misses=10**6)

    with pytest.raises(errors.LockError, match=r"could not create .*p1/ready in 0.2 s: another host made"):
        lockprobe.contend(str(state_root), "build1", "p1", 1, wait_seconds=0.2)


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
