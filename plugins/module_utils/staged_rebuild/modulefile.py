# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read, rewrite and publish the Lmod module files EasyBuild writes.

Reading: ``parse_root`` finds the install directory of the root assignment (Lua
``local root = "..."``, Tcl ``set root ...``), ``dependencies`` the modules a file loads, and
``publish_order`` puts a transaction's modules dependencies first. A file is Tcl when it
starts with the ``#%Module`` cookie (Lmod requires it there), Lua otherwise. Both readers
skip comments and string contents through a small scanner rather than line regexes: EasyBuild
writes the help text into a Lua long string or a Tcl brace word, and a line of help such as
``module load foo`` must not count as a dependency.

Rewriting: ``with_root`` points the root assignment at another directory and keeps every
other byte, except literal copies of the old root elsewhere in the file.

Publishing: ``replace_keeping_metadata`` and ``restore_file`` replace a module file through
``fsutil.durable_replace`` (a random temporary file in the same directory, fsync,
``os.replace``, fsync of the directory) and keep the destination's owner, mode and the
access control list attributes in ``ACL_XATTRS``: a site that restricts a licensed
package's module file with an ACL must not find it world-readable after a rebuild.
"""

from __future__ import annotations

import collections
import errno
import functools
import hashlib
import heapq
import os
import re
import stat
from typing import Dict, List, Pattern, Set

from ..common import errors
from . import fsutil

# The POSIX access list, the generic NFSv4 list and the native GPFS list: the access control
# lists a module file can carry on the filesystems this tool is deployed on.
ACL_XATTRS = ("system.posix_acl_access", "system.nfs4_acl", "gpfs.acl")

NEW_FILE_MODE = 0o644

# getxattr/removexattr: the file has no such attribute (ENODATA), or the filesystem has no
# such namespace at all (EOPNOTSUPP; gpfs.* or nfs4_acl on ext4). Both mean "absent".
_ABSENT = frozenset((errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP))

RootAssignment = collections.namedtuple("RootAssignment", "value start end language")
RootAssignment.__doc__ = """The root assignment: its literal ``value`` and where it sits
(``text[start:end] == value``, inside the quotes or braces), in a ``"lua"`` or ``"tcl"`` file."""


def decode(data: bytes) -> str:
    """A module file's bytes as text; bytes that are not UTF-8 (a Latin-1 description) stay
    as surrogates, so that ``encode`` gives back every byte as it was."""
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def read_text(path: str) -> str:
    """The text of the module file ``path``: a regular file, not followed if a link."""
    return decode(fsutil.read_regular(path, "module file"))


def module_hash(data):
    """SHA-256 (hex) of a module file's bytes; ``str`` is hashed as the bytes it came from."""
    if isinstance(data, str):
        data = encode(data)
    return hashlib.sha256(data).hexdigest()


def is_tcl(text):
    """Whether ``text`` is a Tcl module file: Lmod reads a file as Tcl only after ``#%Module``."""
    return text.startswith("#%Module")


# --- Lua ------------------------------------------------------------------------------------

_FILL = "\x00"
_LUA_TOKEN = re.compile(r"--\[(=*)\[|--|[\"']|\[(=*)\[")
_LUA_SHORT_STRING = {
    '"': re.compile(r'(?:[^"\\\n]|\\[\s\S])*'),
    "'": re.compile(r"(?:[^'\\\n]|\\[\s\S])*"),
}
_NOT_NEWLINE = re.compile(r"[^\n]")


def _lua_long_end(text, pos, level):
    """End of a long bracket opened with ``level`` equals signs; ``len(text)`` if unclosed."""
    close = text.find("]" + level + "]", pos)
    return len(text) if close < 0 else close


