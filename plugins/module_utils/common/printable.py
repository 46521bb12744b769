# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Values as a terminal may show them, and results as JSON may carry them: one escape form.

What the tools print for people holds values that other users choose: a process's
``SLURM_JOB_ID``, a module file's ``root``, a journal edited by hand, a path, a child's
output. A terminal obeys the control characters in them (ESC starts sequences that erase
lines, move the cursor or write the clipboard; CR and LF start a line that looks like the
tool's own), and bytes that are not UTF-8 make a strict UTF-8 writer fail after the work is
done. Every such value goes through ``escape``, with one form, bash's ANSI-C quoting
(``$'...'``):

- ``\\n``, ``\\r``, ``\\t``;
- ``\\xNN`` for the other ASCII control characters (C0, DEL) and for each byte that is not
  UTF-8 (held by Python as a surrogate, ``os.fsdecode``'s ``surrogateescape``): the byte;
- ``\\uNNNN`` (``\\UNNNNNNNN``) for every other character ``str.isprintable`` rejects: C1
  control characters (U+0080-U+009F, which an 8-bit terminal obeys), bidirectional and
  zero-width formatting, line and paragraph separators, a space other than U+0020, a lone
  surrogate that is no byte.

``printable`` is the form for people: a backslash stays as it is, so a message that quotes
a value (``'a\\x1b'``) is not escaped twice. ``exact`` doubles a backslash too, so that the
form reads back into the value's bytes: it is the body of a ``$'...'`` word
(``shell_word``) and the form of a result's string that is not Unicode (``unicode_result``).

No imports: the guard's task path may use it without paying for one.
"""

from __future__ import annotations

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# Python holds a byte that is not UTF-8 as the lone surrogate U+DC80-U+DCFF (PEP 383).
_BYTE_FIRST, _BYTE_LAST = 0xDC80, 0xDCFF
# What a shell word may hold unquoted: shlex.quote's set.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")
# A key of a result that names the strings of it given in the exact form.
ESCAPED = "escaped"


def _escaped(char: str) -> str:
    """One character that is not shown as it is, as its escape."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x80:
        return f"\\x{code:02x}"
    if _BYTE_FIRST <= code <= _BYTE_LAST:
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: str, also: str = "") -> str:
    """``text`` with every character ``str.isprintable`` rejects escaped, and each of
    ``also`` preceded by a backslash."""
    if text.isprintable() and not any(char in text for char in also):
        return text
    return "".join(
        ("\\" + char if char in also else char) if char.isprintable() else _escaped(char) for char in text
    )


def printable(text: str) -> str:
    """``text`` for a person's terminal: nothing in it is obeyed, and it encodes in UTF-8."""
    return escape(text)


def exact(text: str) -> str:
    """``text`` escaped so that it reads back into its bytes: a backslash doubled too."""
    return escape(text, "\\")


def shell_word(word: str) -> str:
    """``word`` as a shell reads it back: as it is when plain, in single quotes when every
    character of it is printable (a tab too: it moves no cursor back and ends no line), else
    as ``$'...'`` in the exact form (bash, zsh, ksh and POSIX.1-2024 shells read it)."""
    if word and all(char in _PLAIN for char in word):
        return word
    if all(char == "\t" or char.isprintable() for char in word):
        return "'" + word.replace("'", "'\"'\"'") + "'"
    return "$'" + escape(word, "\\'") + "'"


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode: no lone surrogate, so UTF-8 can encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unicode_result(result: dict) -> dict:
    """``result`` with each string (or key) that is not valid Unicode in the exact form, and,
    when there was one, ``escaped``: the JSON pointer (RFC 6901) of each, so that a reader
    knows which strings to read back. Anything else is kept as it is."""
    pointers: list = []
    shown = _unicode(result, "", pointers)
    if pointers:
        shown[ESCAPED] = pointers
    return shown


def _unicode(value, pointer: str, pointers: list):
    if isinstance(value, str):
        if is_unicode(value):
            return value
        pointers.append(pointer)
        return exact(value)
    if isinstance(value, dict):
        shown = {}
        for key, item in value.items():
            name = key
            if isinstance(key, str) and not is_unicode(key):
                name = exact(key)
            inner = pointer + "/" + str(name).replace("~", "~0").replace("/", "~1")
            if name is not key:
                pointers.append(inner)
            shown[name] = _unicode(item, inner, pointers)
        return shown
    if isinstance(value, (list, tuple)):
        return [_unicode(item, f"{pointer}/{index}", pointers) for index, item in enumerate(value)]
    return value
