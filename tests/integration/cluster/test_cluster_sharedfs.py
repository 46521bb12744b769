"""The state-root lock and the directory exchange on real shared filesystems, from two build
nodes of the namespace cluster: GlusterFS and CephFS, served from the controller and mounted
with their FUSE clients on b1, b2 and the compute nodes (``testbed/sharedfs.py``).

This answers the design's open-004 questions with the product's own code: the lock probe as
``ansible-playbook hpcstack.ops.probe`` runs it on b1 and b2 (both with the real lock), and
``lockprobe.contend`` in a process on each node with the real lock on b1 and, on b2, a lock
that takes only the flock on ``.lock`` (the 0.2.0 publisher, ``flock(1)``) or, as the
control, no lock; a refused or waiting ``eb-staged-rebuild`` on one node while the other
holds the lock; and ``eb-staged-rebuild probe --path`` on each filesystem. What is asserted
is what was measured (GlusterFS 10.3, CephFS 16.2.15): a change in either fails here first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import checkout
import localplay
import sharedfs
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import locking, lockprobe, probe
from tests.integration.harness.cluster import CLUSTER, ansible_env

pytestmark = CLUSTER

ROUNDS = 15
HOLD = 0.05
# b2 keeps its own rhythm, so that out of step with b1 it would enter while b1 is inside
# every few rounds if the lock let it (test_lockprobe_flock_only.py says why).
B2_HOLD = 0.03
TIMEOUT = 120

# One contender of the lock probe, its lock "full", "flock-only" or "none" (the script says why).
CONTENDER = checkout.REPO / "tests" / "support" / "lock_contender.py"

# Holds the real state-root lock until stdin closes.
HOLD_LOCK = """
import sys
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.staged_rebuild import locking
with locking.StateLock(sys.argv[2], 0):
    print("held", flush=True)
    sys.stdin.read()
"""

FILESYSTEMS = ("glusterfs", "cephfs")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """``hpcstack_ops`` for the nodes: /tmp is every node's."""
    return checkout.link_package(tmp_path_factory.mktemp("pkg"))


@pytest.fixture(params=FILESYSTEMS)
def shared(request, cluster):
    """One shared filesystem and a fresh directory on it, made from b1, with a state root whose
    ``runs/`` is there (gc refuses a state root that never had one) and empty."""
    fs = request.getfixturevalue(request.param)
    top = f"{fs.mountpoint}/{request.node.name.split('[')[0][:40]}-{uuid.uuid4().hex[:8]}"
    cluster.node("b1").run(["mkdir", "-p", f"{top}/state/runs"])
    return fs, top


