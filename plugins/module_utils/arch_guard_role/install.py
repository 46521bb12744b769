# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the arch_guard role writes on a node, as root, and the one program it runs there.

Every write goes through directories walked from ``/`` by descriptors (``trust.Walk``): a
missing directory is made by root there and then, a directory someone else could replace is
refused with one line naming it, and the file is written relative to the descriptor that was
checked. Files are replaced whole (``Directory.replace``: a random temporary name, then one
rename), so a task that starts meanwhile runs the old file or the new one.

The launcher is checked by running it as slurmstepd would (an empty environment), and it is
run through the descriptor that was checked immediately before (``/proc/self/fd/N``): root's,
writable by nobody else, and byte for byte what was written. Its interpreter is started only
when nobody else could have written it either. What another user could have written is never
run.

Each function compares first and writes only what differs (a rerun that changes nothing
writes nothing); with ``dry_run`` it writes nothing and says what it would change. Each
returns ``{"changed": bool, "actions": [what was done, one line each], "diff": [...]}``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import os
import stat
import tarfile
from typing import Optional

from ..arch_guard import installed
from ..common import dirfd, errors, proc
from ..common.deadline import Deadline, DeadlineExceeded
from . import slurmconf, trust

# How long the launcher's check may take: with an empty environment the guard skips at once.
CHECK_SECONDS = 120
COMPILE_SECONDS = 300
_GUARD_FILE_MAX_BYTES = 1024 * 1024
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class InstallError(errors.UsageError):
    """A write the role refuses, or a launcher that does not run; ``str(err)`` is the one line."""


class _Result:
    def __init__(self) -> None:
        self.actions: list = []
        self.diff: list = []

    def did(self, action: str) -> None:
        self.actions.append(action)

    def as_dict(self, walk: Optional[trust.Walk] = None) -> dict:
        actions = (walk.changed if walk else []) + self.actions
        return {"changed": bool(actions), "actions": actions, "diff": self.diff}


# ------------------------------------------------------------------ the code


def _walk(prefix: str, dry_run: bool) -> trust.Walk:
    return trust.Walk(os.path.normpath(prefix), dry_run)


def _own_dir(walk: trust.Walk, prefix: str, *relative: str) -> Optional[dirfd.Directory]:
    """The guard's directory ``relative`` to the prefix (the prefix itself when empty)."""
    path = os.path.join(os.path.normpath(prefix), *relative)
    return walk.open(path, own=1 + len(relative), mode=installed.DIRECTORY_MODE)


def install_code(prefix: str, build: str, archive: str, python: str, *, dry_run: bool = False) -> dict:
    """Unpack ``archive`` (the code, a tar archive in base64) into ``lib/<build>`` and compile
    it with ``python``, the interpreter that will run it. A directory of that name left by an
    interrupted install goes first; the one in use (``lib/current``) is kept as it is."""
    walk, result = _walk(prefix, dry_run), _Result()
    try:
        data = base64.b64decode(archive, validate=True)
    except (binascii.Error, ValueError):
        raise InstallError("arch_guard: the guard's code is not a base64 archive") from None
    lib = _own_dir(walk, prefix, installed.LIB)
    if lib is None:
        result.did(f"would unpack the code into {os.path.join(prefix, installed.LIB, build)}")
        return result.as_dict(walk)
    with lib:
        if lib.lstat(build) is not None:
            if _current(lib) == build:
                return result.as_dict(walk)
            if not dry_run:
                lib.remove_tree(build)
            result.did(f"removed {lib.join(build)}, left by an interrupted install")
        result.did(f"unpacked the code into {lib.join(build)} and compiled it with {python}")
        if dry_run:
            return result.as_dict(walk)
        lib.mkdir(build, 0o700)
    with assert_held(_own_dir(walk, prefix, installed.LIB, build)) as target:
        _unpack(data, target)
    _compile(python, os.path.join(os.path.normpath(prefix), installed.LIB, build))
    return result.as_dict(walk)


def assert_held(directory: Optional[dirfd.Directory]) -> dirfd.Directory:
    if directory is None:  # only a dry run stops at a missing directory
        raise InstallError("arch_guard: a directory the role made is gone")
    return directory


