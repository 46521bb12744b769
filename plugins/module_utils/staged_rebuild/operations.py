# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reversible operations of a transaction, each with its inverse.

A publish is a sequence of these (swap every directory, then write every module file and
class link); rollback and the reversal of a failed publish run the inverses in the
opposite order. Each function does one thing to the disk and nothing to the journal: the
caller journals the step before calling it.
"""

from __future__ import annotations

import binascii
import contextlib
import os
import shutil
import stat
import sys

from ..common import errors
from . import fsutil, modulefile, swap


def exchange(entry, on_step=None):
    """Swap the staged sibling and the live directory; the sibling then holds the other tree."""
    return swap.exchange(entry.retired_path, entry.stable_path, on_step=on_step)


def write_module(entry):
    """Put the prepared module file live, keeping the live file's owner, mode and ACLs."""
    prepared = fsutil.read_regular(entry.prepared_module, "prepared module file")
    modulefile.replace_keeping_metadata(entry.module_file, prepared)


def restore_module(entry):
    """Put the backed-up module file back; remove the new one when there was none before."""
    if entry.module_backup:
        modulefile.restore_file(entry.module_backup, entry.module_file)
    elif os.path.lexists(entry.module_file):
        os.unlink(entry.module_file)
        fsutil.fsync_dir(os.path.dirname(entry.module_file))


def class_link_path(trees, entry, module_class):
    return os.path.join(trees.modules, module_class, entry.name, os.path.basename(entry.module_file))


def current_class_link(trees, entry, module_class):
    """The target of ``modules/<class>/Name/<file>`` now, or None; refuses a non-link there."""
    link = class_link_path(trees, entry, module_class)
    if os.path.islink(link):
        return os.readlink(link)
    if os.path.lexists(link):
        raise errors.PublishError(f"module-class link {link} is not a symlink; refusing to replace it")
    return None


def set_class_link(trees, entry, module_class):
    """Point ``modules/<class>/Name/<file>`` at the live module file (absolute, as EasyBuild does).

    Returns what was there before (a link target, or None) so the inverse can restore it.
    """
    previous = current_class_link(trees, entry, module_class)
    if previous != entry.module_file:
        _replace_link(class_link_path(trees, entry, module_class), entry.module_file)
    return previous


def restore_class_link(trees, entry, module_class, previous):
    link = class_link_path(trees, entry, module_class)
    if previous is None:
        if os.path.islink(link):
            os.unlink(link)
            fsutil.fsync_dir(os.path.dirname(link))
    elif not os.path.islink(link) or os.readlink(link) != previous:
        _replace_link(link, previous)


def _replace_link(link, target):
    """Replace ``link`` by a symlink to ``target`` in one rename (a temp name, then os.replace)."""
    directory = os.path.dirname(link)
    os.makedirs(directory, exist_ok=True)
    # A random name: symlink() fails rather than follow or reuse an existing entry.
    temp = os.path.join(
        directory, f".{os.path.basename(link)}.{binascii.hexlify(os.urandom(8)).decode()}.tmp"
    )
    os.symlink(target, temp)
    try:
        os.replace(temp, link)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise
    fsutil.fsync_dir(directory)


def remove_tree(path):
    """Remove the tree ``path`` (never following links), sealed directories included.

    A sealed install (``--read-only-installdir``) has directories without owner write: a
    directory inside the tree gets that bit back and the removal is tried again. Nothing
    outside the tree is changed, and any other error is raised.
    """
    root = os.path.abspath(path)

    def unseal_and_retry(function, failed, error):
        error = error if isinstance(error, BaseException) else error[1]  # onerror passes exc_info
        parent = os.path.dirname(failed)
        inside = parent == root or parent.startswith(root + "/")
        if not isinstance(error, PermissionError) or function is os.path.islink or not inside:
            raise error
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IWUSR | stat.S_IXUSR)
        function(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(root, onexc=unseal_and_retry)
    else:
        shutil.rmtree(root, onerror=unseal_and_retry)


def remove_generation(generation):
    with contextlib.suppress(OSError):
        remove_tree(generation)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(generation))  # only when no other run's generation is there


def _still_staged(entry):
    """True while the sibling holds this run's staged inode and the live path the old one."""
    sibling = entry.retired_path
    if entry.stage_ino is None or os.path.islink(sibling) or not os.path.isdir(sibling):
        return False
    return (
        os.lstat(sibling).st_ino == entry.stage_ino and os.lstat(entry.stable_path).st_ino == entry.live_ino
    )


def discard_stage(journal, generation):
    """A refused run leaves the trees as they were: its generation and staged siblings go.

    A sibling is removed only if it is still the staged inode this run moved there.
    """
    for entry in journal.modules:
        if _still_staged(entry):
            remove_tree(entry.retired_path)
    remove_generation(generation)
