# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One decision per job step and node: the first task computes it, the others read it.

The cache lives in a directory other users can write to (``/tmp``), so nothing found
there is believed unless it is a regular file of the running uid, mode 0600, with one
link, opened without following a symlink. Anything else means: compute without the cache
and write nothing there. A result is written to a new file (``O_EXCL``) and renamed into
place, so a reader sees a whole file or none. A flock on a lock file beside it makes the
step's other tasks wait for the first one's result instead of computing their own.

This module is on the path every task of a step takes; it imports only what that path needs
(``posix`` and ``_stat``, not ``os`` and ``stat``: see ``lean_os``).
"""

from __future__ import annotations

import _stat
import posix

from ..common import lockwait
from .decision import Decision
from .lean_os import fsdecode, fsencode
from .settings import scratch_dir

TYPE_CHECKING = False  # type checkers take this as True; nothing more is imported at run time
if TYPE_CHECKING:
    from typing import Optional

    from ..common.deadline import Deadline

PREFIX = ".eessi-arch-guard"
# What the decision depends on, besides the node, the step and the output mode.
DIGEST_NAMES = (
    "EESSI_SOFTWARE_SUBDIR",
    "EESSI_ACCEL_SUBDIR",
    "LOADEDMODULES",
    "MODULEPATH",
    "EESSI_INIT_PREFIX",
    "EESSI_PROC_CPUINFO",
    "PATH",
)
FORMAT = b"eessi-arch-guard decision 1"
_COMPONENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# O_NONBLOCK: a FIFO planted at the path must not hold the task until a writer comes.
_OPEN_FLAGS = posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK
# The lock wait polls: 64 tasks of a step wait together for one decision of ~0.5 s, and
# the polls cost each waiting task well under 1 ms of CPU (measured), no reason for a timer.
# Shorter pauses than the state lock's: a waiting task starts late by at most the cap.
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.02
# Random temporary names tried before a publish gives up: 64 random bits each, so only a
# directory that refuses new files (or a bug) exhausts them.
PUBLISH_TRIES = 5


class Untrusted(Exception):
    """Something at the cache's path is not ours to believe; the reason says what."""


class LockTimeout(Exception):
    """The deadline passed while another task held the step's lock."""


def sha256_hex(data: bytes) -> str:
    # hashlib costs milliseconds to import (OpenSSL); the built-in module is what it wraps.
    try:
        from _sha256 import sha256  # noqa: PLC0415 (Python 3.8 to 3.11)
    except ImportError:
        try:
            from _sha2 import sha256  # noqa: PLC0415 (Python 3.12 and later)
        except ImportError:
            from hashlib import sha256  # noqa: PLC0415
    return sha256(data).hexdigest()


def component(value: str) -> str:
    """``value`` as a file-name part: as it is when short and plain, else a hash prefix."""
    if 1 <= len(value) <= 64 and all(char in _COMPONENT_CHARS for char in value):
        return value
    return sha256_hex(fsencode(value))[:16]


def digest(env) -> str:
    joined = b"\0".join(fsencode(env.get(name, "")) for name in DIGEST_NAMES)
    return sha256_hex(joined)[:16]


