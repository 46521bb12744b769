"""``ansible-playbook hpcstack.ops.probe``: the path probe on every host and the state-root
lock contended by two inventory hosts at once, both this machine (``ansible_connection=local``).

Sharing one state root, the two hosts share one kernel and one file: the lock excludes and the
table says so. Through two bindfs mounts of one directory (no lock forwarding) each host has
its own inode of the lock files, as two nodes whose filesystem does not pass locks on: the
data is shared, the locks are not, and the probe must report that two hosts held the lock at
once. With bindfs's lock forwarding the same two mounts are coherent again.
"""

from __future__ import annotations

import re

from localplay import LocalPlaybooks
from tests.integration.harness.mounts import bindfs_mount

HOSTS = ("node1", "node2")


def _probe(tmp_path, state_roots, live):
    inventory = tmp_path / "hosts.ini"
    lines = ["[build_hosts]"]
    lines += [f"{host} staged_state_root={root}" for host, root in zip(HOSTS, state_roots)]
    inventory.write_text("\n".join(lines) + "\n")
    playbooks = LocalPlaybooks(tmp_path / "ansible", {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    return playbooks.run(
        "probe", "-e", f"staged_probe_path={live}", "-e", "staged_probe_rounds=15", inventory=str(inventory)
    )


def _rows(play):
    """host -> the table's columns for it."""
    table = re.findall(r'^\s+"(node\d .*)",?$', play.stdout, re.M)
    return {line.split()[0]: line.split()[1:] for line in table if len(line.split()) == 7}


def test_two_hosts_sharing_a_state_root_on_one_kernel_find_the_lock_coherent(tmp_path):
    state_root, live = tmp_path / "state", tmp_path / "software"
    state_root.mkdir()
    live.mkdir()

    play = _probe(tmp_path, [state_root, state_root], live)

    assert (play.done.returncode, play.failed, play.changed) == (0, 0, 0), play.output
    rows = _rows(play)
    assert sorted(rows) == list(HOSTS), play.stdout
    for columns in rows.values():
        # filesystem, exchange, bwrap, userns, auto backend, lock
        assert columns[1:] == ["True", "True", "True", "bwrap", "yes"], play.stdout
    assert "lock: coherent across node1, node2" in play.stdout
    assert list((state_root / "lock-probe").iterdir()) == []


def test_two_hosts_whose_mounts_do_not_pass_locks_on_are_reported_incoherent(tmp_path):
    backing, live = tmp_path / "backing", tmp_path / "software"
    backing.mkdir()
    live.mkdir()
    with bindfs_mount(backing, tmp_path / "view1") as view1, bindfs_mount(
        backing, tmp_path / "view2"
    ) as view2:
        play = _probe(tmp_path, [view1, view2], live)

    assert (play.done.returncode, play.failed) == (0, 0), play.output
    assert [columns[-1] for columns in _rows(play).values()] == ["NO", "NO"], play.stdout
    assert "lock: NOT coherent across node1, node2: two hosts held it at once" in play.stdout


def test_the_same_mounts_with_lock_forwarding_are_coherent(tmp_path):
    backing, live = tmp_path / "backing", tmp_path / "software"
    backing.mkdir()
    live.mkdir()
    # bindfs forwards locks only when it serves requests on several threads.
    forward = ("--multithreaded", "--enable-lock-forwarding")
    with bindfs_mount(backing, tmp_path / "v1", *forward) as one, bindfs_mount(
        backing, tmp_path / "v2", *forward
    ) as two:
        play = _probe(tmp_path, [one, two], live)

    assert (play.done.returncode, play.failed) == (0, 0), play.output
    assert [columns[-1] for columns in _rows(play).values()] == ["yes", "yes"], play.stdout
    assert "lock: coherent across node1, node2" in play.stdout