def _tool(node, package, *args, timeout=TIMEOUT):
    """``eb-staged-rebuild ARGS`` on ``node``, from this checkout."""
    return node.run(
        [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli", *args],
        check=False,
        timeout=timeout,
        env={"PYTHONPATH": str(package), "PATH": "/usr/sbin:/usr/bin:/bin", "LANG": "C.UTF-8"},
    )


def _contend(cluster, package, state_root, b2_lock):
    """The lock probe on b1 (real lock) and b2 (``b2_lock``) at once; both results."""
    probe_id = f"p{uuid.uuid4().hex[:8]}"
    started = []
    for host, lock, hold in (("b1", "full", HOLD), ("b2", b2_lock, B2_HOLD)):
        args = [str(package), state_root, lock, host, probe_id, str(ROUNDS), str(hold)]
        started.append(
            cluster.node(host).popen(
                [sys.executable, str(CONTENDER), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    # Both are collected before either is checked: a failed one leaves no process behind.
    finished = [(process, *process.communicate(timeout=TIMEOUT)) for process in started]
    for process, _out, err in finished:
        assert process.returncode == 0, err
    return [json.loads(out) for _process, out, _err in finished]


class _Holder:
    """The real state-root lock held on ``node`` until the ``with`` block ends."""

    def __init__(self, node, package, state_root):
        self.process = node.popen(
            [sys.executable, "-c", HOLD_LOCK, str(package), state_root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self):
        assert self.process.stdout.readline() == "held\n"
        return self

    def release(self):
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        assert self.process.wait(timeout=TIMEOUT) == 0

    def __exit__(self, *exc_info):
        self.release()
        self.process.stdout.close()


def test_data_written_on_one_node_is_read_on_the_others(shared, cluster):
    _fs, top = shared
    cluster.node("b1").write(f"{top}/from-b1", "written on b1\n")
    for name in ("b2", "c1"):
        assert cluster.node(name).read(f"{top}/from-b1") == "written on b1\n"
    # Not a local directory: the server's brick or pool, not the node's overlay, holds it.
    assert cluster.node("login").run(["test", "-e", f"{top}/from-b1"], check=False).returncode != 0


def test_the_clients_see_the_filesystem_types_the_probe_knows(shared, cluster):
    fs, _top = shared
    expected = {"glusterfs": "fuse.glusterfs", "cephfs": "fuse.ceph-fuse"}[fs.kind]
    assert fs.fstype == expected
    for name in fs.nodes:
        assert expected in cluster.node(name).read("/proc/self/mountinfo")


def test_the_probe_finds_a_contender_on_the_other_node_that_takes_no_lock(shared, cluster, package):
    # The control: through these FUSE clients' caches the probe does see another node inside,
    # so "coherent" above is a measurement and not a blind spot.
    _fs, top = shared
    b1, _b2 = _contend(cluster, package, f"{top}/state", "none")
    assert b1["coherent"] is False, b1
    # Unlocked writes also tear: b1 may read NULs where b2 truncated the marker meanwhile.
    assert "b2" in b1["overlaps"], b1


def test_a_flock_only_contender_on_the_other_node_is_excluded(shared, cluster, package):
    # On both filesystems flock reaches the other node (GlusterFS turns it into a POSIX lock,
    # CephFS's MDS keeps flocks itself), so a contender that only takes the flock is kept out.
    _fs, top = shared
    b1, b2 = _contend(cluster, package, f"{top}/state", "flock-only")
    assert (b1["coherent"], b1["overlaps"]) == (True, []), b1
    assert (b2["coherent"], b2["overlaps"]) == (True, []), b2


def test_a_run_on_the_other_node_is_refused_while_the_lock_is_held(shared, cluster, package):
    _fs, top = shared
    state = f"{top}/state"
    with _Holder(cluster.node("b1"), package, state):
        done = _tool(cluster.node("b2"), package, "--state-root", state, "--lock-timeout", "0", "gc")
        # flock is coherent across nodes here: the refusal comes from the flock, and the holder
        # record written through the shared file names the other node.
        assert done.returncode == 2, done
        assert "is locked by another eb-staged-rebuild run on this node (flock on" in done.stderr
        assert "on b1" in done.stderr
        # flock(1), as an old tool or a shell script takes it, is refused too.
        taken = cluster.node("b2").run(["flock", "-n", "-E", "75", f"{state}/.lock", "true"], check=False)
        assert taken.returncode == 75
        # So is a POSIX lock on the sidecar from a third node.
        locked = cluster.node("c1").run(
            [sys.executable, "-c", _TRY_LOCKF, f"{state}/{locking.SIDECAR_NAME}"], check=False
        )
        assert locked.stdout.strip() == "refused", locked
    done = _tool(cluster.node("b2"), package, "--state-root", state, "--lock-timeout", "0", "gc")
    assert done.returncode == 0, done.stderr


def test_a_run_on_the_other_node_waits_for_the_lock_within_its_timeout(shared, cluster, package):
    _fs, top = shared
    state = f"{top}/state"
    with _Holder(cluster.node("b1"), package, state) as holder:
        waiting = cluster.node("b2").popen(
            [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli", "--state-root", state,
             "--lock-timeout", "30", "--json", "gc", "--no-squeue"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(package), "PATH": "/usr/sbin:/usr/bin:/bin", "LANG": "C.UTF-8"},
        )  # fmt: skip
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=0.5)
        holder.release()
        out, err = waiting.communicate(timeout=TIMEOUT)
    assert waiting.returncode == 0, err
    # gc ran, under the lock, once b1 let go: nothing to collect in an empty state root.
    assert json.loads(out) == {
        "changed": False, "dry_run": False, "grace_hours": 144.0, "incomplete": [], "interrupted": [],
        "kept": [], "manual": [], "removed": [], "candidates": [], "queued": [], "staged": [],
        # No tree to look for: /proc is not read.
        "processes": {
            "scanned": 0, "unreadable": 0, "as_uid": 0, "seen": "every process of this node's pid namespace",
        },
        "slurm": {"answered": False, "why": "not asked (--no-squeue)", "fallback": "grace period"},
    }  # fmt: skip


def test_a_flock_1_holder_on_the_other_node_refuses_the_real_lock(shared, cluster, package):
    _fs, top = shared
    state = f"{top}/state"
    holder = cluster.node("b2").popen(
        ["flock", f"{state}/.lock", "sh", "-c", "echo held; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        done = _tool(cluster.node("b1"), package, "--state-root", state, "--lock-timeout", "0", "gc")
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
        holder.stdout.close()
    assert done.returncode == 2, done
    # flock(1) writes no holder record.
    assert "on this node (flock on" in done.stderr
    assert "holder not recorded" in done.stderr


_TRY_LOCKF = """
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CLOEXEC)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as err:
    print("refused" if err.errno in (errno.EACCES, errno.EAGAIN) else err.strerror)
else:
    print("taken")
"""

# What each filesystem reports and does, as measured: the type in /proc/self/mountinfo, the
# first line of its version, and the errno of RENAME_EXCHANGE between two directories (both
# FUSE daemons refuse the flag, so publishing there takes the three-rename fallback).
MEASURED = {
    "glusterfs": ("fuse.glusterfs", "glusterfs 10.3", "EINVAL"),
    "cephfs": ("fuse.ceph-fuse", "ceph version 16.2.15 ", "EINVAL"),
}


def test_the_filesystems_are_the_versions_that_were_measured(shared):
    # A new version must be measured again: these figures, the probe's table and the docs.
    fs, _top = shared
    fstype, version, _errno = MEASURED[fs.kind]
    assert fs.version.startswith(version), fs.version
    assert fs.fstype == fstype
    assert probe.SHARED_FILESYSTEMS[fstype]["measured"].split(" ")[1] in fs.version


def test_probe_finds_no_exchange_and_prints_the_measured_lock(shared, cluster, package):
    fs, top = shared
    fstype, _version, errno_name = MEASURED[fs.kind]
    done = _tool(cluster.node("b1"), package, "probe", "--path", top, "--json")
    # Exit 0: a probe's findings are not warnings.
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["filesystem"] == fstype
    assert (report["exchange"], report["exchange_errno"]) == (False, errno_name)
    assert report["publish_method"].startswith("fallback (three renames")
    lock_lines = [line for line in report["recommendations"] if line.startswith("cross-node lock:")]
    assert lock_lines == [
        f"cross-node lock: {fstype} is shared; the lock was measured coherent across nodes on "
        f"{probe.SHARED_FILESYSTEMS[fstype]['measured']} (flock reaches the other nodes too, so a publisher "
        "taking only the flock (0.2.0) is excluded as well); confirm it on this site's version by "
        "contending for the state-root lock from two build nodes before deployment"
    ]
    assert any(
        line.startswith(f"directory exchange: fails with {errno_name} on {fstype}")
        for line in report["recommendations"]
    )
    # The scratch directories of the exchange are gone, as seen from another node.
    assert cluster.node("b2").run(["ls", "-A", top]).stdout.split() == ["state"]


def test_the_probe_playbook_on_b1_and_b2_finds_the_lock_coherent(shared, cluster, tmp_path):
    # Two full contenders: ansible-playbook hpcstack.ops.probe on the controller, its
    # staged_probe module over SSH on both build nodes, contending for one state root.
    fs, top = shared
    fstype = MEASURED[fs.kind][0]
    playbooks = localplay.LocalPlaybooks(tmp_path / "ansible", ansible_env())
    inventory = cluster.inventory({"build_hosts": ["b1", "b2"]}, path=tmp_path / "inventory.yml")
    argv = [
        str(localplay.BIN / "ansible-playbook"), "hpcstack.ops.probe", "-i", str(inventory),
        "-e", f"staged_probe_path={top}", "-e", f"staged_state_root={top}/state",
        "-e", f"staged_probe_rounds={ROUNDS}",
    ]  # fmt: skip
    done = cluster.controller.run(argv, env=playbooks.env(), check=False, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    for host in ("b1", "b2"):
        # host, filesystem, exchange, bwrap, userns, auto backend, lock
        assert re.search(rf'"{host} +{re.escape(fstype)} +False +True +True +bwrap +yes +"', done.stdout), (
            done.stdout
        )
        assert f"{host}: cross-node lock: {fstype} is shared; the lock was measured coherent" in done.stdout
    assert "lock: coherent across b1, b2: one live tree on this filesystem may be rebuilt" in done.stdout
    assert cluster.node("c1").run(["ls", "-A", f"{top}/state/{lockprobe.PROBE_DIR}"]).stdout == ""


_NAMESPACE_OF = 'for file in "$@"; do stat -L -c %i "/proc/$(cat "$file")/ns/pid"; done'


@pytest.mark.parametrize("start", [sharedfs.start_glusterfs, sharedfs.start_cephfs], ids=FILESYSTEMS)
def test_every_daemon_runs_inside_its_node_and_stop_leaves_nothing(cluster, glusterfs, cephfs, start):
    # A filesystem of its own on the login node (server and client), which the session's two
    # do not use: stopping it must not touch theirs.
    login = cluster.node("login")
    fs = start(cluster, login, [login])
    try:
        pid_files = [pid_file for _name, pid_file in fs.servers + fs.clients]
        inodes = login.run(["sh", "-ec", _NAMESPACE_OF, "-", *pid_files]).stdout.split()
        # Every daemon is in the node's pid namespace, so the node's end is theirs too.
        assert inodes == [str(login.namespaces["pid"])] * len(pid_files)
        login.write(f"{fs.mountpoint}/probe", "here\n")
        # Nothing of it is mounted in the machine's own mount namespace, which runs this test.
        here = Path("/proc/self/mountinfo").read_text()
        assert fs.mountpoint not in here
        assert "gsyncd" not in here
        pids = login.run(["sh", "-ec", 'cat "$@"', "-", *pid_files]).stdout.split()
    finally:
        sharedfs.stop(cluster, fs)
    assert fs.mountpoint not in login.read("/proc/self/mountinfo")
    assert "gsyncd" not in login.read("/proc/self/mountinfo")
    for pid in pids:
        assert login.run(["kill", "-0", pid], check=False).returncode != 0, pid
    # The session's two still serve their nodes.
    for session in (glusterfs, cephfs):
        name = f"{session.mountpoint}/after-{uuid.uuid4().hex[:8]}"
        cluster.node("b1").write(name, "still here\n")
        assert cluster.node("c2").read(name) == "still here\n"
