# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the staged-rebuild Ansible modules share, kept free of Ansible itself.

The modules stay thin: their arguments in, one call of ``commands``, the result out. This
holds the options they all take, the one-line failure of a call, the snapshot of the live
trees that diff mode shows before and after, and what makes a result one Ansible takes:
valid Unicode (``unicode_result``; the controller refuses a string that is not) and
warnings that a terminal shows as they are (``warning``).
"""

from __future__ import annotations

import os
import stat

from ..common.printable import printable, unicode_result
from . import commands, naming, paths, settings
from . import journal as journals
from .request import RebuildRequest, configured_trees

NO_MODULE_FILE = "(no module file)\n"
# A link, a directory or a FIFO where a module file was asked for: its content is not shown.
NOT_A_FILE = "(not a regular file)\n"
# Check mode's diff: the live directory would be another one, whose inode is not known yet.
REPLACED = "replaced"
_IDENTITY = {None: "absent", REPLACED: "replaced by a new directory"}
# Settings that only the command line offers (--prepare): a module's message names the flag,
# since the module has no option of that name (a run started on the command line may fail so).
_COMMAND_LINE_ONLY = frozenset(
    name for name, (offered, _hint) in settings.options(RebuildRequest).items() if not offered.module
)


def common_arguments() -> dict:
    """The argument spec of the options in the ``hpcstack.ops.staged_rebuild`` doc fragment."""
    return {"state_root": {"type": "path"}, "lock_timeout": {"type": "float", "default": 0.0}}


def state_root(params, environ) -> str:
    """The ``state_root`` option, else the host's EB_STAGED_REBUILD_STATE_ROOT; refuses neither."""
    return settings.state_root(params, environ)


def host_trees(environ):
    """The live trees the host's EasyBuild variables name (None: none is set): the journals
    that resume, rollback and gc act on must name these."""
    return configured_trees({}, environ)


def option_name(name) -> str:
    """A setting as a module's message names it: its option, or the flag only the command
    line offers."""
    return settings.flag(name) if name in _COMMAND_LINE_ONLY else name


def run(call, check_mode, diff_mode=False, snapshot=None, progress=None):
    """One command for a module: ``(result, None)``, or ``(None, failure)`` when it failed.

    ``call(dry_run)`` runs the command, or in check mode its dry run, whose ``would_change``
    becomes ``changed``. In diff mode ``snapshot()`` is taken before and after; in check mode
    the after is the prediction: each live directory replaced, or a retired file gone.
    ``failure`` holds ``fail_json``'s arguments: ``msg``, one line that names the module's
    options, and ``error``, the error's stable kind (``lock_held``: another run holds the lock),
    and the error's details (a failed build's ``easybuild_reason`` and ``build_log``).
    With ``progress`` (the list the call appended its progress lines to), both carry it as
    ``progress``. Both are valid Unicode (``unicode_result``).
    """
    carried = {} if progress is None else {"progress": progress}
    try:
        before = snapshot() if diff_mode and snapshot else None
        with commands.sigterm_raises():
            result = call(check_mode)
        if check_mode:
            result["changed"] = result.pop("would_change", False)
        if before is not None:
            after = _predicted(before, result["changed"]) if check_mode else snapshot()
            result["diff"] = {"before": render(before), "after": render(after)}
    except commands.FAILURES as err:
        failure = {
            **commands.failure_details(err),
            "msg": commands.failure_message(err, name_of=option_name),
            "error": commands.failure_kind(err),
        }
        return None, unicode_result(dict(carried, **failure))
    return unicode_result(dict(result, **carried)), None


def warning(text) -> str:
    """A warning, which the controller shows on its terminal as it is: ``printable``."""
    return printable(text)


def _predicted(before, changes) -> dict:
    if not changes:
        return before
    after = {}
    for module, state in before.items():
        if state["live_dir"] is None:  # a retired module file: moved away, or back
            text = NO_MODULE_FILE if state["module_text"] != NO_MODULE_FILE else "(the retired copy)\n"
            after[module] = dict(state, module_text=text)
        else:
            after[module] = dict(state, live_inode=REPLACED)
    return after


def live_snapshot(software, modules, module_names) -> dict:
    """For each ``Name/Version``: the live directory's inode and the module file's text."""
    trees = paths.Trees(software, modules)
    snapshot = {}
    for value in module_names:
        located = naming.locate(trees, value)
        entry = paths.ModulePaths(trees, located.module, located.install_subdir, "snapshot")
        snapshot[value] = {
            "live_dir": entry.stable_path,
            "live_inode": _inode(entry.stable_path),
            "module_file": entry.module_file(),
            "module_text": _file_text(entry.module_file()),
        }
    return snapshot


def run_snapshot(state_root, run_id) -> dict:
    """The live state that run ``run_id`` changed: its modules, or the file it retired."""
    journal = journals.find(commands.existing_state_root(state_root), run_id)
    if journal.run.kind is journals.RunKind.RETIRE:
        return file_snapshot(journal.run.module_file)
    trees = journal.trees
    return live_snapshot(trees.software, trees.modules, [entry.module for entry in journal.modules])


def file_snapshot(path) -> dict:
    """One module file on its own (what a retire moves): its text, or that it is not there."""
    path = os.path.abspath(path)
    return {
        path: {"live_dir": None, "live_inode": None, "module_file": path, "module_text": _file_text(path)}
    }


def render(snapshot) -> str:
    """A snapshot as the text that diff mode compares, one block per module. The controller
    shows it on its terminal as it is: each line is ``printable`` (a tab kept, as a module
    file may indent with one), so a module file that another user wrote cannot drive it."""
    blocks = []
    for module, state in sorted(snapshot.items()):
        if state["live_dir"] is not None:
            identity = _IDENTITY.get(state["live_inode"], f"inode {state['live_inode']}")
            blocks.append(f"# {module}: {state['live_dir']} {identity}\n")
        blocks.append(f"# {state['module_file']}\n{state['module_text']}")
    return "\n".join(
        "\t".join(printable(part) for part in line.split("\t")) for line in "".join(blocks).split("\n")
    )


def diff(before, after) -> dict:
    """Ansible's diff dict for two snapshots."""
    return {"before": render(before), "after": render(after)}


def _inode(path):
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def _file_text(path) -> str:
    """The text of a regular file at ``path``, read before the core has checked the path:
    without following a link (whose target could be any file) and without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return NO_MODULE_FILE
    except OSError:
        return NOT_A_FILE
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return NOT_A_FILE
        text = handle.read().decode("utf-8", "replace")
    return text if text.endswith("\n") else text + "\n"
