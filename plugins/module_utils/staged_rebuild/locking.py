# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The state-root lock of eb-staged-rebuild: a flock on ``.lock``, then a POSIX record lock
on the sidecar ``.lock.posix``.

Protocol (the design's "Lock, resume, rollback, and collection"):

1. ``<state_root>/.lock`` is opened and locked with ``flock(LOCK_EX)``. flock belongs to the
   open file description, so it excludes every other process and every other open of the
   file in this process, on this kernel. It does not reach other nodes.
2. Only while that flock is held, ``<state_root>/.lock.posix`` is opened and locked with an
   exclusive POSIX record lock (``fcntl.lockf`` = ``F_SETLK``). Where the filesystem keeps
   POSIX locks coherent, this is what excludes other nodes. flock and POSIX locks never
   conflict with each other, hence two files and two lock calls.
3. ``pid hostname`` is written into ``.lock`` so that a refused run can name the holder.
4. Release runs backwards: clear the holder record, close the sidecar (closing is what drops
   a POSIX lock), then ``flock(LOCK_UN)`` and close ``.lock``.

Both waits poll with backoff against one deadline, ``timeout`` seconds after the start
(``common.lockwait``, whose contention errnos are filelock's); ``timeout=0`` tries once,
``None`` waits without limit. Neither file is ever unlinked: a waiter blocked on the old
inode and a newcomer on a new one would both "hold" the lock (filelock's ``_unix.py``
rule). Both are opened with ``O_NOFOLLOW``, so a symbolic link planted at either name is
refused instead of creating or locking its target.

The hazard this module guards against: the kernel drops ALL of a process's POSIX locks on a
file when the process closes ANY descriptor of that file, however it was opened (another
name, a hard link, a symlink). So, like spack's ``llnl/util/lock.py`` with its tracker of
open files, this module keeps a registry of the sidecars this process holds, keyed by
``(st_dev, st_ino)``:

- a second ``StateLock`` for the same state root in the same process raises ``LockError``
  at once, before it opens anything; the lock is not re-entrant and is not shared between
  threads (flock alone would make a second thread wait, but the registry refuses first);
- other code calls ``refuse_held_sidecar(path)`` before it opens a file under a state root,
  and so never holds a second descriptor of the sidecar.

Children: both descriptors carry ``O_CLOEXEC``, so an exec'd program never inherits them
(``subprocess`` also closes them by default, ``close_fds=True``; ``O_CLOEXEC`` covers
``close_fds=False`` and ``os.exec*``). A child forked without exec (``os.fork``,
multiprocessing's ``fork`` context) closes its inherited copies in an at-fork hook. That
never releases the parent's locks: POSIX locks are not inherited, and a flock lives until
its last descriptor is closed or ``LOCK_UN`` is called, which only the parent does.

Standard library only; nothing runs at import time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Callable, Dict, List, Optional, Tuple

from ..common import errors, lockwait
from ..common.deadline import Deadline
from ..common.errors import setting

LOCK_NAME = ".lock"
SIDECAR_NAME = ".lock.posix"

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_HOLDER_BYTES = 512

# (st_dev, st_ino) of a sidecar -> the StateLock of this process that holds it. Only the
# holder of the matching flock adds or removes its key, so no thread lock is needed.
_held: Dict[Tuple[int, int], StateLock] = {}
_fork_hook: List[Callable[[], None]] = []


def refuse_held_sidecar(path):
    """Raise ``LockError`` if ``path`` names the sidecar of a lock this process holds.

    Call it before opening a file under a state root. Opening the sidecar is harmless;
    closing that descriptor later would silently drop the record lock that excludes other
    nodes. The check compares inodes with the link followed, as ``open`` would, so a hard
    link or a symbolic link to the sidecar is refused too. A path that cannot be examined
    (missing, say) is not the held sidecar and passes.
    """
    try:
        info = os.stat(path)
    except OSError:
        return
    holder = _held.get((info.st_dev, info.st_ino))
    if holder is not None:
        raise errors.LockError(
            f"{os.fspath(path)} is the lock sidecar {holder.sidecar_path} held by this process; "
            "closing a second descriptor of it would drop the lock"
        )


def recorded_holder(state_root):
    """The holder written into ``<state_root>/.lock``: ``{"pid": int, "host": str}``, or None
    when there is no readable record.

    The record is advisory text: present while a run holds the lock, cleared at release, and
    left behind only by a run that died holding it (or absent when a flock-only publisher
    from 0.2.0 holds the lock, since it never writes one).
    """
    path = os.path.join(os.fspath(state_root), LOCK_NAME)
    try:
        # O_NONBLOCK: a FIFO planted at the name must not hang a status query.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _parse_holder(os.pread(fd, _HOLDER_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


def _parse_holder(data):
    fields = data.decode("utf-8", "replace").split("\n", 1)[0].split()
    if len(fields) != 2 or not fields[0].isdigit():
        return None
    return {"pid": int(fields[0]), "host": fields[1]}


def _describe_holder(data):
    holder = _parse_holder(data)
    if holder is None:
        return "holder not recorded"
    return f"recorded holder pid {holder['pid']} on {holder['host']}"


def _forget_in_child():
    # Runs in a child forked without exec. Closing its copies leaves the parent's locks
    # alone (see the module docstring); LOCK_UN here would release the parent's flock.
    for lock in list(_held.values()):
        lock._close_inherited()
    _held.clear()


def _install_fork_hook():
    if not _fork_hook:
        os.register_at_fork(after_in_child=_forget_in_child)
        _fork_hook.append(_forget_in_child)


def _attempt(take: Callable[[int], bool], fd: int, what: str) -> Callable[[], bool]:
    """One try of ``take`` (``lockwait.try_flock`` or ``try_record_lock``) for ``lockwait.poll``;
    a failure other than contention becomes ``LockError`` naming ``what`` was tried."""

    def attempt() -> bool:
        try:
            return take(fd)
        except OSError as err:
            raise errors.LockError(f"cannot {what}: {err.strerror}") from None

    return attempt


# GlusterFS's FUSE client can answer EEXIST to an open with O_CREAT but without O_EXCL when
# another client creates the same name at that moment; the file is there then, so the open is
# made again. Bounded: a name that keeps answering EEXIST is reported as it is.
_CREATE_RACE_ATTEMPTS = 5


def open_creating(path, flags, mode):
    """``os.open(path, flags, mode)`` with ``O_CREAT`` in ``flags``, made again while a
    concurrent creation on a shared filesystem answers ``EEXIST``."""
    for _attempt in range(_CREATE_RACE_ATTEMPTS - 1):
        try:
            return os.open(path, flags, mode)
        except FileExistsError:
            continue
    return os.open(path, flags, mode)


def _open_lock_file(path, state_root):
    """Open (creating, mode 0600) one of the two lock files; returns the descriptor.

    ``O_NOFOLLOW``: a symbolic link at the name fails with ``ELOOP`` instead of creating or
    locking whatever it points at. ``O_CLOEXEC``: no exec'd child inherits the descriptor.
    """
    try:
        fd = open_creating(path, _OPEN_FLAGS, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise errors.UsageError(f"lock file {path} is a symbolic link; refusing to follow it") from None
        if err.errno == errno.ENOENT and not os.path.isdir(state_root):
            raise errors.UsageError(f"state root {state_root} does not exist") from None
        raise errors.LockError(f"cannot open lock file {path}: {err.strerror}") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_nlink != 1:
        # Another name for the file: the holder record would be written through it, and
        # opening the sidecar through it and closing that descriptor drops the record lock.
        problem = f"has {info.st_nlink} hard links; a lock file must have one name"
    if problem is not None:
        os.close(fd)
        raise errors.UsageError(f"lock file {path} {problem}")
    return fd


class StateLock:
    """The exclusive lock of one state root, as a context manager: ``with StateLock(root, 0):``.

    ``state_root`` must be an existing directory (the caller creates and checks it).
    ``timeout`` is the whole wait in seconds for both locks together: 0 tries once, None
    waits without limit. Entering raises ``LockError`` when another run holds either lock
    past the deadline (the message says which: flock on this node, or the POSIX lock, held
    from another node or by a publisher that takes only the POSIX half), when this process
    already holds the lock of this state root, or when a lock call fails; ``UsageError`` for a
    symbolic link or a non-regular file at either name or a missing state root. On any
    failure nothing stays locked and no descriptor stays open.
    """

    def __init__(self, state_root, timeout: Optional[float] = 0) -> None:
        # ``timeout`` was checked where it was read (settings.lock_timeout, the lock probe's).
        self.state_root = os.fspath(state_root)
        self.timeout = timeout
        self.lock_path = os.path.join(self.state_root, LOCK_NAME)
        self.sidecar_path = os.path.join(self.state_root, SIDECAR_NAME)
        self._lock_fd: Optional[int] = None
        self._sidecar_fd: Optional[int] = None
        self._sidecar_key: Optional[Tuple[int, int]] = None

    @property
    def held(self):
        """Whether this object holds both locks now (False in a forked child)."""
        return self._sidecar_fd is not None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()

    def acquire(self):
        """Take the flock, then the POSIX record lock, within one deadline; record the holder."""
        self._refuse_reentry()
        _install_fork_hook()
        deadline = None if self.timeout is None else Deadline(self.timeout)
        lock_fd = _open_lock_file(self.lock_path, self.state_root)
        try:
            if not lockwait.poll(_attempt(lockwait.try_flock, lock_fd, f"flock {self.lock_path}"), deadline):
                raise errors.LockHeld(self._refusal(lock_fd, f"on this node (flock on {self.lock_path})"))
            sidecar_fd = self._take_sidecar(lock_fd, deadline)
        except BaseException:
            # LOCK_UN rather than relying on close: a child forked meanwhile may share the
            # open file description, and would keep the flock alive.
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
            raise
        self._lock_fd, self._sidecar_fd = lock_fd, sidecar_fd
        info = os.fstat(sidecar_fd)
        self._sidecar_key = (info.st_dev, info.st_ino)
        _held[self._sidecar_key] = self
        try:
            self._write_holder(f"{os.getpid()} {os.uname().nodename}\n".encode())
        except OSError as err:
            self._unlock()
            raise errors.LockError(
                f"cannot record the lock holder in {self.lock_path}: {err.strerror}"
            ) from None

    def release(self):
        """Clear the holder record, close the sidecar, then unlock and close ``.lock``.

        The record is cleared while both locks are still held: once the POSIX lock is gone a
        run on another node may already have written its own. A no-op when not held.
        """
        if self._sidecar_fd is None:
            return
        try:
            self._write_holder(b"")
        finally:
            self._unlock()

    def _unlock(self):
        # The sidecar first: its close drops the record lock, and it must not outlive the flock
        # that made opening it safe.
        if self._sidecar_key is not None:
            _held.pop(self._sidecar_key, None)
        sidecar_fd, self._sidecar_fd = self._sidecar_fd, None
        if sidecar_fd is not None:
            os.close(sidecar_fd)
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)

    def _refuse_reentry(self):
        # Before any open: taking the flock again would wait on ourselves, and opening and
        # closing the sidecar again would drop the record lock we hold.
        try:
            info = os.lstat(self.sidecar_path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) in _held:
            raise errors.LockError(
                f"state root {self.state_root} is already locked by this process (pid {os.getpid()}); "
                "the lock is not re-entrant"
            )

    def _take_sidecar(self, lock_fd, deadline):
        """Open the sidecar and take its POSIX lock; returns its descriptor. Needs the flock."""
        sidecar_fd = _open_lock_file(self.sidecar_path, self.state_root)
        try:
            take = _attempt(
                lockwait.try_record_lock, sidecar_fd, f"take the POSIX record lock on {self.sidecar_path}"
            )
            if not lockwait.poll(take, deadline):
                where = f"through the POSIX lock on {self.sidecar_path} (another node?)"
                raise errors.LockHeld(self._refusal(lock_fd, where))
        except BaseException:
            # This process holds no record lock on the sidecar (the registry said so), so
            # closing it drops nothing.
            os.close(sidecar_fd)
            raise
        return sidecar_fd

    def _refusal(self, lock_fd, where):
        waited = "without limit" if self.timeout is None else f"{self.timeout:g} s"
        return (
            f"state root {self.state_root} is locked by another eb-staged-rebuild run {where}; "
            f"{_describe_holder(os.pread(lock_fd, _HOLDER_BYTES, 0))} "
            f"(waited {waited}; {setting('lock_timeout')} sets the wait)"
        )

    def _write_holder(self, record):
        # Same descriptor as the flock: no second open of .lock is needed, and the file keeps
        # its inode (truncate, never replace).
        lock_fd = self._lock_fd
        if lock_fd is None:  # not held: there is no record of ours to write
            return
        os.ftruncate(lock_fd, 0)
        if record:
            os.pwrite(lock_fd, record, 0)

    def _close_inherited(self):
        for fd in (self._sidecar_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._sidecar_fd = self._lock_fd = self._sidecar_key = None
