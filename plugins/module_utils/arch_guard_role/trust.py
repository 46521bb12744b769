# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who could replace what the arch_guard role writes, and the walk that makes sure nobody can.

Every task of every job runs the launcher as its user, and the role runs it as root once to
check it: whoever can replace a directory on the way to it runs code everywhere. The rule for
each directory from ``/`` down to the guard's prefix (and to its state directory): a
directory itself (no symlink), root's, and not writable by group or others, or else sticky as
``/tmp`` is: then others cannot rename or remove what root made in it, so the next directory
down, root's too, is safe from them.

A check of names is not enough: a directory that is missing when the survey looks can be
made by any user who may write the directory above it (a sticky ``/tmp`` included) before the
role writes into it. So the writes walk from ``/`` by descriptors (``walk``): each directory
opened relative to the one above it without following a link, checked on that descriptor, and
a missing one made by root there and then (``mkdirat``), so that it is root's from the start;
one that someone else made first is refused, with one line naming it. What the role writes is
then written relative to the last descriptor, which stays on the checked directory whatever
its name comes to point at.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import List, Optional

from ..common import dirfd, errors

_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Untrusted(errors.UsageError):
    """A directory on the way that others could replace; ``str(err)`` is the role's one line."""


def file_type(mode: int) -> str:
    """The kind of a file, as the survey reports it."""
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISREG, "file"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "device"


