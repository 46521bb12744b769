# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Retire a module file whose package now lives elsewhere on MODULEPATH, and undo that.

``retire`` moves the module file with one ``os.replace`` to
``<state-root>/retired/<timestamp>/<absolute path without the leading />``, after fsyncing
the file and both directories: a reader sees the module file or does not, a job that
loaded it keeps its paths, and the software directory is not touched. A rename across
filesystems is not atomic, so differing ``st_dev`` of the module directory and the
destination is refused. The journal ``runs/retire-<timestamp>/`` is written ``retiring``
before the rename and ``retired`` after it; ``rollback retire-<timestamp>`` moves the file
back the same way and refuses to overwrite a module file that exists again.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import stat

from ..common import errors
from ..common.errors import setting
from . import fsutil, modulefile, paths
from . import journal as journals
from .journal import RunKind, RunState


def _timestamp():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def _move(source, source_root, destination, destination_root):
    """One durable rename: fsync the file, rename, fsync both directories.

    Both directories are opened from their roots (the module tree, the state root) without
    following a link, and the rename is made between the two descriptors: ``all/<Name>`` or
    a directory under ``retired/`` swapped for a link meanwhile fails the move in one line
    and never moves a file into, or out of, another tree."""
    source_dir, source_name = fsutil.parent_of(source, source_root)
    destination_dir, destination_name = fsutil.parent_of(destination, destination_root)
    with source_dir, destination_dir:
        fd = os.open(
            source_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source_dir.fd
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise errors.UsageError(f"{source} is not a regular file; refusing to move it")
            os.fsync(fd)
        finally:
            os.close(fd)
        source_dir.rename(source_name, destination_dir, destination_name)
        destination_dir.sync()
        source_dir.sync()


def _device_of_nearest(path):
    """st_dev of ``path``, or of its nearest existing ancestor (where it would be created)."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return os.stat(path).st_dev


def check(module_file, reason, state_root):
    """Refuse a bad retire request before anything is written; return the file's path,
    bytes and the software directory of its root assignment (under the software root)."""
    module_file = os.path.abspath(module_file)
    fsutil.refuse_symlink_components(module_file)
    try:
        info = os.lstat(module_file)
    except FileNotFoundError:
        raise errors.UsageError(f"module file {module_file} does not exist (already retired?)") from None
    if not stat.S_ISREG(info.st_mode):
        raise errors.UsageError(f"{module_file} is not a regular file; only a module file can be retired")
    data = fsutil.read_regular(module_file, "module file", root=paths.module_root_of(module_file))
    root = modulefile.parse_root(modulefile.decode(data))
    if root is None:
        raise errors.UsageError(f"module file {module_file} has no root assignment; refusing to retire it")
    if not os.path.isabs(root):
        raise errors.UsageError(
            f"module file {module_file} assigns root {root!r}, not an absolute path; refusing to retire it"
        )
    # Normalised as the journal holds it ("bin/.." is the directory it names).
    software_root, normal_root = paths.software_root_of(module_file), os.path.normpath(root)
    if not paths.is_inside(normal_root, software_root) or normal_root == software_root:
        raise errors.UsageError(
            f"module file {module_file} assigns root {root}, which is not under the software root "
            f"{software_root}; refusing to retire it"
        )
    if not reason or not reason.strip():
        raise errors.UsageError(f"retire needs {setting('reason')} TEXT")
    if (
        _device_of_nearest(os.path.join(state_root, "retired"))
        != os.stat(os.path.dirname(module_file)).st_dev
    ):
        raise errors.UsageError(
            f"the state root {state_root} is on another filesystem than {os.path.dirname(module_file)}: "
            "a rename there would not be atomic"
        )
    # As gc compares it, and as the journal holds a path (without "..": records.AbsPath).
    return module_file, data, normal_root


def retire(state_root, module_file, reason):
    module_file, data, root = check(module_file, reason, state_root)
    run_id = paths.RETIRE_RUN_PREFIX + _timestamp()
    destination = paths.retired_module_path(state_root, run_id, module_file)
    # New directories under retired/, whose filesystem check() compared with the module's.
    fsutil.makedirs(os.path.dirname(destination), root=state_root, mode=0o700)
    journal = journals.Journal.create(
        os.path.join(state_root, "runs"),
        run_id,
        kind=RunKind.RETIRE,
        state=RunState.RETIRING,
        module_file=module_file,
        retired_to=destination,
        module_sha256=modulefile.module_hash(data),
        software_dir=root,
        reason=reason,
        retired_at=journals.now(),
    )
    moved = False
    try:
        # Fault points (``faults.Faults``) before the rename and before the journal says it happened.
        journal.faults.before("retire move")
        _move(module_file, paths.module_root_of(module_file), destination, state_root)
        moved = True
        journal.faults.before("state retired")
        journal.set_state(RunState.RETIRED)
    except BaseException:
        _undo_retire(journal, moved)
        raise
    return {
        "run_id": run_id,
        "changed": True,
        "state": "retired",
        "module_file": module_file,
        "retired_to": destination,
    }


def _undo_retire(journal, moved):
    """A retire that failed (a full or read-only disk: the rename, or the journal's "retired")
    puts the module file back, so that it fails with nothing changed, and ends its run
    ``rolled_back``. If even that fails, the run stays ``retiring``, which ``rollback``
    resolves from the disk (``_in_place``) and gc does not remove."""
    if moved:
        _move_back(journal)
    with contextlib.suppress(OSError):
        journal.set_state(RunState.ROLLED_BACK)


def _move_back(journal):
    """The retired copy back to where it was retired from."""
    original = journal.run.module_file
    _move(journal.run.retired_to, journal.state_root, original, paths.module_root_of(original))


def _in_place(journal):
    """True when the module file is where it was retired from, with the bytes it had, and
    not in ``retired/``: read from the disk, not from the journal's state. That is a retire
    stopped before its rename (the journal says retiring), or a rollback stopped after its
    rename back but before its journal write (the journal still says retired); either way
    only the journal's ``rolled_back`` is missing."""
    source, original = journal.run.retired_to, journal.run.module_file
    if os.path.lexists(source) or not os.path.isfile(original) or os.path.islink(original):
        return False
    try:
        data = fsutil.read_regular(original, "module file", root=paths.module_root_of(original))
    except (OSError, errors.UsageError):
        return False
    return modulefile.module_hash(data) == journal.run.module_sha256


def check_rollback(journal):
    """Refuse a rollback of a retire that cannot be done; False when it is rolled back already."""
    # Where retired_to and module_file may point was checked when the journal loaded
    # (Run.check_paths): nowhere but where this retire keeps and took the file.
    source, original = journal.run.retired_to, journal.run.module_file
    if journal.state is RunState.ROLLED_BACK:
        return False
    if _in_place(journal):
        return True
    if os.path.lexists(original):
        raise errors.UsageError(f"{original} exists again; refusing to overwrite it with the retired copy")
    if not os.path.isfile(source):
        raise errors.JournalError(f"run {journal.run_id}: the retired file {source} is missing")
    return True


def rollback_retire(journal):
    """Move a retired module file back; resolve a retire that a crash interrupted."""
    source, original = journal.run.retired_to, journal.run.module_file
    if not check_rollback(journal):
        return {"run_id": journal.run_id, "changed": False, "state": journal.state.value}
    if _in_place(journal):
        journal.set_state(RunState.ROLLED_BACK)
        return {"run_id": journal.run_id, "changed": True, "state": journal.state.value}
    journal.faults.before("rollback move")
    _move_back(journal)
    try:
        journal.faults.before("state rolled_back")
        journal.set_state(RunState.ROLLED_BACK)
    except BaseException:
        # The journal still says retired: the file goes where it says (and should this move
        # fail too, the next rollback finds the file in place and only writes the journal).
        _move(original, paths.module_root_of(original), source, journal.state_root)
        raise
    return {"run_id": journal.run_id, "changed": True, "state": journal.state.value, "module_file": original}
