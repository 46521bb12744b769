# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Taking a lock without blocking, and waiting for one: one try, and one poll with backoff.

A try is a non-blocking exclusive lock call that answers True (taken) or False (another
holder has it); any other failure is raised as ``OSError`` for the caller to word. What
counts as "another holder" is filelock's set (``src/filelock/_unix.py``) together with the
POSIX record lock's: ``EAGAIN`` and ``EWOULDBLOCK`` (flock, and F_SETLK on Linux) and
``EACCES`` (which POSIX allows F_SETLK to answer instead, as some systems do).

``poll(attempt, deadline)`` repeats a try until it succeeds or the one deadline passes; the
pause doubles from ``first_pause`` up to ``longest_pause``: a quick retry catches a lock
released a moment later, the cap bounds how long a release goes unnoticed. It serves the
state-root lock (``staged_rebuild.locking``), the lock probe's meeting point
(``staged_rebuild.lockprobe``) and the guard's step lock (``arch_guard.cache``); with a fixed
pause, the wait for Slurm's jobs (``staged_rebuild.jobwait``), which nothing announces either.

The guard's step lock is taken by every task of every job step, cache hit or not, so this
module imports only what that path has loaded already (``fcntl``, ``time``); ``errno`` is
imported when a try fails, and ``typing`` (about 17 ms) never at run time.
"""

from __future__ import annotations

import fcntl
import time

TYPE_CHECKING = False  # type checkers take this as True; nothing is imported at run time
if TYPE_CHECKING:
    from typing import Callable, Optional

    from .deadline import Deadline

FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.1


def is_contention(err: OSError) -> bool:
    """Whether a failed non-blocking lock call means that another holder has the lock."""
    import errno  # noqa: PLC0415 (only a failed try needs it; an uncontended lock does without)

    return err.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK)


def try_flock(fd: int) -> bool:
    """One exclusive ``flock`` of ``fd`` without waiting: True when taken, False when held.

    flock belongs to the open file description: another open of the same file, in this
    process or another on this kernel, holds it against this one.
    """
    return _try(fcntl.flock, fd)


def try_record_lock(fd: int) -> bool:
    """One exclusive POSIX record lock (``lockf``, F_SETLK) on ``fd``: True when taken, False
    when another process holds a conflicting one. ``fd`` must be open for writing (EBADF)."""
    return _try(fcntl.lockf, fd)


def _try(lock: Callable[[int, int], object], fd: int) -> bool:
    try:
        lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if is_contention(err):
            return False
        raise
    return True


def poll(
    attempt: Callable[[], bool],
    deadline: Optional[Deadline],
    *,
    first_pause: float = FIRST_PAUSE,
    longest_pause: float = LONGEST_PAUSE,
) -> bool:
    """Call ``attempt()`` until it returns True (then True) or ``deadline`` passes (False).

    ``attempt`` runs at least once, also when the deadline has already passed, so that a
    timeout of 0 (``Deadline(0)``) means "try once"; ``deadline=None`` waits without limit.
    No pause runs past the deadline. An exception from ``attempt`` (a lock call that failed
    for another reason, ``Terminated`` during a pause) reaches the caller.
    """
    pause = first_pause
    while not attempt():
        if deadline is None:
            time.sleep(pause)
        else:
            left = deadline.remaining()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
        pause = min(pause * 2, longest_pause)
    return True