# Reading a module file's root and its loads masks it twice; a scan of a whole tree does both.
@functools.lru_cache(maxsize=4)
def _lua_mask(text):
    """``text`` with comments blanked and string contents filled with NUL, same length.

    Quote characters and long-bracket delimiters stay and newlines stay, so a pattern
    matched on the mask has the same offsets in ``text`` and the same line numbers; only
    code outside strings and comments can match a keyword.
    """
    out = []
    pos = 0
    while True:
        token = _LUA_TOKEN.search(text, pos)
        if token is None:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos : token.start()])
        start, word = token.start(), token.group(0)
        if token.group(1) is not None:
            close = _lua_long_end(text, token.end(), token.group(1))
            pos = min(len(text), close + len(token.group(1)) + 2)
            out.append(_NOT_NEWLINE.sub(" ", text[start:pos]))
        elif word == "--":
            pos = text.find("\n", start)
            pos = len(text) if pos < 0 else pos
            out.append(" " * (pos - start))
        elif word in "\"'":
            # The pattern matches the empty string too, so there is always a match.
            stop = _match_end(_LUA_SHORT_STRING[word], text, token.end())
            out.append(word + _FILL * (stop - token.end()))
            pos = stop
            if text.startswith(word, pos):
                out.append(word)
                pos += 1
        else:
            close = _lua_long_end(text, token.end(), token.group(2))
            out.append(word + _NOT_NEWLINE.sub(_FILL, text[token.end() : close]))
            pos = close


_LUA_ROOT = re.compile(r"^[ \t]*local[ \t]+root[ \t]*=[ \t]*([\"'])(\x00*)\1[ \t\r]*;?[ \t\r]*$", re.M)
_LUA_CALL = re.compile(r"(?<![\w.:])(?:depends_on|load)\s*\(")
_LUA_ARG = re.compile(r"\s*([\"'])(\x00*)\1\s*([,)])")


def _lua_root(text):
    found = _LUA_ROOT.search(_lua_mask(text))
    if found is None:
        return None
    start, end = found.span(2)
    return RootAssignment(text[start:end], start, end, "lua")


def _lua_dependencies(text):
    masked = _lua_mask(text)
    names = []
    for call in _LUA_CALL.finditer(masked):
        pos = call.end()
        # Only string-literal arguments name a module; a computed one (a variable,
        # between(...)) ends the list, since what it loads is not known here.
        while True:
            arg = _LUA_ARG.match(masked, pos)
            if arg is None:
                break
            names.append(text[arg.start(2) : arg.end(2)])
            if arg.group(3) == ")":
                break
            pos = arg.end()
    return names


# --- Tcl ------------------------------------------------------------------------------------

_TCL_BLANK = " \t\r\f\v"
_TCL_WORD_END = _TCL_BLANK + "\n;"


def _tcl_skip(text, pos, end, chars):
    while pos < end:
        if text[pos] in chars:
            pos += 1
        elif text.startswith("\\\n", pos):
            pos += 2
        else:
            break
    return pos


def _tcl_comment_end(text, pos, end):
    # A backslash before the newline continues the comment onto the next line.
    while pos < end and text[pos] != "\n":
        pos += 2 if text[pos] == "\\" else 1
    return min(pos, end)


def _tcl_brace_end(text, pos, end):
    depth = 0
    while pos < end:
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return end


def _tcl_bracket_end(text, pos, end):
    depth = 0
    while pos < end:
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            pos = _tcl_brace_end(text, pos, end)
            continue
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return end


def _tcl_quote_end(text, pos, end):
    pos += 1
    while pos < end:
        char = text[pos]
        if char == "\\":
            pos += 2
        elif char == "[":
            pos = _tcl_bracket_end(text, pos, end)
        elif char == '"':
            return pos + 1
        else:
            pos += 1
    return end


def _tcl_word_end(text, pos, end):
    if text[pos] == "{":
        pos = _tcl_brace_end(text, pos, end)
    elif text[pos] == '"':
        pos = _tcl_quote_end(text, pos, end)
    # Tcl wants a separator after a closing brace or quote; scanning on keeps {*}list and a
    # malformed word in one word instead of inventing a new command from its tail.
    while pos < end and text[pos] not in _TCL_WORD_END:
        if text[pos] == "\\":
            pos += 2
        elif text[pos] == "[":
            pos = _tcl_bracket_end(text, pos, end)
        else:
            pos += 1
    return min(pos, end)


def _tcl_commands(text, pos, end):
    """The commands of the Tcl script ``text[pos:end]``, each a list of ``(start, end)`` word spans.

    Comments (``#`` where a command starts) are skipped; braces, quotes and brackets keep
    their contents in one word, so a brace word of help text is one word, never commands.
    """
    commands = []
    while pos < end:
        pos = _tcl_skip(text, pos, end, _TCL_WORD_END)
        if pos >= end:
            break
        if text[pos] == "#":
            pos = _tcl_comment_end(text, pos, end)
            continue
        words = []
        while True:
            pos = _tcl_skip(text, pos, end, _TCL_BLANK)
            if pos >= end or text[pos] in "\n;":
                break
            word_end = _tcl_word_end(text, pos, end)
            words.append((pos, word_end))
            pos = word_end
        commands.append(words)
    return commands