def path_for(env, mode: str):
    """The cache file of this task's step, node and mode; None outside a Slurm job, and None
    when neither TMPDIR nor /tmp is a trusted directory (``settings.distrust``)."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    scratch = scratch_dir(env)
    if scratch is None:
        return None
    node = env.get("SLURMD_NODENAME") or posix.uname().nodename
    step = env.get("SLURM_STEP_ID") or "batch"
    name = ".".join(
        (PREFIX, str(posix.getuid()), component(node), component(job), component(step), mode, digest(env))
    )
    return f"{scratch}/{name}"


def _check_ours(fd: int, what: str) -> None:
    info = posix.fstat(fd)
    if not _stat.S_ISREG(info.st_mode):
        raise Untrusted(f"{what} is not a regular file")
    if info.st_uid != posix.getuid():
        raise Untrusted(f"{what} belongs to uid {info.st_uid}")
    if _stat.S_IMODE(info.st_mode) != 0o600:
        raise Untrusted(f"{what} has mode {_stat.S_IMODE(info.st_mode):04o}, not 0600")
    if info.st_nlink != 1:
        raise Untrusted(f"{what} has {info.st_nlink} links")


def _open(path: str, flags: int, what: str) -> int:
    try:
        return posix.open(path, flags | _OPEN_FLAGS, 0o600)
    except OSError as err:
        # ELOOP: a symlink stands there, and O_NOFOLLOW refused it.
        raise Untrusted(f"{what} {path} cannot be opened: {err.strerror}") from None


class StepCache:
    """The cache file at ``path`` and its lock, ``path + ".lock"``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock_path = path + ".lock"
        self._lock_fd: Optional[int] = None

    def lock(self, deadline) -> None:
        """Take the step's lock, waiting at most until ``deadline``.

        Raises Untrusted (no cache for this task) or LockTimeout.
        """
        fd = _open(self.lock_path, posix.O_RDWR | posix.O_CREAT, "the lock")
        try:
            _check_ours(fd, f"the lock {self.lock_path}")
            if not _flock_until(fd, deadline):
                raise LockTimeout(f"{self.lock_path} still held after {deadline.seconds:g} s")
        except BaseException:
            posix.close(fd)
            raise
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            posix.close(self._lock_fd)
            self._lock_fd = None

    def read(self):
        """The stored decision, or None when there is none yet; Untrusted otherwise."""
        try:
            fd = posix.open(self.path, posix.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise Untrusted(f"the cache file {self.path} cannot be opened: {err.strerror}") from None
        try:
            _check_ours(fd, f"the cache file {self.path}")
            data = b""
            while True:
                chunk = posix.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
        finally:
            posix.close(fd)
        return decode(data, self.path)

    def publish(self, decision: Decision) -> None:
        """Write ``decision`` beside the cache file and rename it into place.

        The temporary name is random (``<cache>.<16 hex digits>.new``): a predictable one lets
        anyone who can write to the directory plant a name at it and make every publish of a
        step fail, and each task then computes on its own under the step's lock. A name taken
        already (EEXIST: a file or a planted link, never followed) is retried under another,
        ``PUBLISH_TRIES`` times in all; then FileExistsError.
        """
        data = encode(decision)
        for _try in range(PUBLISH_TRIES):
            temporary = f"{self.path}.{posix.urandom(8).hex()}.new"
            try:
                fd = posix.open(temporary, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | _OPEN_FLAGS, 0o600)
            except FileExistsError:
                continue
            try:
                # The umask may have taken bits away; readers insist on exactly 0600.
                posix.fchmod(fd, 0o600)
                left = data
                while left:
                    left = left[posix.write(fd, left) :]
            except BaseException:
                posix.close(fd)
                posix.unlink(temporary)
                raise
            posix.close(fd)
            try:
                posix.rename(temporary, self.path)
            except OSError:
                posix.unlink(temporary)
                raise
            return
        raise FileExistsError(f"no free temporary name beside {self.path} in {PUBLISH_TRIES} tries")


def _flock_until(fd: int, deadline: Deadline) -> bool:
    """Take an exclusive flock on ``fd``; False when the deadline passes first."""
    return lockwait.poll(
        lambda: lockwait.try_flock(fd), deadline, first_pause=_FIRST_PAUSE, longest_pause=_LONGEST_PAUSE
    )


def _field(text: str) -> bytes:
    return fsencode(text.replace("\0", "?"))


def encode(decision: Decision) -> bytes:
    """NUL-separated: values from an environment cannot hold NUL, and no parser is needed."""
    fields = [FORMAT, _field(decision.action), _field(decision.detail), _field(decision.message)]
    for name, value in decision.changes:
        fields.append(fsencode(name))
        fields.append(b"-" if value is None else b"=" + fsencode(value))
    return b"\0".join(fields) + b"\0"


def decode(data: bytes, path: str) -> Decision:
    fields = data.split(b"\0")
    if len(fields) < 5 or fields[0] != FORMAT or fields.pop() != b"" or (len(fields) - 4) % 2:
        raise Untrusted(f"the cache file {path} is not a decision of this version")
    action, detail, message = (fsdecode(field) for field in fields[1:4])
    changes = []
    for index in range(4, len(fields), 2):
        name, value = fields[index], fields[index + 1]
        if not name or not (value == b"-" or value.startswith(b"=")):
            raise Untrusted(f"the cache file {path} has a malformed change")
        changes.append((fsdecode(name), None if value == b"-" else fsdecode(value[1:])))
    return Decision(action, detail, changes, message)
