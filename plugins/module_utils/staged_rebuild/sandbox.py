# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``userns`` backend's sandbox: a private mount namespace for the build.

Inside it the live software tree and the live module tree are read-only, and each module's
stage appears at its live ``<software>/<Name>/<version>`` path, so EasyBuild writes the final
paths into everything it makes. The namespace is set up in the forked child, just before
EasyBuild is executed; it dies with the build, and nothing of it is visible outside.

How the stage gets to the live path: the live ``<software>/<Name>`` is covered by the view
``<generation>/software/<Name>``, which holds the stage ``<version>`` as a plain directory and,
for every other entry of the live ``Name`` directory, a placeholder with that entry bind-mounted
read-only onto it. EasyBuild's ``--rebuild`` removes the install directory before building;
a stage bind-mounted directly at ``Name/version`` would be a mount point, and EasyBuild's
removal would fail with EBUSY and retry with sleeps. In the view it is an ordinary directory.

Unprivileged, the child first enters a user namespace in which it is root (the mounts need
that), then a nested one that maps it back to its own uid and gid: EasyBuild refuses to run
as root, and files it creates belong to the build user either way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from ..common import mountinfo

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
# A bind remount must repeat the flags the kernel locked when the user namespace was made,
# or it fails with EPERM; statvfs reports them with the same bit values.
_LOCKED_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC))
PROBE_NAME = ".eb-staged-rebuild-erofs-probe"


class SandboxError(Exception):
    """The sandbox could not be set up; the message says which step and why."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(code)}")


def _mount(libc, source, target, flags):
    _check(
        libc.mount(None if source is None else os.fsencode(source), os.fsencode(target), None, flags, None),
        f"mount {source or ''} {target}".replace("  ", " "),
    )


def _remount(libc, target, read_only):
    locked = 0
    fs_flags = os.statvfs(target).f_flag
    for st_flag, ms_flag in _LOCKED_FLAGS:
        if fs_flags & st_flag:
            locked |= ms_flag
    flags = MS_REMOUNT | MS_BIND | locked | (MS_RDONLY if read_only else 0)
    _check(libc.mount(None, os.fsencode(target), None, flags, None), f"remount {target}")


def _write(path, text):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def _map_ids(inside_uid, outside_uid, inside_gid, outside_gid):
    # An unprivileged process may map only its own ids, and only after giving up setgroups.
    try:
        _write("/proc/self/setgroups", "deny")
    except OSError as err:
        if err.errno != errno.EPERM:  # inherited "deny" cannot be written again
            raise
    _write("/proc/self/uid_map", f"{inside_uid} {outside_uid} 1\n")
    _write("/proc/self/gid_map", f"{inside_gid} {outside_gid} 1\n")


def _view_entries(live_name_dir, versions):
    """The live ``Name`` directory's other entries: ``(entry, lstat mode)``, FIFOs and sockets left out."""
    entries = []
    for entry in sorted(os.listdir(live_name_dir)):
        if entry in versions:
            continue
        mode = os.lstat(os.path.join(live_name_dir, entry)).st_mode
        # A FIFO or socket in an install directory is nothing a build reads.
        if stat.S_ISLNK(mode) or stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            entries.append((entry, mode))
    return entries


def view_siblings(live_name_dir, versions):
    """The entries of the live ``Name`` directory that the view shows by a read-only bind mount
    (every other version and file; symlinks are copied instead). Reads, writes nothing."""
    return [entry for entry, mode in _view_entries(live_name_dir, versions) if not stat.S_ISLNK(mode)]


def make_view(live_name_dir, view_dir, versions):
    """Create the view for one ``Name`` (run before the fork, as the build user).

    ``versions`` are the staged versions (plain directories in the view); every other entry of
    the live ``Name`` directory gets a placeholder to mount onto, a symlink a copy of itself.
    Returns the names that need a read-only bind mount (``view_siblings``).
    """
    os.makedirs(view_dir, mode=0o755, exist_ok=True)
    for version in versions:
        os.makedirs(os.path.join(view_dir, version), mode=0o755, exist_ok=True)
    siblings = []
    for entry, mode in _view_entries(live_name_dir, versions):
        live_entry, placeholder = os.path.join(live_name_dir, entry), os.path.join(view_dir, entry)
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(live_entry), placeholder)
            continue
        if stat.S_ISDIR(mode):
            os.mkdir(placeholder, 0o755)
        else:
            os.close(os.open(placeholder, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        siblings.append(entry)
    return siblings


def _read_only_tree(libc, root):
    _mount(libc, root, root, MS_BIND | MS_REC)
    for point in mountinfo.mount_points_under(root):
        _remount(libc, point, read_only=True)


def _writable_bind(libc, source, target):
    # A bind of a path inside a read-only mount starts read-only; remounting it makes only
    # this new mount writable, not the tree it came from.
    _mount(libc, source, target, MS_BIND | MS_REC)
    _remount(libc, target, read_only=False)


def require_read_only(path):
    """The EROFS probe: creating a file under ``path`` must fail with EROFS."""
    probe = os.path.join(path, f"{PROBE_NAME}.{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        if err.errno == errno.EROFS:
            return
        code = errno.errorcode.get(err.errno or 0, str(err.errno))
        raise SandboxError(f"probe write in {path} failed with {code}, not EROFS") from None
    os.close(fd)
    os.unlink(probe)
    raise SandboxError(f"{path} is writable inside the sandbox")


def enter(spec):
    """Set up the sandbox in the current (forked, single-threaded) process.

    ``spec``: ``read_only`` (the live trees), ``writable`` (the generation directory),
    ``views`` (``[(view_dir, live_name_dir, [sibling names])]``) and ``probe`` (paths where a
    write must fail with EROFS). Raises ``SandboxError``.
    """
    libc = _libc()
    # Mounts land on resolved paths, and mountinfo lists those: /apps -> /gpfs/apps must be
    # made read-only as /gpfs/apps.
    real = os.path.realpath
    spec = {
        "read_only": [real(path) for path in spec["read_only"]],
        "writable": [real(path) for path in spec["writable"]],
        "views": [(real(view), real(live), siblings) for view, live, siblings in spec["views"]],
        "probe": [real(path) for path in spec["probe"]],
    }
    uid, gid = os.getuid(), os.getgid()
    unprivileged = os.geteuid() != 0
    cwd = os.getcwd()
    _check(libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if unprivileged else 0)), "unshare")
    if unprivileged:
        _map_ids(0, uid, 0, gid)
    # Private first: as root, a shared "/" would carry every mount below into the host.
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)
    for root in spec["read_only"]:
        _read_only_tree(libc, root)
    for path in spec["writable"]:
        _writable_bind(libc, path, path)
    for view_dir, live_name_dir, siblings in spec["views"]:
        for sibling in siblings:
            placeholder = os.path.join(view_dir, sibling)
            _mount(libc, os.path.join(live_name_dir, sibling), placeholder, MS_BIND | MS_REC)
            _remount(libc, placeholder, read_only=True)
        _writable_bind(libc, view_dir, live_name_dir)
    for path in spec["probe"]:
        require_read_only(path)
    if unprivileged:
        _check(libc.unshare(CLONE_NEWUSER), "unshare (nested user namespace)")
        _map_ids(uid, 0, gid, 0)
    # The old working directory may lie in a tree that is now covered: enter it again by name.
    os.chdir(cwd)