def _tcl_literal(text, span):
    """``(value, start, end)`` of a word with no substitution in it, else None."""
    start, end = span
    word = text[start:end]
    if len(word) >= 2 and word[0] == "{" and word[-1] == "}":
        start, end, refused = start + 1, end - 1, "\\"
    elif len(word) >= 2 and word[0] == '"' and word[-1] == '"':
        start, end, refused = start + 1, end - 1, "\\$["
    else:
        refused = '\\$[{}"'
    value = text[start:end]
    if any(char in value for char in refused):
        return None
    return value, start, end


def _tcl_word(text, span):
    literal = _tcl_literal(text, span)
    return None if literal is None else literal[0]


def _tcl_if_bodies(text, words):
    """Spans of the script bodies of ``if c b ?elseif c b? ?else b?`` that are brace words."""
    bodies = []
    index = 1
    while index + 1 < len(words):
        index += 1  # the condition
        if _tcl_word(text, words[index]) == "then":
            index += 1
        if index >= len(words):
            break
        bodies.append(words[index])
        index += 1
        keyword = _tcl_word(text, words[index]) if index < len(words) else None
        if keyword == "elseif":
            index += 1  # onto the condition, which the loop steps over
            continue
        if keyword == "else":
            index += 1
        if index < len(words):
            bodies.append(words[index])
        break
    return [(start + 1, end - 1) for start, end in bodies if text[start] == "{" and text[end - 1] == "}"]


def _tcl_load_arguments(text, words):
    head = [_tcl_word(text, span) for span in words[:2]]
    if head and head[0] == "depends-on":
        return words[1:]
    if len(head) == 2 and head[0] == "module" and head[1] in ("load", "add"):
        return words[2:]
    return []


def _tcl_dependencies(text, pos=0, end=None):
    end = len(text) if end is None else end
    names = []
    for words in _tcl_commands(text, pos, end):
        for span in _tcl_load_arguments(text, words):
            name = _tcl_word(text, span)
            if name and not name.startswith("-"):
                names.append(name)
        if words and _tcl_word(text, words[0]) == "if":
            for start, stop in _tcl_if_bodies(text, words):
                names.extend(_tcl_dependencies(text, start, stop))
    return names


def _tcl_root(text):
    for words in _tcl_commands(text, 0, len(text)):
        if len(words) == 3 and [_tcl_word(text, span) for span in words[:2]] == ["set", "root"]:
            literal = _tcl_literal(text, words[2])
            if literal is None:
                return RootAssignment(None, words[2][0], words[2][1], "tcl")
            return RootAssignment(literal[0], literal[1], literal[2], "tcl")
    return None


# --- Reading and rewriting ------------------------------------------------------------------


def root_assignment(text):
    """The first root assignment of the module file ``text`` as a ``RootAssignment``, or None.

    Lua: ``local root = "<dir>"`` (or single quotes) as a statement of its own, outside
    comments. Tcl: the top-level command ``set root <dir>``, ``"<dir>"`` or ``{<dir>}``. A
    ``value`` of None means the assignment is there but not a plain literal (a variable, an
    escape, a concatenation follows), which no reader here can resolve.
    """
    found = _tcl_root(text) if is_tcl(text) else _lua_root(text)
    if found is None or found.value is None:
        return found
    if not found.value or "\\" in found.value:
        return found._replace(value=None)
    return found


def parse_root(text):
    """The install directory the module file ``text`` assigns to ``root``, or None.

    None when there is no root assignment or it is not a plain literal; callers refuse such
    a file (retire needs the software directory, publish needs to rewrite it).
    """
    found = root_assignment(text)
    return None if found is None else found.value


# What cannot go into the file unquoted or unescaped: with_root refuses a new root holding
# any of these rather than write a module file that Lmod would read differently.
_UNSAFE_ROOT = {
    "lua": re.compile(r"[\"'\\\x00-\x1f\x7f]"),
    "tcl": re.compile(r"[\s\"{}\[\]$\\;\x00-\x1f\x7f]"),
}
_PATH_CHARS = r"\w.+\-~@%"


