# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filesystem primitives of the staged rebuild: the directory exchange, durable replaces of
files (``durable_replace`` and its two thin users), ``O_NOFOLLOW`` opens, symlink checks and
the live-change record.

Standard library only; nothing runs at import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import platform
import stat
from typing import IO, Any, Callable, Iterator, List, Optional, Tuple

from ..common import errors

# From include/uapi/linux/fs.h.
RENAME_EXCHANGE = 1 << 1
_AT_FDCWD = -100

# renameat2 syscall numbers, for a C library older than glibc 2.28 that lacks the wrapper.
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "riscv64": 276}

_renameat2_cache: List[Optional[Callable[..., int]]] = []


def _syscall_renameat2(libc, number):
    """renameat2 through ``syscall(2)``, for a C library that lacks the wrapper."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    def renameat2(olddir, old, newdir, new, flags):
        return syscall(
            ctypes.c_long(number),
            ctypes.c_int(olddir),
            ctypes.c_char_p(old),
            ctypes.c_int(newdir),
            ctypes.c_char_p(new),
            ctypes.c_uint(flags),
        )

    return renameat2


def _load_renameat2():
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        func.restype = ctypes.c_int
        return func
    number = _SYS_RENAMEAT2.get(platform.machine())
    return None if number is None else _syscall_renameat2(libc, number)


def _renameat2():
    """The renameat2 callable (or None), loaded on first use rather than at import."""
    if not _renameat2_cache:
        _renameat2_cache.append(_load_renameat2())
    return _renameat2_cache[0]


def rename_exchange(path_a, path_b):
    """Swap the names ``path_a`` and ``path_b`` in one step (``renameat2(RENAME_EXCHANGE)``).

    Both names must exist. Raises ``OSError`` with the kernel's errno: ``EXDEV`` across
    mounts, ``EINVAL`` where the filesystem cannot exchange (FUSE, overlay lower layers),
    ``ENOSYS`` where neither the C library nor the syscall table offers renameat2. Callers
    pick their fallback from that errno.
    """
    func = _renameat2()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path_a, None, path_b)
    if func(_AT_FDCWD, os.fsencode(path_a), _AT_FDCWD, os.fsencode(path_b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path_a, None, path_b)


# What a filesystem answers when it has no way to flush a directory: nothing was tried, so
# nothing failed (see fsync_dir). ENOTSUP and EOPNOTSUPP are one value on Linux, two elsewhere.
DIR_SYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


def fsync_dir(path) -> None:
    """Flush the directory ``path`` itself, so that renames and creations in it survive a crash.

    ``fsync`` of a file makes its bytes durable, not the name that points at it; only an
    ``fsync`` of the directory commits the entry.

    The rule for filesystems that refuse (borg's ``sync_dir``, widened by one errno):
    ``EINVAL`` is what Linux answers when a directory has no fsync operation at all (procfs
    and sysfs; borg names network filesystems that do it; bindfs, measured, flushes), and
    ``EOPNOTSUPP``/``ENOTSUP`` is a filesystem or its daemon saying the same in other words.
    Nothing was tried, so nothing failed: the entry is as durable as that filesystem makes
    it, and no retry or undo can do better, so these return quietly instead of raising.
    Every other errno is raised, since the flush was tried and may not have happened:
    ``EIO``, ``ENOSPC`` and ``EDQUOT`` are lost writeback, and ``EROFS`` is what ext4
    answers once its journal has aborted (``errors=remount-ro``), which is exactly when a
    rename may not be on disk. Opening
    ``path`` raises ``OSError`` as usual (``ENOTDIR`` for a file, ``ENOENT``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in DIR_SYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def open_nofollow(path, flags, mode=0o600):
    """``os.open`` that refuses a symlink as the last component of ``path``; returns the fd.

    ``O_NOFOLLOW`` closes the window between checking a name and opening it: a link planted
    at a state file or a lock cannot redirect the open. ``O_CLOEXEC`` keeps the descriptor
    out of children, which matters for the lock sidecar (closing any descriptor of that inode
    drops the process's record locks). A link, which the kernel reports as ``ELOOP`` (or as
    ``ENOTDIR`` under ``O_DIRECTORY``), becomes ``UsageError`` naming ``path``; other errors
    stay ``OSError``.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        refused_link = err.errno == errno.ELOOP or (
            err.errno == errno.ENOTDIR and flags & os.O_DIRECTORY and os.path.islink(path)
        )
        if refused_link:
            raise errors.UsageError(f"{os.fspath(path)} is a symbolic link; refusing to follow it") from None
        raise


def read_regular(path, what="file") -> bytes:
    """The bytes of the regular file ``path``, read without following a link or blocking.

    ``O_NONBLOCK`` makes opening a FIFO return at once, and ``fstat`` on the opened file then
    refuses it, a socket's stand-in, a device or a directory, each with one line naming
    ``what`` and ``path``. A missing file stays ``FileNotFoundError``.
    """
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise errors.UsageError(f"{what} {os.fspath(path)} is not a regular file")
        return handle.read()


def _refuse_symlink(path, what):
    if os.path.islink(path):
        raise errors.UsageError(f"{what} {os.fspath(path)} is a symbolic link; refusing to replace it")


# O_EXCL with O_NOFOLLOW: a name that exists, even as a dangling symlink or a FIFO, is never
# opened; O_CLOEXEC: no child (a --prepare program, EasyBuild) inherits the half-written file.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_ATTEMPTS = 8
# Room for the dot, the random part and ".tmp" within a file name of 255 bytes.
_TEMP_STEM_CHARS = 64


def _create_temp(directory: str, name: str) -> Tuple[int, str]:
    """Create an unused, unpredictable name in ``directory``: (descriptor, path), mode 0600."""
    for _attempt in range(_TEMP_ATTEMPTS):
        temp = os.path.join(directory, f".{name[:_TEMP_STEM_CHARS]}.{os.urandom(8).hex()}.tmp")
        try:
            return os.open(temp, _TEMP_FLAGS, 0o600), temp
        except FileExistsError:
            continue  # 64 random bits taken already: someone is filling the directory; try again
    raise FileExistsError(errno.EEXIST, f"no unused temporary name for {name} in {directory}")


@contextlib.contextmanager
def durable_replace(
    path, mode: Optional[int] = 0o644, *, text: bool = False, encoding: str = "utf-8"
) -> Iterator[IO[Any]]:
    """``with durable_replace(path) as stream:`` write the new contents of ``path`` to ``stream``;
    at the end of the block they replace the file, so that a reader or a crash sees either the
    old contents or the new, never a mix, an empty file, or a file without its mode.

    The order is borg's (``platform/base.py``, ``SaveFile``), and every step is there for a
    reason:

    1. A temporary file beside ``path``, random and exclusive as ``mkstemp`` makes it, opened
       ``O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC``. The same directory keeps the final
       ``os.replace`` a rename within one filesystem, which is atomic. A fixed name such as
       ``path + ".tmp"`` could be created in advance as a hard link to another file (which
       this write would then overwrite), as a symlink, or as a FIFO that blocks the open; a
       random name cannot be planted, and ``O_EXCL`` refuses whatever is found there anyway.
    2. The block writes; at its end Python's buffer is flushed into the kernel. ``stream``
       takes bytes, or ``str`` in ``encoding`` with ``text=True``.
    3. ``fchmod`` to ``mode`` (the temp file is created 0600 and the umask does not apply),
       done before the ``fsync`` so that the mode is made durable together with the bytes; a
       ``chmod`` after the ``fsync`` could be lost in a crash and leave 0600 in place. With
       ``mode=None`` the block sets owner, mode and attributes on ``stream.fileno()`` itself
       (``modulefile`` keeps the replaced file's); it should ``stream.flush()`` first, since a
       write after a ``chmod`` clears setuid and setgid bits.
    4. ``fsync`` the file: its bytes and its inode are on disk before any name points at it.
       Without this, a crash after the rename can leave ``path`` naming an empty file.
    5. ``os.replace`` onto ``path``: one rename, so readers see the old or the new inode.
    6. ``fsync`` the directory (``fsync_dir``, with its rule for filesystems that cannot): the
       rename itself is durable when the block ends, which is what a journal written next
       relies on.

    On any error up to and including the rename, raised in the block or by a step
    (``BaseException`` too: an interrupt, ``Terminated``), the temporary file is closed and
    unlinked and the error raised again; ``path`` is untouched. An error in step 6 is
    raised with the new contents already in place but not known to be durable.

    A symlink at ``path`` is refused with ``UsageError`` before anything is created:
    ``os.replace`` would replace the link, not its target, and a link there means someone
    else arranged the name. Symlinks in the directories above are the caller's check
    (``refuse_symlink_components``).
    """
    _refuse_symlink(path, "target")
    directory, name = os.path.split(os.path.abspath(path))
    fd, temp = _create_temp(directory, name)
    try:
        stream = os.fdopen(fd, "w" if text else "wb", encoding=encoding if text else None)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    try:
        with stream:
            yield stream
            stream.flush()
            if mode is not None:
                os.fchmod(stream.fileno(), mode)
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_dir(directory)


def atomic_write(path, data: bytes, mode: int = 0o644) -> None:
    """Replace the file ``path`` with ``data`` (bytes) through ``durable_replace``: the old
    contents or the new, never a mix; ``mode`` whatever the umask. ``TypeError`` for ``str``."""
    with durable_replace(path, mode) as stream:
        stream.write(data)


def atomic_write_json(path, obj, mode: int = 0o644) -> None:
    """``durable_replace`` of ``path`` with ``obj`` as JSON: sorted keys, indented, ending in a newline.

    Sorted keys make two writes of the same state byte-identical, so a journal can be compared
    and diffed; the newline keeps ``cat`` and line tools honest. ``obj`` is serialised before
    anything is created, so an object JSON cannot encode leaves no temporary file behind.
    """
    text = json.dumps(obj, sort_keys=True, indent=2) + "\n"
    with durable_replace(path, mode, text=True) as stream:
        stream.write(text)


def _components(path):
    """The absolute ``path`` as its list of components, without normalising ``..`` away."""
    path = os.fspath(path)
    if not os.path.isabs(path):
        # Not abspath: normalising "link/.." lexically would skip the link the kernel follows.
        path = os.path.join(os.getcwd(), path)
    return [part for part in path.split("/") if part not in ("", ".")]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir_at(parent_fd: int, name: str, where: str) -> int:
    """The directory ``name`` in ``parent_fd``, never through a link: a component swapped for
    a symlink after any check fails here, with one line naming ``where``."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise errors.UsageError(
                f"{where} is not a directory (a symbolic link?); refusing to follow it"
            ) from None
        raise


def open_dir_chain(root: str, relative: str) -> int:
    """``root/relative`` opened component by component from ``root``; the caller closes it.

    ``root`` itself is trusted, as ``refuse_symlink_components``'s ``stop_at`` is (a site may
    keep its software root behind a link); every component below it is opened without
    following one."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = root
    try:
        for name in [part for part in relative.split("/") if part not in ("", ".")]:
            if name == "..":
                raise errors.UsageError(f"{os.path.join(root, relative)} leaves {root}")
            where = os.path.join(where, name)
            child = open_dir_at(fd, name, where)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_tree_at(parent_fd: int, name: str, where: str) -> None:
    """Remove the directory ``name`` in ``parent_fd`` and all it holds, by descriptors only.

    Every directory is opened relative to the one above it without following a link, and
    emptied through its own descriptor, so no name is resolved again after a check: a link
    swapped in anywhere makes the removal fail and never reaches another tree. A sealed
    directory (no owner write, ``--read-only-installdir``) gets its write bit back first.
    """
    fd = open_dir_at(parent_fd, name, where)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & (stat.S_IWUSR | stat.S_IXUSR) != stat.S_IWUSR | stat.S_IXUSR:
            os.fchmod(fd, mode | stat.S_IWUSR | stat.S_IXUSR)
        with os.scandir(fd) as entries:
            children = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for child, is_dir in children:
            if is_dir:
                remove_tree_at(fd, child, os.path.join(where, child))
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def refuse_symlink_components(path, stop_at=None):
    """Raise ``UsageError`` naming the first component of ``path`` that is a symbolic link.

    Components are checked from ``/``, or from below ``stop_at`` when given (``stop_at``
    itself is trusted: a site may keep its software root behind a link). Every existing
    prefix is checked, so a link is refused even when the path's tail does not exist yet
    (a module file about to be written, a state root about to be created); the first missing
    prefix ends the walk. ``..`` is walked as written rather than normalised away, because the
    kernel resolves it after following the link before it. A ``path`` outside ``stop_at`` is
    refused; a prefix that cannot be examined (other than missing) is refused too, since it
    cannot be shown to be safe.
    """
    parts = _components(path)
    start = 0
    if stop_at is not None:
        root = _components(stop_at)
        if parts[: len(root)] != root:
            raise errors.UsageError(f"{os.fspath(path)} is not under {os.fspath(stop_at)}")
        start = len(root)
    for depth in range(start + 1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:depth])
        try:
            info = os.lstat(prefix)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return
            raise errors.UsageError(f"cannot check {prefix} for symbolic links: {err.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise errors.UsageError(
                f"{prefix} is a symbolic link (in {os.fspath(path)}); symlink components are refused"
            )


_CHUNK = 1 << 20


def _file_digest(path):
    # O_NOFOLLOW and the fstat re-check: the entry was a regular file when listed, but a tree
    # that changes under the walk must not make it follow a new link or block on a new FIFO.
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _other(info)
        digest = hashlib.sha256()
        chunk = os.read(fd, _CHUNK)
        while chunk:
            digest.update(chunk)
            chunk = os.read(fd, _CHUNK)
        return "sha256:" + digest.hexdigest()
    finally:
        os.close(fd)


def _other(info):
    return f"other:{stat.S_IFMT(info.st_mode):o}"


def _entry_digest(path, info):
    if stat.S_ISLNK(info.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    if stat.S_ISREG(info.st_mode):
        return _file_digest(path)
    return _other(info)


def tree_digest(root):
    """The live-change record of the tree ``root``: relative path -> what is there.

    Values: ``"sha256:<hex>"`` of a regular file's contents, ``"link:<target>"`` for a
    symbolic link (never followed, so a link out of the tree is recorded, not read), ``"dir"``
    for a directory, and ``"other:<octal file type>"`` for a FIFO, socket or device (never
    opened: reading a FIFO would block). ``root`` itself is not an entry. Keys use ``/`` and
    come sorted. ``root`` must be a real directory (``UsageError`` otherwise); an entry that
    cannot be read raises ``OSError``, since a record with holes would hide a change.
    """
    root = os.fspath(root)
    try:
        root_info = os.lstat(root)
    except FileNotFoundError:
        raise errors.UsageError(f"{root} does not exist; cannot record its contents") from None
    if not stat.S_ISDIR(root_info.st_mode):
        raise errors.UsageError(f"{root} is not a directory (or is a symbolic link)")
    record = {}
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(os.path.join(root, relative)) as entries:
            for entry in entries:
                name = relative + "/" + entry.name if relative else entry.name
                info = entry.stat(follow_symlinks=False)
                record[name] = _entry_digest(entry.path, info)
                if record[name] == "dir":
                    pending.append(name)
    return {name: record[name] for name in sorted(record)}


def changed_paths(before, after):
    """Sorted relative paths added, removed or changed between two ``tree_digest`` records."""
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