def _current(lib: dirfd.Directory) -> Optional[str]:
    """The build ``lib/current`` names, or None."""
    try:
        return os.readlink(installed.CURRENT, dir_fd=lib.fd)
    except OSError:
        return None


def _unpack(data: bytes, target: dirfd.Directory) -> None:
    """The archive's directories and regular files, made below ``target`` by descriptors:
    root's, directories 0755, files 0644; any other member, or a name that leaves the
    directory, is refused."""
    held = {"": target.fd}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                parts = member.name.split("/")
                if member.name.startswith("/") or any(part in ("", ".", "..") for part in parts):
                    raise InstallError(f"arch_guard: the code's archive names {member.name!r}")
                parent = _held_dir(held, target, parts[:-1])
                if member.isdir():
                    _held_dir(held, target, parts)
                elif member.isreg():
                    source = archive.extractfile(member)
                    content = source.read() if source is not None else b""
                    fd = os.open(parts[-1], _NEW_FILE, installed.FILE_MODE, dir_fd=parent)
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(content)
                        os.fchmod(handle.fileno(), installed.FILE_MODE)
                else:
                    raise InstallError(f"arch_guard: the code's archive has {member.name!r}, not a file")
    except tarfile.TarError as err:
        raise InstallError(f"arch_guard: the guard's code is not a tar archive ({err})") from None
    finally:
        for relative, fd in held.items():
            if relative:
                os.close(fd)


def _held_dir(held: dict, target: dirfd.Directory, parts: list) -> int:
    """The descriptor of the directory ``parts`` below ``target``, made if missing."""
    for depth in range(1, len(parts) + 1):
        relative = "/".join(parts[:depth])
        if relative in held:
            continue
        parent = held["/".join(parts[: depth - 1])]
        with contextlib.suppress(FileExistsError):
            os.mkdir(parts[depth - 1], 0o700, dir_fd=parent)
        fd = dirfd.open_dir_at(parent, parts[depth - 1], target.join(relative))
        os.fchmod(fd, installed.DIRECTORY_MODE)
        held[relative] = fd
    return held["/".join(parts)]


def _compile(python: str, build_path: str) -> None:
    """Byte-compile the build with the interpreter that runs it, for its cache tag: users
    cannot write there, so without .pyc files every task would compile the guard again."""
    _refuse_untrusted_program(python)
    argv = [python, "-I", "-m", "compileall", "-q", build_path]
    try:
        done = proc.run_child(
            argv, env={"PATH": os.defpath, "LC_ALL": "C"}, deadline=Deadline(COMPILE_SECONDS)
        )
    except (OSError, DeadlineExceeded) as err:
        raise InstallError(f"arch_guard: cannot compile the guard's code with {python}: {err}") from None
    if done.returncode != 0:
        output = proc.summary(done.stdout + done.stderr)
        raise InstallError(f"arch_guard: {python} could not compile the guard's code: {output}")


def _refuse_untrusted_program(python: str) -> None:
    why = trust.distrust_executable(python)
    if why is not None:
        raise InstallError(f"arch_guard: the interpreter {python} {why}; refusing to run it as root")


def switch(prefix: str, build: str, release: dict, *, dry_run: bool = False) -> dict:
    """``lib/current`` switched to ``build`` in one rename, ``release`` recorded, and the
    builds no task can still be using removed: all but this one and the one it replaced
    (tasks that started before the switch may still import that one)."""
    walk, result = _walk(prefix, dry_run), _Result()
    lib = _own_dir(walk, prefix, installed.LIB)
    if lib is None:
        result.did(f"would switch {os.path.join(prefix, installed.LIB, installed.CURRENT)} to {build}")
        return result.as_dict(walk)
    with lib:
        built = lib.lstat(build)
        if not dry_run and (built is None or not stat.S_ISDIR(built.st_mode) or built.st_uid != 0):
            raise InstallError(f"arch_guard: {lib.join(build)} is not a build of root's to switch to")
        previous = _current(lib)
        if previous != build:
            if not dry_run:
                _link(lib, build)
            result.did(f"switched {lib.join(installed.CURRENT)} to {build} (was {previous})")
        for name in sorted(os.listdir(lib.fd)):
            info = lib.lstat(name)
            if name in (build, previous, installed.CURRENT) or info is None:
                continue
            if not dry_run:
                if stat.S_ISDIR(info.st_mode):
                    lib.remove_tree(name)
                else:
                    lib.unlink(name)
            result.did(f"removed {lib.join(name)}, which no task can still be using")
        lib.sync()
    with assert_held(_own_dir(walk, prefix)) as top:
        _write(
            top,
            installed.RELEASE_FILE,
            installed.release_bytes(release),
            installed.FILE_MODE,
            result,
            dry_run=dry_run,
        )
    return result.as_dict(walk)