def _old_root_pattern(old_root):
    """Literal copies of ``old_root`` that are the whole directory, not a longer name.

    ``/apps/TinyApp/1.0`` matches in ``/apps/TinyApp/1.0/bin`` but not in
    ``/apps/TinyApp/1.0.1`` or ``/stage/apps/TinyApp/1.0``.
    """
    return re.compile(
        rf"(?<![{_PATH_CHARS}/]){re.escape(old_root)}(?![{_PATH_CHARS}])",
    )


def with_root(text, new_root):
    """``text`` with its root assignment set to ``new_root``; every other byte kept.

    Literal copies of the old root elsewhere in the file (EasyBuild writes some paths in
    full, such as ``EBDEVEL*``) become ``new_root`` too, so the file names no trace of the
    stage. A copy counts only when it is the whole directory (see ``_old_root_pattern``);
    an old root of ``/`` is rewritten in the assignment only. Raises ``UsageError`` when
    ``text`` has no literal root assignment, or when ``new_root`` holds a character that
    would need quoting or escaping in the file's language.
    """
    found = root_assignment(text)
    if found is None or found.value is None:
        raise errors.UsageError(f"the module file has no literal root assignment to point at {new_root}")
    unsafe = _UNSAFE_ROOT[found.language].search(new_root)
    if not new_root or unsafe:
        raise errors.UsageError(
            f"cannot write root {new_root!r} into a {found.language} module file: it would need quoting"
        )
    spans = [(found.start, found.end)]
    old_root = found.value.rstrip("/")
    if old_root and old_root != new_root:
        for copy in _old_root_pattern(old_root).finditer(text):
            if copy.end() <= found.start or copy.start() >= found.end:
                spans.append(copy.span())
    pieces = []
    pos = 0
    for start, end in sorted(spans):
        pieces.append(text[pos:start])
        pieces.append(new_root)
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def dependencies(text):
    """Module names the module file ``text`` loads, in file order, each once.

    Lua: string arguments of ``depends_on(...)`` and ``load(...)`` (several, either quote);
    not ``try_load``, ``unload`` or a method called ``load``. Tcl: the arguments of
    ``module load`` / ``module add`` and ``depends-on``, at top level or in an ``if`` body
    (the guarded ``if { ![ is-loaded X ] } { module load X }`` of older EasyBuild). Comments,
    help text and other strings never count.
    """
    names = _tcl_dependencies(text) if is_tcl(text) else _lua_dependencies(text)
    return list(dict.fromkeys(name for name in names if name))


def _resolve(name, modules, by_name):
    """The members of the set that loading ``name`` can mean: itself, every version of a bare
    Name, or in a hierarchy the member whose full name ends in it (a hierarchical module loads
    ``libtoy/0.0``, which is ``Core/libtoy/0.0`` on the MODULEPATH the hierarchy builds)."""
    if name in modules:
        return [name]
    if "/" not in name:
        return by_name.get(name, [])
    return [module for module in sorted(modules) if module.endswith("/" + name)]


def _match_end(pattern: Pattern[str], text: str, start: int) -> int:
    found = pattern.match(text, start)
    return found.end() if found else start


