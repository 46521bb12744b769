# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does the state-root lock exclude across hosts? Each host contends for it and looks.

The lock is a flock, which reaches only the processes of one kernel, then a POSIX record
lock on the sidecar, which must reach the other nodes through the filesystem. Whether a
site's filesystem does that is measured here, with the real lock: several hosts take it in
turn, and inside it each host finds a marker file empty, writes its own name, holds the
lock a moment and finds its own name still there. Anything else means another host was
inside at the same time. No clocks are compared.

The hosts meet first: each writes its name into ``lock-probe/<probe id>/ready/`` and waits
until ``participants`` names are there, so that they contend at the same time. Each writes
its name into ``done/`` at the end, and the last one removes the probe's directory.
"""

from __future__ import annotations

import math
import os
import shutil
import time

from ..common import errors, lockwait
from ..common.deadline import Deadline
from . import fsutil, locking, paths

PROBE_DIR = "lock-probe"
MARKER = "holder"
# The others read the ready directory through their own caches: no need to look more often.
_LONGEST_PAUSE = 0.05
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def contend(state_root, host, probe_id, participants, *, rounds=20, hold_seconds=0.05, wait_seconds=60.0):
    """Contend for ``state_root``'s lock ``rounds`` times with ``participants`` hosts in all.

    Returns ``{host, probe_id, participants, rounds, overlaps, coherent}``; ``overlaps`` lists
    what this host found in the marker instead of nothing or its own name.
    """
    paths.check_run_id(probe_id)
    paths.check_run_id(host)
    seconds = (hold_seconds, wait_seconds)
    if participants < 1 or rounds < 1 or any(value < 0 or math.isnan(value) for value in seconds):
        raise errors.UsageError(
            "the lock probe needs participants >= 1, rounds >= 1, hold_seconds >= 0 and wait_seconds >= 0"
        )
    if not os.path.isdir(state_root):
        raise errors.UsageError(
            f"state root {state_root} is not a directory (the build_host role creates it)"
        )
    root = os.path.join(state_root, PROBE_DIR, probe_id)
    for sub in ("ready", "done"):
        fsutil.refuse_symlink_components(os.path.join(root, sub))
    _make_meeting_place(root, wait_seconds)
    _write(os.path.join(root, "ready", host), host)
    _meet(os.path.join(root, "ready"), participants, wait_seconds)
    overlaps = []
    for _round in range(rounds):
        with locking.StateLock(state_root, wait_seconds):
            overlaps.extend(_hold(os.path.join(root, MARKER), host, hold_seconds))
        # Out of the lock for a moment, so that the others get their turns.
        time.sleep(hold_seconds / 2)
    with locking.StateLock(state_root, wait_seconds):
        _write(os.path.join(root, "done", host), host)
        if len(os.listdir(os.path.join(root, "done"))) >= participants:
            # A leftover directory is harmless; failing the finished probe over it is not.
            shutil.rmtree(root, ignore_errors=True)
    return {
        "host": host,
        "probe_id": probe_id,
        "participants": participants,
        "rounds": rounds,
        "overlaps": overlaps,
        "coherent": not overlaps,
    }


def _make_meeting_place(root: str, wait_seconds: float) -> None:
    """Create ``root``'s ``ready`` and ``done``, which every host creates at the same moment.

    On a filesystem whose clients cache lookups (GlusterFS), the host that loses the race for
    ``root`` gets EEXIST, and then ENOENT creating ``ready`` inside it until its client sees
    the winner's directory: that is tried again, until ``wait_seconds``."""

    def made() -> bool:
        try:
            for sub in ("ready", "done"):
                os.makedirs(os.path.join(root, sub), mode=0o700, exist_ok=True)
        except FileNotFoundError:
            return False
        return True

    if not lockwait.poll(made, Deadline(wait_seconds), longest_pause=_LONGEST_PAUSE):
        raise errors.LockError(
            f"the lock probe could not create {root}/ready in {wait_seconds:g} s: another host made "
            f"{root}, and this one does not see it (does this host see the state root's changes?)"
        )


def _hold(marker, host, hold_seconds):
    """One turn inside the lock: what was found there that should not have been."""
    found = []
    before = _read(marker)
    if before:
        found.append(before)
    _write(marker, host)
    time.sleep(hold_seconds)
    after = _read(marker)
    if after != host:
        found.append(after or "(emptied)")
    _write(marker, "")
    return found


def _meet(ready_dir: str, participants: int, wait_seconds: float) -> None:
    arrived = [0]

    def everyone_is_there() -> bool:
        arrived[0] = len(os.listdir(ready_dir))
        return arrived[0] >= participants

    if not lockwait.poll(everyone_is_there, Deadline(wait_seconds), longest_pause=_LONGEST_PAUSE):
        raise errors.LockError(
            f"the lock probe waited {wait_seconds:g} s for {participants} hosts in {ready_dir}; "
            f"{arrived[0]} arrived (do all of them see this directory?)"
        )


def _read(path):
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return ""
    try:
        return os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _write(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS, 0o600)
    try:
        os.write(fd, text.encode())
        # Through to the filesystem: the other hosts read it through their own caches.
        os.fsync(fd)
    finally:
        os.close(fd)
