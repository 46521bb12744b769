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
import stat

from ..common import errors
from . import fsutil, modulefile, swap


def exchange(trees, entry, on_step=None):
    """Swap the staged sibling and the live directory; the sibling then holds the other tree.

    Both names are in ``software/<Name>``, opened from the software root without following a
    link (``swap.exchange``'s ``root``)."""
    return swap.exchange(entry.retired_path, entry.stable_path, on_step=on_step, root=trees.software)


def write_module(trees, state_root, entry):
    """Put the prepared module file live, keeping the live file's owner, mode and ACLs.

    The prepared file is read from the run's directory under ``state_root``, and the module
    file written in ``modules/all/<Name>``, each through directories opened from their
    root without following a link: a swapped-in link can neither feed another tree's bytes
    into the live module file nor take the write elsewhere."""
    data = fsutil.read_regular(entry.prepared_module, "prepared module file", root=state_root)
    modulefile.replace_keeping_metadata(entry.module_file, data, root=trees.modules)


def restore_module(trees, state_root, entry):
    """Put the backed-up module file back; remove the new one when there was none before."""
    if entry.module_backup:
        modulefile.restore_file(
            entry.module_backup, entry.module_file, root=trees.modules, backup_root=state_root
        )
        return
    directory, name = fsutil.parent_of(entry.module_file, trees.modules)
    with directory:
        if directory.lstat(name) is not None:
            directory.unlink(name)
            directory.sync()


def class_link_path(trees, entry, module_class):
    return os.path.join(
        trees.modules, module_class, os.path.dirname(entry.module), os.path.basename(entry.module_file)
    )


def _class_link_state(trees, entry, module_class):
    """(what is at ``modules/<class>/Name/<file>``, its target if it is a link), read from the
    module root down without following a link on the way: read through a swapped-in link,
    "already restored" would leave the new link in place. (None, None) when nothing is there,
    the directories included."""
    link = class_link_path(trees, entry, module_class)
    try:
        directory, name = fsutil.parent_of(link, trees.modules)
    except FileNotFoundError:
        return None, None
    with directory:
        info = directory.lstat(name)
        is_link = info is not None and stat.S_ISLNK(info.st_mode)
        return info, os.readlink(name, dir_fd=directory.fd) if is_link else None


def class_link_target(trees, entry, module_class):
    """The target of ``modules/<class>/Name/<file>`` now, or None when it is no link."""
    return _class_link_state(trees, entry, module_class)[1]


def current_class_link(trees, entry, module_class):
    """The target of ``modules/<class>/Name/<file>`` now, or None; refuses a non-link there."""
    info, target = _class_link_state(trees, entry, module_class)
    if info is not None and target is None:
        link = class_link_path(trees, entry, module_class)
        raise errors.PublishError(f"module-class link {link} is not a symlink; refusing to replace it")
    return target


def set_class_link(trees, entry, module_class):
    """Point ``modules/<class>/Name/<file>`` at the live module file (absolute, as EasyBuild does).

    Returns what was there before (a link target, or None) so the inverse can restore it.
    """
    previous = current_class_link(trees, entry, module_class)
    if previous != entry.module_file:
        _replace_link(trees, class_link_path(trees, entry, module_class), entry.module_file)
    return previous


def restore_class_link(trees, entry, module_class, previous):
    link = class_link_path(trees, entry, module_class)
    if previous is None:
        try:
            directory, name = fsutil.parent_of(link, trees.modules)
        except FileNotFoundError:
            return  # no modules/<class>/<Name>: no link to remove
        with directory:
            info = directory.lstat(name)
            if info is not None and stat.S_ISLNK(info.st_mode):
                directory.unlink(name)
                directory.sync()
    elif class_link_target(trees, entry, module_class) != previous:
        _replace_link(trees, link, previous)


def _replace_link(trees, link, target):
    """Replace ``link`` by a symlink to ``target`` in one rename (a random temporary name,
    then a rename onto the link), in ``modules/<class>/<Name>`` opened from the module root
    without following a link and made when missing."""
    with fsutil.Directory.open(os.path.dirname(link), trees.modules, create_mode=0o755) as directory:
        name = os.path.basename(link)
        # A random name: symlink() fails rather than follow or reuse an existing entry.
        temp = f".{name}.{binascii.hexlify(os.urandom(8)).decode()}.tmp"
        directory.symlink(target, temp)
        try:
            directory.rename(temp, directory, name)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                directory.unlink(temp)
            raise
        directory.sync()


def remove_generation(trees, generation):
    """Remove the run's build area as far as the disk lets it; gc takes what stays. A
    refusal (a link or a file where a directory goes) leaves that entry alone as well."""
    with contextlib.suppress(OSError, errors.UsageError):
        fsutil.remove_tree(generation, root=trees.software)
    with contextlib.suppress(OSError, errors.UsageError):
        # Only when no other run's generation is there.
        directory, name = fsutil.parent_of(os.path.dirname(generation), trees.software)
        with directory:
            directory.rmdir(name)


def still_staged(trees, entry):
    """True while the sibling holds this run's staged inode and the live path the old one
    (both read from the software root down, never through a link)."""
    if entry.stage_ino is None:
        return False
    sibling = fsutil.lstat_below(entry.retired_path, trees.software)
    live = fsutil.lstat_below(entry.stable_path, trees.software)
    return (
        sibling is not None
        and stat.S_ISDIR(sibling.st_mode)
        and sibling.st_ino == entry.stage_ino
        and live is not None
        and live.st_ino == entry.live_ino
    )


def discard_stage(journal, generation):
    """A refused run leaves the trees as they were: its generation and staged siblings go.

    A sibling is removed only if it is still the staged inode this run moved there.
    """
    trees = journal.trees
    for entry in journal.modules:
        if still_staged(trees, entry):
            fsutil.remove_tree(entry.retired_path, root=trees.software)
    remove_generation(trees, generation)