def _link(lib: dirfd.Directory, build: str) -> None:
    """``current`` -> ``build`` in one rename: a task imports the old build or the new one."""
    for _attempt in range(8):
        temp = f".{installed.CURRENT}.{os.urandom(8).hex()}"
        try:
            lib.symlink(build, temp)
            break
        except FileExistsError:
            continue
    else:
        raise InstallError(f"arch_guard: no unused temporary name in {lib.path}")
    try:
        os.replace(temp, installed.CURRENT, src_dir_fd=lib.fd, dst_dir_fd=lib.fd)
    except OSError as err:
        lib.unlink(temp)
        raise InstallError(
            f"arch_guard: cannot switch {lib.join(installed.CURRENT)}: {err.strerror}"
        ) from None


def _write(directory, name: str, content: bytes, mode: int, result: _Result, *, dry_run: bool):
    """Replace ``name`` with ``content`` unless it is that already (a regular file of root's
    with ``mode``); returns what was there (None for nothing, or not a regular file)."""
    before = None
    info = directory.lstat(name)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise InstallError(f"arch_guard: {directory.join(name)} is a directory; refusing to replace it")
    if info is not None and stat.S_ISREG(info.st_mode):
        before = directory.read_regular(name, "", _GUARD_FILE_MAX_BYTES)
        if before == content and (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, mode):
            return before
    if not dry_run:
        with directory.replace(name, mode) as stream:
            stream.write(content)
    result.did(f"wrote {directory.join(name)}")
    return before


# ------------------------------------------------------------------ the launcher and the wrapper


def write_launcher(
    prefix: str, *, launcher: str, python: str, dry_run: bool = False, diff: bool = False
) -> dict:
    """The launcher with the text ``launcher``, then run once as slurmstepd runs it with
    ``python``, its interpreter: it must load the guard."""
    walk, result = _walk(prefix, dry_run), _Result()
    name = os.path.basename(installed.LAUNCHER)
    bin_dir = _own_dir(walk, prefix, installed.BIN)
    if bin_dir is None:
        _would_write(result, diff, os.path.join(os.path.normpath(prefix), installed.BIN, name), launcher)
        return result.as_dict(walk)
    with bin_dir:
        _write_text(bin_dir, name, launcher, result, dry_run=dry_run, diff=diff)
        bin_dir.sync()
        if not dry_run:
            run_launcher(bin_dir, launcher.encode(), python)
    return result.as_dict(walk)


def write_wrapper(prefix: str, *, wrapper: Optional[str], dry_run: bool = False, diff: bool = False) -> dict:
    """The wrapper with the text ``wrapper``; without one, a wrapper there removed. The role
    never runs it: slurmstepd does, as the job's user."""
    walk, result = _walk(prefix, dry_run), _Result()
    name = os.path.basename(installed.WRAPPER)
    bin_dir = _own_dir(walk, prefix, installed.BIN)
    if bin_dir is None:
        if wrapper is not None:
            _would_write(result, diff, os.path.join(os.path.normpath(prefix), installed.BIN, name), wrapper)
        return result.as_dict(walk)
    with bin_dir:
        if wrapper is not None:
            _write_text(bin_dir, name, wrapper, result, dry_run=dry_run, diff=diff)
        elif bin_dir.lstat(name) is not None:
            if not dry_run:
                try:
                    bin_dir.unlink(name)
                except IsADirectoryError:
                    raise InstallError(f"arch_guard: {bin_dir.join(name)} is a directory") from None
            result.did(f"removed {bin_dir.join(name)}, since there is nothing to chain")
        bin_dir.sync()
    return result.as_dict(walk)