def _strong_components(nodes, edges):
    """Strongly connected components (Tarjan, iterative: no recursion limit on long chains)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(edges[root]))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def publish_order(modules):
    """Names of ``modules`` (``{"Name/version": module file text}``, or full hierarchical
    names), dependencies first.

    Only dependencies inside the set order anything; a bare ``Name`` dependency means every
    version of that Name in the set. Among modules free to go, the smaller name goes first,
    and the members of a dependency cycle go together in sorted name order: the result does
    not depend on the dict's order, and a cycle never raises (Lmod itself loads such files).
    Rollback walks the result backwards.
    """
    nodes = sorted(modules)
    by_name = collections.defaultdict(list)
    for node in nodes:
        by_name[node.split("/")[-2]].append(node)  # Name/version, or <level>/.../Name/version
    edges = {}
    for node in nodes:
        targets = set()
        for dependency in dependencies(modules[node]):
            targets.update(_resolve(dependency, modules, by_name))
        targets.discard(node)
        edges[node] = sorted(targets)
    components = _strong_components(nodes, edges)
    component_of = {member: number for number, members in enumerate(components) for member in members}
    waiting = [0] * len(components)
    dependents: List[Set[int]] = [set() for _component in components]
    for number, members in enumerate(components):
        needs = {component_of[target] for member in members for target in edges[member]} - {number}
        waiting[number] = len(needs)
        for need in needs:
            dependents[need].add(number)
    ready = [(members[0], number) for number, members in enumerate(components) if not waiting[number]]
    heapq.heapify(ready)
    order = []
    while ready:
        number = heapq.heappop(ready)[1]
        order.extend(components[number])
        for dependent in dependents[number]:
            waiting[dependent] -= 1
            if not waiting[dependent]:
                heapq.heappush(ready, (components[dependent][0], dependent))
    return order


# --- Publishing -----------------------------------------------------------------------------


def _xattr(target, name):
    """Raw bytes of attribute ``name`` of ``target`` (a path, never followed, or an fd); None if absent."""
    options = {} if isinstance(target, int) else {"follow_symlinks": False}
    try:
        return os.getxattr(target, name, **options)
    except OSError as err:
        if err.errno in _ABSENT:
            return None
        raise


def _metadata(info, target):
    xattrs = {}
    for name in ACL_XATTRS:
        value = _xattr(target, name)
        if value is not None:
            xattrs[name] = value.hex()
    return {"uid": info.st_uid, "gid": info.st_gid, "mode": stat.S_IMODE(info.st_mode), "xattrs": xattrs}


def read_metadata(path):
    """What a replacement of the regular file ``path`` keeps: ``uid``, ``gid``, ``mode`` and ``xattrs``.

    ``mode`` is the permission bits with setuid/setgid/sticky; ``xattrs`` maps each name of
    ``ACL_XATTRS`` the file has to the hex of its raw bytes (absent names are left out), so
    the dict goes into a journal as it is. Raises ``UsageError`` for a symlink or anything
    but a regular file, ``FileNotFoundError`` when there is nothing at ``path``.
    """
    directory, name = fsutil.parent_of(path)
    with directory:
        found = _metadata_at(directory, name)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))
    return found


def _metadata_at(directory, name):
    """``read_metadata`` of the entry ``name`` of ``directory`` (an ``fsutil.Directory``),
    read through one descriptor of the file itself; None when there is none.

    The file that a replace takes its owner, mode and ACLs from must be the one it replaces:
    read by a path whose directory was swapped for a link meanwhile, it would be a file of
    another tree, and its owner would become the owner of the live module file."""
    path = directory.join(name)
    try:
        fd = directory.open_entry(name)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise errors.UsageError(
                f"module file {path} is a symbolic link; refusing to replace it"
            ) from None
        if err.errno == errno.ENXIO:  # a socket
            raise errors.UsageError(
                f"{path} is not a regular file; only a module file can be replaced"
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise errors.UsageError(f"{path} is not a regular file; only a module file can be replaced")
        return _metadata(info, fd)
    finally:
        os.close(fd)


def _new_file_metadata():
    # No owner and no attribute list: a new file belongs to its writer and keeps whatever
    # default ACL its directory hands down, as any file created there would.
    return {"uid": None, "gid": None, "mode": NEW_FILE_MODE, "xattrs": None}


def _apply_owner(fd, path, wanted):
    info = os.fstat(fd)
    uid = -1 if wanted["uid"] is None or wanted["uid"] == info.st_uid else wanted["uid"]
    gid = -1 if wanted["gid"] is None or wanted["gid"] == info.st_gid else wanted["gid"]
    if uid == -1 and gid == -1:
        return
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        raise errors.PublishError(
            f"cannot give the new {path} the owner {wanted['uid']}:{wanted['gid']} of the file it replaces: "
            "not permitted; nothing was replaced"
        ) from None


def _apply_xattrs(fd, path, wanted):
    if wanted["xattrs"] is None:
        return
    for name in ACL_XATTRS:
        value = wanted["xattrs"].get(name)
        try:
            if value is not None:
                os.setxattr(fd, name, bytes.fromhex(value))
            elif _xattr(fd, name) is not None:
                # Inherited from the directory's default ACL: the file replaced had none.
                os.removexattr(fd, name)
        except OSError as err:
            raise errors.PublishError(
                f"cannot copy {name} to the new {path}: {err.strerror}; nothing was replaced"
            ) from None


def _differences(actual, wanted):
    names = [key for key in ("uid", "gid", "mode") if wanted[key] is not None and actual[key] != wanted[key]]
    if wanted["xattrs"] is not None:
        names.extend(name for name in ACL_XATTRS if actual["xattrs"].get(name) != wanted["xattrs"].get(name))
    return names


def _publish(path, data, root, recorded=None):
    """Put ``data`` at ``path``; see ``replace_keeping_metadata``. The metadata is ``recorded``
    when given, else that of the file it replaces, else the new-file mode; all of it is read
    and written through one descriptor of ``path``'s directory."""
    path = os.fspath(path)
    directory, name = fsutil.parent_of(path, root)
    with directory:
        current = _metadata_at(directory, name)
        wanted = recorded if recorded is not None else current or _new_file_metadata()
        with directory.replace(name, mode=None) as stream:
            stream.write(data)
            # Into the kernel before the owner and mode: a write that reaches the file after a
            # chmod clears the setuid and setgid bits the chmod set.
            stream.flush()
            # chown before chmod: a chown clears setuid/setgid bits a chmod has just set.
            _apply_owner(stream.fileno(), path, wanted)
            _apply_xattrs(stream.fileno(), path, wanted)
            os.fchmod(stream.fileno(), wanted["mode"])
            # Checked before the rename, on the same inode, so a filesystem that drops or
            # rewrites an attribute leaves the live file alone. The replace then fsyncs
            # bytes, owner, mode and ACLs together before any name points at them.
            differing = _differences(_metadata(os.fstat(stream.fileno()), stream.fileno()), wanted)
            if differing:
                raise errors.PublishError(
                    f"the new {path} does not keep {', '.join(differing)} of the file it replaces; "
                    "nothing was replaced"
                )
        differing = _differences(_metadata_at(directory, name), wanted)
    if differing:
        raise errors.PublishError(
            f"{path} reads back with a different {', '.join(differing)} after the replace"
        )