def facts(path: str, info: os.stat_result) -> dict:
    """What the survey reports of one path: its kind, owner, group and permission bits."""
    return {
        "path": path,
        "type": file_type(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "mode": stat.S_IMODE(info.st_mode),
    }


def distrust(seen: dict) -> Optional[str]:
    """Why the directory the survey saw as ``seen`` (``facts``) is not one others cannot
    replace what is below, or None."""
    if seen["type"] != "directory":
        return f"is a {seen['type']}"
    if seen["uid"] != 0:
        return f"belongs to uid {seen['uid']}"
    if seen["mode"] & _SHARED_WRITE and not seen["mode"] & stat.S_ISVTX:
        return f"is writable by group or others (mode {seen['mode']:04o})"
    return None


def refusal(path: str, target: str) -> str:
    """The role's line for a directory ``path`` on the way to ``target`` that others could replace."""
    return (
        f"arch_guard: {path} must be a directory (not a symlink) owned by root and writable by root "
        f"alone: the guard runs in every job, and whoever can replace {target} runs code in them"
    )


def first_distrusted(chain: List[dict]):
    """The first directory of ``chain`` (the survey's facts, from ``/`` down) that others could
    replace, with why, or None."""
    for seen in chain:
        why = distrust(seen)
        if why is not None:
            return seen["path"], why
    return None


def components(path: str) -> List[str]:
    """The names of the absolute ``path`` from ``/`` down, ``..`` refused (the role's settings
    are absolute paths; one that climbs is no place to trust)."""
    names = [name for name in os.path.normpath(path).split("/") if name]
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise errors.UsageError(f"arch_guard: {path} is not an absolute path without '..'")
    return names


def look(path: str) -> List[dict]:
    """The survey's view of the directories from ``/`` down to ``path``: the ``facts`` of each
    that is there, walked by descriptors without following a link; the walk ends at the first
    that is missing, or that is no directory (its facts say what it is)."""
    chain = []
    fd = os.open("/", _ROOT_FLAGS)
    where = "/"
    try:
        chain.append(facts(where, os.fstat(fd)))
        for name in components(path):
            where = os.path.join(where, name)
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                break
            chain.append(facts(where, info))
            if not stat.S_ISDIR(info.st_mode):
                break
            child = dirfd.open_dir_at(fd, name, where)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return chain


class Walk:
    """The directories from ``/`` to a target, each held by its descriptor and checked on it.

    ``open(path, target, own=..., mode=...)``: every directory above ``own`` names as the
    guard's must pass ``distrust`` on its descriptor; missing ones are made, root's, mode
    0755 (so that jobs can reach the launcher). From ``own`` down (the prefix, or the state
    directory), each is root's with ``mode`` exactly: one that is root's with another mode is
    set to it; one of another owner is refused. ``changed`` says what was made or set, one line
    each. With ``dry_run`` nothing is made or set: a missing directory ends the walk and counts
    as a change.
    """

    def __init__(self, target: str, dry_run: bool = False) -> None:
        self.target = target
        self.dry_run = dry_run
        self.changed: List[str] = []

    def open(self, path: str, own: int, mode: int) -> Optional[dirfd.Directory]:
        """The directory ``path`` held by its descriptor; ``own`` is how many of its last
        components are the role's own (made and kept with ``mode``). None when ``dry_run``
        found a component missing."""
        names = components(path)
        first_own = len(names) - own
        fd = os.open("/", _ROOT_FLAGS)
        where = "/"
        try:
            self._check(fd, where)
            for index, name in enumerate(names):
                where = os.path.join(where, name)
                wanted = mode if index >= first_own else 0o755
                child = self._step(fd, name, where, wanted)
                if child is None:
                    os.close(fd)
                    return None
                os.close(fd)
                fd = child
                if index >= first_own:
                    self._own(fd, where, wanted)
                else:
                    self._check(fd, where)
        except BaseException:
            os.close(fd)
            raise
        return dirfd.Directory(fd, path)

    def _step(self, parent: int, name: str, where: str, mode: int) -> Optional[int]:
        try:
            return dirfd.open_dir_at(parent, name, where)
        except FileNotFoundError:
            pass
        except errors.UsageError as err:
            raise Untrusted(f"{refusal(where, self.target)} ({err})") from None
        if self.dry_run:
            self.changed.append(f"made {where}")
            return None
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass  # someone else's since a moment: opened and checked like any other
        else:
            self.changed.append(f"made {where}")
        child = dirfd.open_dir_at(parent, name, where)
        info = os.fstat(child)
        if info.st_uid == 0 and stat.S_IMODE(info.st_mode) != mode:
            # Made 0700 above, so nobody but root could enter it until now.
            os.fchmod(child, mode)
        return child

    def _check(self, fd: int, where: str) -> None:
        why = distrust(facts(where, os.fstat(fd)))
        if why is not None:
            raise Untrusted(f"{refusal(where, self.target)} ({where} {why})")

    def _own(self, fd: int, where: str, mode: int) -> None:
        info = os.fstat(fd)
        if info.st_uid != 0:
            raise Untrusted(f"{refusal(where, self.target)} ({where} belongs to uid {info.st_uid})")
        if (info.st_gid, stat.S_IMODE(info.st_mode)) == (0, mode):
            return
        self.changed.append(f"set {where} to root's, mode {mode:04o}")
        if not self.dry_run:
            # Mode first: a group that may write it loses that before it becomes root's group.
            os.fchmod(fd, mode)
            os.fchown(fd, 0, 0)


def distrust_executable(path: str) -> Optional[str]:
    """Why the program ``path`` is one another user could have written, or None: the file
    (its link resolved) must be root's and writable by nobody else, and every directory from
    ``/`` down to it (to the link, and to what it resolves to) pass ``distrust``. The role
    starts interpreters as root; such a file is never started."""
    real = os.path.realpath(path)
    try:
        why = _distrust_file(os.stat(real))
    except OSError as err:
        why = f"cannot be looked at ({err.strerror})"
    if why is not None:
        return why
    for folder in dict.fromkeys((os.path.dirname(path), os.path.dirname(real))):
        chain = look(folder)
        bad = first_distrusted(chain)
        if bad is not None:
            return f"is in {bad[0]}, which {bad[1]}"
        if chain[-1]["path"] != os.path.normpath(folder):
            return f"is not in a directory ({chain[-1]['path']} ends the way)"
    return None


def _distrust_file(info: os.stat_result) -> Optional[str]:
    """Why a file root runs is one another user could have written, or None."""
    if not stat.S_ISREG(info.st_mode):
        return f"is a {file_type(info.st_mode)}"
    if info.st_uid != 0:
        return f"belongs to uid {info.st_uid}"
    if info.st_mode & _SHARED_WRITE:
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def open_entry_checked(directory: dirfd.Directory, name: str) -> int:
    """A descriptor of the regular file ``name`` in ``directory``, opened without following a
    link or waiting, and checked on that descriptor: root's, not writable by group or others.
    ``Untrusted`` otherwise: what another user could have written is never run as root."""
    where = directory.join(name)
    try:
        fd = directory.open_entry(name)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Untrusted(f"arch_guard: {where} is a symbolic link; refusing to run it") from None
        raise
    why = _distrust_file(os.fstat(fd))
    if why is not None:
        os.close(fd)
        raise Untrusted(f"arch_guard: {where} {why}; refusing to run it as root")
    return fd
