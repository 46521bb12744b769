# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn a finished build in the run's generation into a publishable plan.

For each module, in this order and each step journaled before it runs: the staged install
must be complete; a run marker is written into it; the module file is prepared with
``root`` set to the stable live path; the current live module file is recorded and backed
up durably; the stage moves to its hidden sibling ``<software>/<Name>/.<version>.<run_id>``.
Then the optional ``--prepare`` program runs (its output in the run's ``prepare.log``, in a
process group of its own), every staged tree must still carry build evidence, and the live
trees must be as they were before the build. Nothing live has changed when the plan is
refused.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import stat
from typing import Mapping, Optional

from ..common import errors, proc
from ..common.errors import setting
from . import fsutil, modulefile, paths
from .journal import RunState, StepKind

RUN_MARKER = ".eb-staged-rebuild-run"
PREPARE_LOG = "prepare.log"


def has_build_evidence(install):
    """A tree counts as built when it has the test builders' PAYLOAD or EasyBuild's easyconfig.

    The run marker does not count: it is written by this tool, not by a build.
    """
    if os.path.isfile(os.path.join(install, "PAYLOAD")):
        return True
    return any(os.path.isfile(path) for path in glob.glob(os.path.join(install, "easybuild", "*.eb")))


@contextlib.contextmanager
def owner_write_window(directory):
    """Give the owner write access to ``directory`` for the block, then restore its mode.

    EasyBuild can seal an install (``--read-only-installdir``); writing the marker, and
    moving the directory to another parent (which rewrites its ``..`` entry), both need
    write access to the directory itself.
    """
    # Through a descriptor: the block may rename the directory (stage-move does), and the
    # mode must come back on the directory itself, not on the name it had.
    fd = fsutil.open_nofollow(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & stat.S_IWUSR:
            yield
            return
        os.fchmod(fd, mode | stat.S_IWUSR)
        try:
            yield
        finally:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def record_live(journal, entry, skip):
    """Take the live-change record of one module: a SHA-256 of every live file, before the build."""
    if skip:
        entry.live_record = None
        return
    digest = json.dumps(fsutil.tree_digest(entry.stable_path), sort_keys=True, indent=2) + "\n"
    entry.live_record = journal.write_file(entry.live_record_name(), digest.encode("utf-8"))


def check_live(journal, entry):
    """Refuse the swap when a live file changed since the build started, naming the files."""
    if not entry.live_record:
        return
    record = fsutil.read_regular(entry.live_record, "live-change record", root=journal.state_root)
    before = json.loads(record)
    changed = fsutil.changed_paths(before, fsutil.tree_digest(entry.stable_path))
    if changed:
        shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
        raise errors.PublishError(
            f"the live tree {entry.stable_path} changed during the build ({shown}); nothing was swapped "
            f"({setting('skip_live_check')} skips this check)"
        )


def _prepare_module(journal, entry, staged_install, staged_module):
    try:
        text = modulefile.read_text(staged_module)
    except OSError as err:
        raise errors.PublishError(f"the build wrote no module file {staged_module}: {err.strerror}") from None
    built_root = modulefile.parse_root(text)
    if built_root is None:
        raise errors.PublishError(f"module file {staged_module} has no root assignment")
    if os.path.normpath(built_root) not in (os.path.normpath(staged_install), entry.stable_path):
        raise errors.PublishError(
            f"module file {staged_module} names root {built_root}, not the staged install {staged_install}"
        )
    prepared = modulefile.encode(modulefile.with_root(text, entry.stable_path))
    entry.prepared_module = journal.write_file(entry.prepared_module_name(), prepared)
    entry.new_module_sha256 = modulefile.module_hash(prepared)


def _back_up_module(journal, trees, entry):
    module_file = entry.module_file
    if os.path.islink(module_file):
        raise errors.UsageError(f"module file {module_file} is a symlink; refusing to replace it")
    if not os.path.lexists(module_file):
        entry.module_backup = None
        entry.old_module_sha256 = None
        return
    # From modules/all/<Name> opened without following a link: the backup rollback restores
    # is the live module file, never a file of a tree a swapped-in link points to.
    old = fsutil.read_regular(module_file, "module file", root=trees.modules)
    entry.module_backup = journal.write_file(entry.module_backup_name(), old)
    entry.old_module_sha256 = modulefile.module_hash(old)


def _staged_class_links(generation, entry):
    """Module-class links the build made (``modules/<class>/<module name>.lua``)."""
    modules = os.path.join(generation, "modules")
    base = os.path.basename(entry.module_file)
    links = []
    for link in sorted(
        glob.glob(os.path.join(modules, "*", glob.escape(os.path.dirname(entry.module)), base))
    ):
        if os.path.relpath(link, modules).split(os.sep)[0] != "all" and os.path.islink(link):
            links.append(os.path.relpath(link, modules).split(os.sep)[0])
    return links


def _run_prepare(prepare: str, env: Optional[Mapping[str, str]], run_dir: str) -> None:
    """Run the ``--prepare`` command line with ``sh -c``; refuse the plan when it fails.

    Its stdout and stderr go to ``prepare.log`` in the run's directory, never to the tool's
    own streams, where they would corrupt ``--json``. It runs in a process group of its own,
    killed whole when the tool stops (SIGTERM, an error), so nothing it started outlives the
    transaction that is then reversed.
    """
    log_path = os.path.join(run_dir, PREPARE_LOG)
    log_fd = fsutil.open_nofollow(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        result = proc.run_child(["/bin/sh", "-c", prepare], env=env, output_fd=log_fd)
    finally:
        os.close(log_fd)
    if result.returncode != 0:
        raise errors.PublishError(
            f"{setting('prepare')} {prepare!r} exited with status {result.returncode}; nothing was swapped; "
            f"its output is in {log_path}"
        )


def plan(journal, trees, generation, *, prepare=None, env=None):
    """Make every module of the journal ready to swap; refuse, changing nothing live, if one is not."""
    journal.set_state(RunState.PLANNING)
    for entry in journal.modules:
        module_paths = paths.ModulePaths(trees, entry.module, entry.install_subdir, journal.run_id)
        staged_install, staged_module = module_paths.staged_build(generation)
        if not os.path.isdir(staged_install) or not has_build_evidence(staged_install):
            raise errors.PublishError(
                f"the build installed no {entry.module}: {staged_install} has no easybuild/*.eb "
                f"(check that the easyconfigs given to EasyBuild build {entry.module}); nothing was swapped"
            )
        with journal.step(StepKind.MARKER, entry):
            # A sealed install stays sealed: the marker gets no write bit either.
            sealed = not os.stat(staged_install).st_mode & stat.S_IWUSR
            with owner_write_window(staged_install):
                fsutil.atomic_write(
                    os.path.join(staged_install, RUN_MARKER),
                    (journal.run_id + "\n").encode(),
                    mode=0o444 if sealed else 0o644,
                )

        with journal.step(StepKind.PREPARE_MODULE, entry):
            _prepare_module(journal, entry, staged_install, staged_module)
            entry.class_links = _staged_class_links(generation, entry)

        with journal.step(StepKind.BACKUP, entry):
            _back_up_module(journal, trees, entry)

        with journal.step(StepKind.STAGE_MOVE, entry):
            with owner_write_window(staged_install):
                fsutil.rename(staged_install, entry.retired_path, root=trees.software)
            entry.stage_ino = os.lstat(entry.retired_path).st_ino
            entry.live_ino = os.lstat(entry.stable_path).st_ino

    if prepare:
        with journal.step(StepKind.PREPARE_PROGRAM):
            _run_prepare(prepare, env, journal.run_dir)

    for entry in journal.modules:
        if not has_build_evidence(entry.retired_path):
            raise errors.PublishError(
                f"{entry.retired_path} lost its build evidence (PAYLOAD or easybuild/*.eb) "
                "before the swap; nothing was swapped"
            )
        check_live(journal, entry)
    # The run's own files, read from the state root down (never through a link).
    prepared = {
        entry.module: fsutil.read_regular(
            entry.prepared_module, "prepared module file", root=journal.state_root
        )
        for entry in journal.modules
    }
    order = modulefile.publish_order({module: modulefile.decode(data) for module, data in prepared.items()})
    journal.run.modules = sorted(journal.modules, key=lambda entry: order.index(entry.module))
    journal.save()
