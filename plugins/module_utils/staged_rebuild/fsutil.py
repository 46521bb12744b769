# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filesystem primitives of the staged rebuild by path: durable replaces of files
(``durable_replace`` and ``atomic_write``), ``O_NOFOLLOW`` opens, symlink checks, renames,
removals and directories made below a root, and the live-change record. Each goes through
``Directory`` (``common/dirfd.py``, shared with the arch_guard role): every mutation of a tree
made through directory descriptors opened from a root checked once, without following a link.
The names of ``dirfd`` the staged tool uses are reached here too (``fsutil.Directory``).

Standard library only; nothing runs at import time.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from typing import IO, Any, Iterator, Optional

from ..common import errors

# The staged tool's modules name these fsutil.X.
from ..common.dirfd import (  # noqa: F401  # pylint: disable=unused-import
    DIR_SYNC_UNSUPPORTED,
    RENAME_EXCHANGE,
    Directory,
    _components,
    fsync_dir_fd,
    open_dir_at,
    parent_of,
    read_regular,
    remove_tree_at,
    rename_exchange,
)


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
        fsync_dir_fd(fd)
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


@contextlib.contextmanager
def durable_replace(
    path, mode: Optional[int] = 0o644, *, text: bool = False, encoding: str = "utf-8", root=None
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

    Every step is made relative to the descriptor of ``path``'s directory, opened once
    (``Directory.open``): below ``root``, when given, without following a link, so a
    directory swapped for a link meanwhile makes it fail instead of writing elsewhere.

    On any error up to and including the rename, raised in the block or by a step
    (``BaseException`` too: an interrupt, ``Terminated``), the temporary file is closed and
    unlinked and the error raised again; ``path`` is untouched. An error in step 6 is
    raised with the new contents already in place but not known to be durable.

    A symlink at ``path`` is refused with ``UsageError`` before anything is created:
    ``os.replace`` would replace the link, not its target, and a link there means someone
    else arranged the name.
    """
    directory, name = parent_of(path, root)
    try:
        with directory.replace(name, mode, text=text, encoding=encoding) as stream:
            yield stream
    finally:
        os.close(directory.fd)


def atomic_write(path, data: bytes, mode: int = 0o644, root=None) -> None:
    """Replace the file ``path`` with ``data`` (bytes) through ``durable_replace``: the old
    contents or the new, never a mix; ``mode`` whatever the umask. ``TypeError`` for ``str``."""
    with durable_replace(path, mode, root=root) as stream:
        stream.write(data)


def rename(source, destination, root) -> None:
    """A durable rename of ``source`` to ``destination``, both below ``root``: each parent
    opened from ``root`` without following a link, the rename made between the two
    descriptors, then both flushed."""
    source_dir, source_name = parent_of(source, root)
    with source_dir:
        destination_dir, destination_name = parent_of(destination, root)
        with destination_dir:
            source_dir.rename(source_name, destination_dir, destination_name)
            destination_dir.sync()
            source_dir.sync()


def lstat_below(path, root) -> Optional[os.stat_result]:
    """What is at ``path`` (a link not followed), or None, with every directory between
    ``root`` and it opened without following a link: a decision read from the disk (is the
    staged tree live? is the module file the new one?) is made on this tree, never on one a
    swapped-in link points to, where the answer could be "nothing to do"."""
    directory, name = parent_of(path, root)
    with directory:
        return directory.lstat(name)


def makedirs(path, root, mode: int = 0o755) -> None:
    """``os.makedirs(path, mode, exist_ok=True)`` below ``root``, by descriptors: a component
    that is a link is refused, never made through (``Directory.open``'s ``create_mode``)."""
    with Directory.open(path, root, create_mode=mode):
        pass


def remove_tree(path, root=None) -> None:
    """Remove the directory ``path`` and all it holds, by descriptors from ``root`` down
    (``Directory.open``, then ``remove_tree_at``): a link swapped in at any component, above
    ``path`` or inside it, makes the removal fail and never reaches another tree."""
    parent, name = parent_of(path, root)
    with parent:
        parent.remove_tree(name)


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
