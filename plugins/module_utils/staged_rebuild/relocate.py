# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make a staged tree name its final live paths.

EasyBuild bakes its install path into what it writes (the module's ``root``, the devel file,
logs, scripts, ``.pc``/``.cmake``/``.la`` files, often RPATHs). A build that ran under the
generation directory must be rewritten before it is published: every occurrence of a
generation path becomes the live path it stands for. Text files (no NUL byte) and symlink
targets are rewritten in place, keeping mode, owner, times and hard links; a binary cannot be
rewritten safely (string lengths, checksums), so binaries that still name the generation are
returned for the caller to refuse, or to accept explicitly.
"""

from __future__ import annotations

import base64
import errno
import mmap
import os
import re
import stat

from ..common import errors
from . import fsutil

# One chunk of Lmod's saved module table, as a Lua or Tcl modulefile sets it.
_MODULE_TABLE_CHUNK = re.compile(rb"""(_ModuleTable(\d{3})_)["'\s,{]+([A-Za-z0-9+/=]*)""")
_MODULE_TABLE_SIZE = re.compile(rb"""_ModuleTable_Sz_["'\s,{]+(\d+)""")
_MODULE_TABLE_MARK = b"_ModuleTable001_"


def mapping(generation, software, modules):
    """The rewrites for a generation, longest first: its trees, then the generation itself.

    The generation plays the role of an install path (it holds ``software/`` and
    ``modules/``), so a bare mention of it (``--bwrap-installpath=...`` in a log) becomes the
    live install path, the parent of the live software tree.
    """
    pairs = [
        (os.path.join(generation, "software"), software),
        (os.path.join(generation, "modules"), modules),
        (generation, os.path.dirname(software)),
    ]
    return [(os.fsencode(old), os.fsencode(new)) for old, new in pairs]


def _names_generation(data, rewrites):
    return any(data.find(old) != -1 for old, _new in rewrites)


def _replace_paths(data, rewrites):
    for old, new in rewrites:
        data = data.replace(old, new)
    return data


def _module_table_chunks(data):
    """``{number: match}`` of Lmod's saved module table (``_ModuleTable001_`` ...) in ``data``."""
    return {int(match.group(2)): match for match in _MODULE_TABLE_CHUNK.finditer(data)}


def _rewrite_module_table(data, rewrites):
    """Rewrite the paths inside Lmod's base64-encoded module table, which EasyBuild's devel
    file keeps (its ``mpathA`` names the build's MODULEPATH).

    Lmod concatenates the chunks ``1.._ModuleTable_Sz_`` before decoding and does not care
    where one ends, so the whole new encoding goes into the first and the others of those are
    emptied. A chunk past the size is a leftover of an earlier table (EasyBuild writes the
    variables that changed): Lmod never reads it, and neither does this.
    """
    chunks = _module_table_chunks(data)
    size = _MODULE_TABLE_SIZE.search(data)
    # Without a size (unchanged, so EasyBuild did not write it), the chunks there are the table.
    count = int(size.group(1)) if size else len(chunks)
    chunks = {number: match for number, match in chunks.items() if number <= count}
    if not chunks or sorted(chunks) != list(range(1, count + 1)):
        return data
    try:
        encoded = b"".join(chunks[number].group(3) for number in sorted(chunks))
        table = base64.b64decode(encoded, validate=True)
    except ValueError:
        return data
    rewritten = _replace_paths(table, rewrites)
    if rewritten == table:
        return data
    values = {number: b"" for number in chunks}
    values[1] = base64.b64encode(rewritten)
    # From the end, so that earlier offsets stay valid.
    for number in sorted(chunks, reverse=True):
        match = chunks[number]
        data = data[: match.start(3)] + values[number] + data[match.end(3) :]
    return data


def live_name(path, rewrites):
    """Where ``path``, a file in the generation, will be once published."""
    return os.fsdecode(_replace_paths(os.fsencode(path), rewrites))


def _rewrite_bytes(data, rewrites):
    return _rewrite_module_table(_replace_paths(data, rewrites), rewrites)


def _read_if_named(path, rewrites):
    """What to do with one file: None (it names no generation path, plainly or in a module
    table), ``"binary"`` (it has a NUL byte and names one), or its bytes (text to rewrite)."""
    # The walk saw a regular file by name; what is opened is checked again by descriptor, so
    # a FIFO swapped in after the walk's lstat neither blocks the open nor is read.
    fd = fsutil.open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise errors.UsageError(f"{path} in the staged install is no longer a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size == 0:
            return None
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            named = _names_generation(view, rewrites)
            if view.find(b"\0") != -1:
                return "binary" if named else None
            if not named and view.find(_MODULE_TABLE_MARK) == -1:
                return None
            return view[:]


def _rewrite_file(path, data):
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    # A sealed install (--read-only-installdir) has no write bits; open the file for this write.
    if not mode & stat.S_IWUSR:
        os.chmod(path, mode | stat.S_IWUSR)
    try:
        fd = fsutil.open_nofollow(path, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        # Always: besides a sealed mode, a write by a non-root owner clears setuid and setgid.
        os.chmod(path, mode)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def _rewrite_link(path, rewrites):
    target = os.fsencode(os.readlink(path))
    if not _names_generation(target, rewrites):
        return False
    directory = os.path.dirname(path)
    dir_mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if not dir_mode & stat.S_IWUSR:
        os.chmod(directory, dir_mode | stat.S_IWUSR)
    try:
        replacement = path + ".eb-staged-rebuild-link"
        os.symlink(os.fsdecode(_rewrite_bytes(target, rewrites)), replacement)
        os.replace(replacement, path)
    finally:
        if not dir_mode & stat.S_IWUSR:
            os.chmod(directory, dir_mode)
    return True


def _walk(root):
    """Every non-directory under ``root`` (or ``root`` itself if it is a file), never following links.

    Its own stack rather than ``os.walk``, which before Python 3.12 recurses once per level (a
    chain a thousand directories deep raised ``RecursionError``) and passes over a directory
    it cannot list without a word: a file there would go unchecked. A directory that cannot
    be listed refuses the run instead; one too deep for its path to be named says so.
    """
    if not os.path.isdir(root) or os.path.islink(root):
        yield root
        return
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            # Listed whole before anything is yielded: the caller replaces links in it.
            with os.scandir(directory) as entries:
                found = [(entry.path, entry.is_dir(follow_symlinks=False)) for entry in entries]
        except OSError as err:
            if err.errno == errno.ENAMETOOLONG:
                raise errors.UsageError(
                    f"{root} holds directories nested too deep for their paths to be named "
                    f"({len(os.fsencode(directory))} bytes); nothing was swapped"
                ) from None
            raise
        for path, is_dir in found:
            if is_dir:
                pending.append(path)
            else:
                yield path


def relocate(roots, rewrites):
    """Rewrite the generation paths under ``roots``; return ``(rewritten, binaries)``.

    ``binaries`` are the files with NUL bytes that name a generation path: left as they are.
    """
    rewritten, binaries = [], []
    for root in roots:
        for path in _walk(root):
            if not os.path.lexists(path):
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                if _rewrite_link(path, rewrites):
                    rewritten.append(path)
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            found = _read_if_named(path, rewrites)
            if found is None:
                continue
            if found == "binary":
                binaries.append(path)
                continue
            new = _rewrite_bytes(found, rewrites)
            if new != found:
                _rewrite_file(path, new)
                rewritten.append(path)
    return rewritten, binaries