def replace_keeping_metadata(path, data, root=None):
    """Replace the module file ``path`` with ``data`` (bytes), keeping its owner, mode and ACLs.

    The order is ``fsutil.durable_replace``'s: a temporary file in the same directory (a
    random name, never a fixed one another user could plant as a hard link), the bytes,
    then the destination's owner (``fchown`` only when it differs; ``PublishError`` when not
    permitted, rather than a module file quietly owned by someone else), the attributes of
    ``ACL_XATTRS`` it has (one it lacks is removed, in case the directory's default ACL gave
    it to the temp file), its mode, a check that all of these read back from the temp file
    as the destination had them, ``fsync``, ``os.replace``, ``fsync`` of the directory.
    After the replace they are read back from ``path`` once more; a difference raises
    ``PublishError`` with the new file in place, for the transaction to reverse.

    Any error before the replace unlinks the temp file and leaves ``path`` untouched, bytes
    and metadata. When ``path`` does not exist it is created with mode 0644. A symlink at
    ``path`` (even a dangling one) or a non-regular file is refused with ``UsageError``.

    With ``root`` (the module root), the directory of ``path`` is opened from it without
    following a link; the metadata is read, and the replace made, through its descriptor
    (``fsutil.Directory``).
    """
    _publish(path, data, root)


def restore_file(backup_path, path, metadata=None, root=None, backup_root=None):
    """Put the backed-up module file ``backup_path`` back at ``path``, as ``replace_keeping_metadata``.

    The metadata is ``metadata`` when given (a ``read_metadata`` record of the file the
    backup was taken from), else that of the file now at ``path`` (the new module file,
    which kept the old one's), else the new-file mode 0644. A symlink at ``backup_path`` or
    ``path``, or a backup that is not a regular file, is refused with ``UsageError``;
    ``root`` is ``replace_keeping_metadata``'s, ``backup_root`` the same for the backup.
    """
    data = fsutil.read_regular(backup_path, "module file backup", root=backup_root)
    recorded = None
    if metadata is not None:
        recorded = {
            "uid": metadata.get("uid"),
            "gid": metadata.get("gid"),
            "mode": metadata["mode"],
            "xattrs": dict(metadata.get("xattrs") or {}),
        }
    _publish(path, data, root, recorded)