def _write_text(
    bin_dir: dirfd.Directory, name: str, text: str, result: _Result, *, dry_run: bool, diff: bool
):
    before = _write(bin_dir, name, text.encode(), installed.EXECUTABLE_MODE, result, dry_run=dry_run)
    if before != text.encode():
        _diff(result, diff, bin_dir.join(name), before, text)


def _would_write(result: _Result, diff: bool, path: str, text: str) -> None:
    result.did(f"would write {path}")
    _diff(result, diff, path, None, text)


def _diff(result: _Result, wanted: bool, path: str, before: Optional[bytes], after: str) -> None:
    if wanted:
        old = before.decode("utf-8", "replace") if before is not None else ""
        result.diff.append({"before": old, "after": after, "before_header": path, "after_header": path})


def run_launcher(bin_dir: dirfd.Directory, content: bytes, python: str) -> None:
    """Run the launcher as slurmstepd would (nothing of the play's environment) through the
    descriptor it was checked on: a launcher that cannot load the guard says so and exits 0,
    which Slurm would take for success, so its output is read too."""
    name = os.path.basename(installed.LAUNCHER)
    where = bin_dir.join(name)
    fd = trust.open_entry_checked(bin_dir, name)
    try:
        if os.pread(fd, len(content) + 1, 0) != content:
            raise InstallError(f"arch_guard: {where} changed while it was checked; refusing to run it")
        _refuse_untrusted_program(python)
        try:
            done = proc.run_child(
                [f"/proc/self/fd/{fd}"],
                env={"SLURM_LOCALID": "0"},
                deadline=Deadline(CHECK_SECONDS),
                pass_fds=[fd],
            )
        except (OSError, DeadlineExceeded) as err:
            raise InstallError(f"arch_guard: the launcher {where} does not run: {err}") from None
    finally:
        os.close(fd)
    output = done.stdout.decode("utf-8", "replace")
    # Its stderr is the decision's detail with arch_guard_verbose: not a failure.
    if done.returncode != 0 or installed.CANNOT_LOAD in output:
        raise InstallError(
            f"arch_guard: the launcher {where} does not run the guard (exit {done.returncode}): "
            f"{proc.summary(done.stdout + done.stderr)}"
        )


# ------------------------------------------------------------------ removal


def remove(prefix: str, *, dry_run: bool = False) -> dict:
    """The guard's directory and all it holds, removed by descriptors from ``/``."""
    prefix = os.path.normpath(prefix)
    walk, result = _walk(prefix, True), _Result()
    parent = walk.open(os.path.dirname(prefix), own=0, mode=0o755)
    if parent is None:
        return result.as_dict()
    with parent:
        name = os.path.basename(prefix)
        if parent.lstat(name) is not None:
            if not dry_run:
                parent.remove_tree(name)
                parent.sync()
            result.did(f"removed {prefix}")
    return result.as_dict()


# ------------------------------------------------------------------ the kept TaskProlog line


def keep_line(state_dir: str, slurm_conf: str, line: Optional[str], *, dry_run: bool = False) -> dict:
    """The TaskProlog line found before the guard's (None: there was none) kept in
    ``state_dir`` (root's, 0700, made if missing), for removal to put back."""
    walk, result = trust.Walk(os.path.normpath(state_dir), dry_run), _Result()
    held = walk.open(state_dir, own=1, mode=0o700)
    text = slurmconf.kept_text(slurm_conf, line)
    if held is None:
        result.did(f"would keep the TaskProlog line in {os.path.join(state_dir, slurmconf.KEPT_FILE)}")
        return result.as_dict(walk)
    with held:
        _write(held, slurmconf.KEPT_FILE, text.encode(), 0o600, result, dry_run=dry_run)
    return result.as_dict(walk)


def forget_line(state_dir: str, *, dry_run: bool = False) -> dict:
    """The kept line removed, once slurm.conf has it back."""
    walk, result = trust.Walk(os.path.normpath(state_dir), True), _Result()
    if not os.path.lexists(state_dir):
        return result.as_dict()
    held = walk.open(state_dir, own=1, mode=0o700)
    if held is None:
        return result.as_dict()
    with held:
        if held.lstat(slurmconf.KEPT_FILE) is not None:
            if not dry_run:
                held.unlink(slurmconf.KEPT_FILE)
                held.sync()
            result.did(f"removed {held.join(slurmconf.KEPT_FILE)}")
    return result.as_dict()
