# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Directories held by their descriptors: ``Directory``, through which every read and every
mutation of a tree is made relative to a directory opened from a root checked once, component
by component, without following a link; the reads it makes (no link followed, no FIFO waited
on, the type checked on the open file, the size bounded when asked); durable replaces by a
random temporary name; removal of a tree by descriptors; the directory exchange.

Both tools' writers use these: eb-staged-rebuild on the trees it swaps, the arch_guard role
on the guard's prefix, root's on every node. Standard library only; nothing runs at import
time.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import os
import platform
import resource
import stat
from typing import IO, Any, Callable, Iterator, List, Optional, Tuple, cast

from . import errors

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


def rename_exchange(path_a, path_b, dir_fd: Optional[int] = None, other_dir_fd: Optional[int] = None) -> None:
    """Swap the names ``path_a`` and ``path_b`` in one step (``renameat2(RENAME_EXCHANGE)``).

    Both names must exist; with ``dir_fd`` they are names in that directory descriptor
    (``path_b`` in ``other_dir_fd`` when given: ``Directory.exchange``). Raises ``OSError``
    with the kernel's errno: ``EXDEV`` across mounts, ``EINVAL`` where the filesystem
    cannot exchange (FUSE, overlay lower layers), ``ENOSYS`` where neither the C library nor
    the syscall table offers renameat2. Callers pick their fallback from that errno.
    """
    func = _renameat2()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path_a, None, path_b)
    at_a = _AT_FDCWD if dir_fd is None else dir_fd
    at_b = at_a if other_dir_fd is None else other_dir_fd
    if func(at_a, os.fsencode(path_a), at_b, os.fsencode(path_b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path_a, None, path_b)


# What a filesystem answers when it has no way to flush a directory: nothing was tried, so
# nothing failed (see fsync_dir). ENOTSUP and EOPNOTSUPP are one value on Linux, two elsewhere.
DIR_SYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


def fsync_dir_fd(fd: int) -> None:
    """``fsync_dir`` of a directory already open as ``fd``, with the same rule."""
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in DIR_SYNC_UNSUPPORTED:
            raise


def read_regular(path, what="file", root=None, limit: Optional[int] = None) -> bytes:
    """The bytes of the regular file ``path``, read without following a link or blocking.

    ``O_NONBLOCK`` makes opening a FIFO return at once, and ``fstat`` on the opened file then
    refuses it, a socket's stand-in, a device or a directory, each with one line naming
    ``what`` and ``path``. A missing file stays ``FileNotFoundError``. With ``root``, the
    directories below it are opened without following a link too (``Directory``): what is
    read is a file of that tree, never of one a swapped-in link points to. With ``limit``, a
    file of more bytes is refused (``UsageError``) after reading one byte past it, whatever
    its size said: a file that grows while it is read cannot make the reader hold it all.
    """
    directory, name = parent_of(path, root)
    with directory:
        return directory.read_regular(name, what, limit)


def _named(what: str, where: str) -> str:
    return f"{what} {where}" if what else where


def _read_regular_fd(fd: int, what: str, where: str, limit: Optional[int] = None) -> bytes:
    """The bytes of the open ``fd`` if it is a regular file (at most ``limit``); closes it
    either way.

    Checked on the descriptor before a file object is made of it: ``io`` refuses a
    directory with an ``IsADirectoryError`` of its own, which is no one-line refusal."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise errors.UsageError(f"{_named(what, where)} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise errors.UsageError(f"{_named(what, where)} is larger than {limit} bytes")
    return data


# O_EXCL with O_NOFOLLOW: a name that exists, even as a dangling symlink or a FIFO, is never
# opened; O_CLOEXEC: no child (a --prepare program, EasyBuild) inherits the half-written file.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_ATTEMPTS = 8
# Room for the dot, the random part and ".tmp" within a file name of 255 bytes.
_TEMP_STEM_CHARS = 64


def _create_temp(directory_fd: int, name: str) -> Tuple[int, str]:
    """Create an unused, unpredictable name in ``directory_fd``: (descriptor, name), mode 0600."""
    for _attempt in range(_TEMP_ATTEMPTS):
        temp = f".{name[:_TEMP_STEM_CHARS]}.{os.urandom(8).hex()}.tmp"
        try:
            return os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=directory_fd), temp
        except FileExistsError:
            continue  # 64 random bits taken already: someone is filling the directory; try again
    raise FileExistsError(errno.EEXIST, f"no unused temporary name for {name}")


class Directory:
    """A directory held by its descriptor; every operation names an entry relative to it.

    This is how the tools mutate a tree that other users may write: the directory
    is opened once, from a root checked once, component by component without following a
    link (``Directory.open(path, root)``), and every delete, rename, exchange, durable write
    and mkdir in it is made through the descriptor. A component swapped for a symlink after
    any check makes the open fail with one line (``open_dir_at``); once open, the descriptor
    stays on the directory that was checked, whatever its name comes to point at, so no
    operation can reach another tree.

    ``path`` is kept for messages only; nothing is ever resolved through it again.
    """

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path, root=None, create_mode: Optional[int] = None) -> Directory:
        """The directory ``path``, opened below the trusted ``root`` without following a link.

        ``root`` itself may be a link (a site may keep its software root behind one, as
        ``refuse_symlink_components``'s ``stop_at`` allows); a ``path`` not under ``root`` or
        with ``..`` below it is refused. Without ``root`` the whole of ``path`` is trusted
        (tests, and callers that checked it themselves). With ``create_mode``, missing
        components below ``root`` are made with that mode (``os.makedirs``, by descriptor).
        """
        path = os.fspath(path)
        if root is None:
            return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)
        root = os.fspath(root)
        parts, top = _components(path), _components(root)
        if parts[: len(top)] != top:
            raise errors.UsageError(f"{path} is not under {root}")
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return cls(_open_components(fd, root, parts[len(top) :], create_mode), path)

    def open_below(self, *names: str) -> Directory:
        """The directory ``names`` (one component each) below this one, each opened from the
        one before without following a link: a walk that never resolves a path again."""
        return Directory(_open_components(os.dup(self.fd), self.path, names), os.path.join(self.path, *names))

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        os.close(self.fd)

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def lstat(self, name: str) -> Optional[os.stat_result]:
        """The entry ``name`` as it is (a link not followed), or None when there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def mkdir(self, name: str, mode: int = 0o755) -> None:
        os.mkdir(name, mode, dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def rmdir(self, name: str) -> None:
        os.rmdir(name, dir_fd=self.fd)

    def symlink(self, target: str, name: str) -> None:
        os.symlink(target, name, dir_fd=self.fd)

    def rename(self, name: str, target: Directory, target_name: str) -> None:
        """``name`` here becomes ``target_name`` in ``target`` (this directory or another)."""
        os.rename(name, target_name, src_dir_fd=self.fd, dst_dir_fd=target.fd)

    def exchange(self, name_a: str, name_b: str, other: Optional[Directory] = None) -> None:
        """Swap ``name_a`` here and ``name_b`` (in ``other``, default this directory) in one
        step (``rename_exchange``)."""
        other = self if other is None else other
        try:
            rename_exchange(name_a, name_b, dir_fd=self.fd, other_dir_fd=other.fd)
        except OSError as err:
            raise OSError(err.errno, err.strerror, self.join(name_a), None, other.join(name_b)) from None

    def sync(self) -> None:
        """Flush this directory's entries (``fsync_dir``'s rule)."""
        fsync_dir_fd(self.fd)

    def open_entry(self, name: str) -> int:
        """A read-only descriptor of the entry ``name``, opened without following a link or
        blocking on a FIFO; an ``OSError`` names the whole path (``ELOOP`` for a link,
        ``ENXIO`` for a socket)."""
        try:
            return os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as err:
            raise OSError(err.errno, err.strerror, self.join(name)) from None

    def read_regular(self, name: str, what: str = "file", limit: Optional[int] = None) -> bytes:
        """``read_regular`` of the entry ``name``: no link followed, no FIFO waited on, at
        most ``limit`` bytes when given."""
        where = _named(what, self.join(name))
        try:
            fd = self.open_entry(name)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise errors.UsageError(f"{where} is a symbolic link; refusing to follow it") from None
            if err.errno == errno.ENXIO:  # what opening a socket answers
                raise errors.UsageError(f"{where} is not a regular file") from None
            raise
        return _read_regular_fd(fd, what, self.join(name), limit)

    def remove_tree(self, name: str) -> None:
        """Remove the directory ``name`` and all it holds, by descriptors (``remove_tree_at``)."""
        remove_tree_at(self.fd, name, self.join(name))

    @contextlib.contextmanager
    def replace(
        self, name: str, mode: Optional[int] = 0o644, *, text: bool = False, encoding: str = "utf-8"
    ) -> Iterator[IO[Any]]:
        """``durable_replace`` of the entry ``name`` of this directory."""
        info = self.lstat(name)
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise errors.UsageError(f"target {self.join(name)} is a symbolic link; refusing to replace it")
        fd, temp = _create_temp(self.fd, name)
        try:
            stream = os.fdopen(fd, "w" if text else "wb", encoding=encoding if text else None)
        except BaseException:
            os.close(fd)
            os.unlink(temp, dir_fd=self.fd)
            raise
        replaced = False
        try:
            with stream:
                yield stream
                stream.flush()
                if mode is not None:
                    os.fchmod(stream.fileno(), mode)
                os.fsync(stream.fileno())
            os.replace(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            replaced = True
        finally:
            # Any error up to the rename, or an interrupt, or a caller that leaves the block
            # early: the temporary file goes and the target is as it was.
            if not replaced:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=self.fd)
        self.sync()


def parent_of(path, root=None) -> Tuple[Directory, str]:
    """(the directory holding ``path``, opened as ``Directory.open`` does, and its last name)."""
    directory, name = os.path.split(os.path.abspath(path))
    return Directory.open(directory, root), name


def _components(path):
    """The absolute ``path`` as its list of components, without normalising ``..`` away."""
    path = os.fspath(path)
    if not os.path.isabs(path):
        # Not abspath: normalising "link/.." lexically would skip the link the kernel follows.
        path = os.path.join(os.getcwd(), path)
    return [part for part in path.split("/") if part not in ("", ".")]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_components(fd: int, top: str, names, create_mode: Optional[int] = None) -> int:
    """The directory ``names`` below the directory ``fd`` (the path ``top``), opened one
    component after the other with ``open_dir_at``; with ``create_mode``, a missing one is made
    first. Takes ``fd`` over: it, and every directory on the way, is closed; the last is returned."""
    where = top
    try:
        for name in names:
            if name == "..":
                raise errors.UsageError(f"{os.path.join(top, *names)} leaves {top}")
            where = os.path.join(where, name)
            if create_mode is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, create_mode, dir_fd=fd)
            child = open_dir_at(fd, name, where)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir_at(parent_fd: int, name: str, where: str) -> int:
    """The directory ``name`` in ``parent_fd``, never through a link: a component swapped for
    a symlink after any check fails here, with one line naming ``where``."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0  # gone again: say what the open found
        if stat.S_ISLNK(mode) or err.errno == errno.ELOOP:
            raise errors.UsageError(f"{where} is a symbolic link; refusing to follow it") from None
        if stat.S_ISDIR(mode):  # a link when opened, a directory again now: it is being swapped
            raise errors.UsageError(f"{where} changed while it was opened; refusing to follow it") from None
        raise errors.UsageError(f"{where} is not a directory") from None


def remove_tree_at(parent_fd: int, name: str, where: str) -> None:
    """Remove the directory ``name`` in ``parent_fd`` and all it holds, by descriptors only.

    Every directory is opened relative to the one above it without following a link, and
    emptied through its own descriptor, so no name is resolved again after a check: a link
    swapped in anywhere makes the removal fail and never reaches another tree. A sealed
    directory (no owner write, ``--read-only-installdir``) gets its write bit back first.

    The walk keeps its own stack instead of recursing (``_Removal``), so a chain thousands of
    directories deep is removed like any other tree, within a few descriptors.
    """
    removal = _Removal(parent_fd, name, where)
    try:
        removal.run()
    finally:
        removal.close()


# The most directories below its top that a removal keeps open (``_descriptor_budget``).
_MOST_HELD = 64


def _descriptor_budget() -> int:
    """How many directories below its top a removal keeps open at most: a sixteenth of the
    soft ``RLIMIT_NOFILE`` (64 of the usual 1,024), and at least 2, so that a deep tree
    never takes the descriptors the rest of the process needs."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MOST_HELD
    return max(2, min(_MOST_HELD, soft // 16))


def _identity(fd: int) -> Tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


@dataclasses.dataclass
class _Level:
    """A directory on the way down a removal: its name in the one above, its identity, its
    descriptor while it is held (None once let go), and its subdirectories still to remove."""

    name: str
    identity: Tuple[int, int]
    fd: Optional[int]
    pending: List[str]


class _Removal:
    """``remove_tree_at``'s walk, without recursion: the directories from the top down to the
    one being emptied, each a ``_Level``.

    The top and the deepest ``budget`` levels keep their descriptors; a level above those is
    let go and opened again, when the walk climbs back to it, as ``..`` of the level below.
    That ``..`` is whatever directory holds the level below now: another user who can write
    a directory of the tree may have moved it meanwhile (into a world-writable directory
    elsewhere, say), so ``..`` is taken only when its device and inode are the ones recorded
    on the way down. Otherwise the level is opened again from the top by its recorded names,
    each checked the same way, and a name that no longer leads to the recorded directory
    stops the removal. So nothing is ever unlinked or entered in a directory that was not
    inside the tree when the walk reached it.

    An entry below the top that is gone when the walk comes to it (moved or removed by
    whoever can write the directory that held it) is no longer in the tree, and is passed
    over, as ``rm -rf`` does; a subdirectory moved out while the walk was in it is emptied,
    and its name, gone from the tree, is not removed.
    """

    def __init__(self, parent_fd: int, name: str, where: str) -> None:
        self.parent_fd = parent_fd
        self.where = where
        self.budget = _descriptor_budget()
        self.levels: List[_Level] = []
        # levels[0] and levels[self.held_from:] hold their descriptors.
        self.held_from = 1
        fd = open_dir_at(parent_fd, name, where)
        self._enter(fd, name, lambda: where)

    def _path(self, depth: int, *below: str) -> str:
        """The path of ``levels[depth]`` (and ``below`` it), for a message: built only when
        one is needed."""
        return os.path.join(self.where, *(level.name for level in self.levels[1 : depth + 1]), *below)

    def _descend(self, name: str) -> None:
        """Into the subdirectory ``name`` of the deepest level, unless it is gone."""
        depth = len(self.levels) - 1
        parent_fd = cast(int, self.levels[depth].fd)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            return
        except OSError:
            fd = open_dir_at(parent_fd, name, self._path(depth, name))  # its refusal, in one line
        self._enter(fd, name, functools.partial(self._path, depth, name))

    def _enter(self, fd: int, name: str, where: Callable[[], str]) -> None:
        """The directory ``name``, open as ``fd``, becomes the deepest level: a sealed one gets
        its owner's write bit back, what is not a directory in it is unlinked, the rest noted."""
        try:
            info = os.fstat(fd)
            mode = stat.S_IMODE(info.st_mode)
            if mode & (stat.S_IWUSR | stat.S_IXUSR) != stat.S_IWUSR | stat.S_IXUSR:
                os.fchmod(fd, mode | stat.S_IWUSR | stat.S_IXUSR)
            pending = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.name)
                        continue
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    except OSError as err:
                        raise OSError(err.errno, err.strerror, os.path.join(where(), entry.name)) from None
        except BaseException:
            os.close(fd)
            raise
        self.levels.append(_Level(name, (info.st_dev, info.st_ino), fd, pending))
        if len(self.levels) - self.held_from > self.budget:
            let_go = self.levels[self.held_from]
            os.close(cast(int, let_go.fd))
            let_go.fd = None
            self.held_from += 1

    def _reopen(self, depth: int, below_fd: int) -> int:
        """A descriptor of ``levels[depth]`` again: ``..`` of the level below while that is
        still where it was, else from the top by the recorded names."""
        try:
            fd = os.open("..", _DIR_FLAGS, dir_fd=below_fd)
        except OSError:
            pass  # moved where this user cannot climb back: from the top, by name
        else:
            if _identity(fd) == self.levels[depth].identity:
                return fd
            os.close(fd)
        fd = os.dup(cast(int, self.levels[0].fd))
        for step in range(1, depth + 1):
            try:
                child = open_dir_at(fd, self.levels[step].name, self._path(step))
            finally:
                os.close(fd)
            fd = child
            if _identity(fd) != self.levels[step].identity:
                os.close(fd)
                raise errors.UsageError(
                    f"{self._path(step)} was replaced while its tree was being removed; the removal stopped"
                )
        return fd

    def run(self) -> None:
        levels = self.levels
        while levels:
            deepest = levels[-1]
            if deepest.pending:
                self._descend(deepest.pending.pop())
                continue
            # ``deepest`` is empty: climb to the level above, then remove it there.
            levels.pop()
            emptied_fd = cast(int, deepest.fd)
            deepest.fd = None
            try:
                above = levels[-1] if levels else None
                if above is not None and above.fd is None:
                    above.fd = self._reopen(len(levels) - 1, emptied_fd)
                    self.held_from = len(levels) - 1
            finally:
                os.close(emptied_fd)
            if above is None:
                os.rmdir(deepest.name, dir_fd=self.parent_fd)
                return
            try:
                os.rmdir(deepest.name, dir_fd=cast(int, above.fd))
            except FileNotFoundError:
                pass  # moved out of the tree meanwhile
            except OSError as err:
                raise OSError(err.errno, err.strerror, self._path(len(levels) - 1, deepest.name)) from None

    def close(self) -> None:
        for level in self.levels:
            if level.fd is not None:
                os.close(level.fd)
                level.fd = None
