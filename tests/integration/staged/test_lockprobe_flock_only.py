"""A contender that takes only the flock, as the 0.2.0 publisher does, is not excluded by the
state-root lock of another node, and the lock probe reports the overlap.

Two views of one backing directory play two nodes: each view has its own inodes, so a lock
that the view keeps to itself reaches no process using the other view, as a lock kept in one
node's kernel reaches no other node. The nodes the design has in mind keep flock on their own
kernel and pass POSIX record locks on through the filesystem (NFS with ``local_lock=flock``,
say). bindfs does not offer that split as one mount: without ``--enable-lock-forwarding`` a
view keeps both kinds of lock to itself, with it (and ``--multithreaded``) it passes both on,
flock included, and through such views flock alone would exclude, so a flock-only holder could
not be told from a full one (the first test measures this). So each node's state root here is
built from two mounts of the backing directory: a forwarding bindfs view, which carries the
data and the POSIX lock on ``.lock.posix`` to the other node, and over its ``.lock`` a bind
mount of the same file seen through a view that does not forward locks, where the flock stays
on this node. The second test checks that split with real locks.

On those two nodes the full protocol (flock, then the sidecar) is coherent: only the sidecar
reaches across, so it is what excludes. A contender that follows the probe's protocol but
locks only with flock on ``.lock``, never opening ``.lock.posix``, is found inside the lock by
the other node; on the same node its flock still excludes, as the design says. Every
contender is its own process: POSIX locks belong to a process, so threads could not show it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import locking, lockprobe
from tests.integration.harness.mounts import bindfs_mount

# bindfs forwards locks only when it serves requests on several threads.
FORWARD = ("--multithreaded", "--enable-lock-forwarding")
ROUNDS = 15
HOLD = 0.05
# node2 keeps its own rhythm, as a publisher's time inside the lock is its own: in step with
# node1 it could keep entering just before node1 every round, and node1 would then only ever
# find the marker emptied. Out of step, node2 enters while node1 is inside every few rounds,
# and node1's check after its hold names it.
NODE2_HOLD = 0.03

# One contender of the lock probe, its lock "full", "flock-only" or "none" (the script says why).
CONTENDER = checkout.REPO / "tests" / "support" / "lock_contender.py"

# Holds one kind of lock on a file until its stdin closes.
HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
(fcntl.flock if sys.argv[2] == "flock" else fcntl.lockf)(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""

# Tries the same kind of lock on a file once, without waiting: "taken" or "refused".
TRY_LOCK = """
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
try:
    (fcntl.flock if sys.argv[2] == "flock" else fcntl.lockf)(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as err:
    print("refused" if err.errno in (errno.EACCES, errno.EAGAIN) else err.strerror)
else:
    print("taken")
"""


def _excludes(kind, held_at, tried_at):
    """Whether ``kind`` ("flock" or "lockf") held through one path refuses another process
    trying it through another path."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(held_at), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        tried = subprocess.run(
            [sys.executable, "-c", TRY_LOCK, str(tried_at), kind],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    finally:
        holder.stdin.close()
        holder.stdout.close()
        holder.wait(timeout=30)
    assert tried.stdout.strip() in ("taken", "refused"), tried.stdout
    return tried.stdout.strip() == "refused"


def _bind_mount(source, target):
    done = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"mount --bind {source} {target} (needs root): {done.stderr.strip()}"


@contextlib.contextmanager
def _node(backing, where):
    """A node's state root on ``backing``: the data and the POSIX lock on the sidecar reach
    every other node, the flock on ``.lock`` stays on this one."""
    # Created before the views, so that the bind mount has a file to cover on both sides.
    (backing / locking.LOCK_NAME).touch(mode=0o600)
    where.mkdir()
    with bindfs_mount(backing, where / "root", *FORWARD) as root, bindfs_mount(
        backing, where / "own-locks"
    ) as own_locks:
        _bind_mount(own_locks / locking.LOCK_NAME, root / locking.LOCK_NAME)
        try:
            yield root
        finally:
            subprocess.run(["umount", str(root / locking.LOCK_NAME)], capture_output=True, check=True)


def _start(package, state_root, lock, host):
    """node2: the probe with ``lock`` ("full" or "flock-only") in a process of its own."""
    args = [str(package), str(state_root), lock, host, "p1", str(ROUNDS), str(NODE2_HOLD)]
    return subprocess.Popen(
        [sys.executable, str(CONTENDER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _contend_with(package, node1_root, node2_root, node2_lock):
    """node1 runs the probe with the real lock in this process while node2 runs it with
    ``node2_lock`` in its own; returns both results."""
    node2 = _start(package, node2_root, node2_lock, "node2")
    try:
        node1 = lockprobe.contend(str(node1_root), "node1", "p1", 2, rounds=ROUNDS, hold_seconds=HOLD)
    finally:
        out, err = node2.communicate(timeout=120)
    assert node2.returncode == 0, err
    return node1, json.loads(out)


def test_forwarding_views_pass_on_flocks_as_well_as_posix_locks(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    with bindfs_mount(backing, tmp_path / "v1", *FORWARD) as one, bindfs_mount(
        backing, tmp_path / "v2", *FORWARD
    ) as two:
        assert _excludes("lockf", one / "file", two / "file")
        # So through these views flock alone excludes: a flock-only holder would be kept out
        # and the probe could not tell it from a full one.
        assert _excludes("flock", one / "file", two / "file")


def test_the_split_nodes_pass_on_the_posix_lock_and_keep_the_flock(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    with _node(backing, tmp_path / "node1") as node1, _node(backing, tmp_path / "node2") as node2:
        lock, sidecar = locking.LOCK_NAME, locking.SIDECAR_NAME
        assert _excludes("lockf", node1 / sidecar, node2 / sidecar)
        assert not _excludes("flock", node1 / lock, node2 / lock)
        # On one node the flock excludes, and the two nodes share the file's data.
        assert _excludes("flock", node1 / lock, node1 / lock)
        (node1 / "data").write_text("from node1")
        assert (backing / "data").read_text() == "from node1"
        # Each node's .lock is one file with one name: StateLock accepts it.
        assert (node1 / lock).stat().st_nlink == 1


def test_two_full_contenders_on_the_split_nodes_are_coherent(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    package = checkout.link_package(tmp_path / "pkg")
    with _node(backing, tmp_path / "node1") as node1, _node(backing, tmp_path / "node2") as node2:
        one, two = _contend_with(package, node1, node2, "full")

    # Only the sidecar's POSIX lock reaches across here, and it excludes.
    assert (one["coherent"], one["overlaps"]) == (True, [])
    assert (two["coherent"], two["overlaps"]) == (True, [])
    assert list((backing / lockprobe.PROBE_DIR).iterdir()) == []


def test_a_flock_only_contender_on_another_node_is_found_inside_the_lock(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    package = checkout.link_package(tmp_path / "pkg")
    with _node(backing, tmp_path / "node1") as node1, _node(backing, tmp_path / "node2") as node2:
        one, two = _contend_with(package, node1, node2, "flock-only")

    assert one["coherent"] is False, one
    assert "node2" in one["overlaps"], one
    # Nothing but node2's writes (its name, or the marker it emptied) was found.
    assert set(one["overlaps"]) <= {"node2", "(emptied)"}, one
    assert set(two["overlaps"]) <= {"node1", "(emptied)"}, two


def test_a_flock_only_contender_on_the_same_node_is_excluded(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    package = checkout.link_package(tmp_path / "pkg")
    with _node(backing, tmp_path / "node1") as node1:
        # The same state root as node1: one kernel, one inode of .lock, so the flock excludes.
        one, two = _contend_with(package, node1, node1, "flock-only")

    assert (one["coherent"], one["overlaps"]) == (True, [])
    assert (two["coherent"], two["overlaps"]) == (True, [])
    assert list((backing / lockprobe.PROBE_DIR).iterdir()) == []
