# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two output forms of a decision: TaskProlog lines and shell code.

Slurm reads a TaskProlog's stdout line by line: ``export NAME=value`` takes the rest of the
line verbatim as the value, ``unset NAME`` and ``print text`` are the other directives, and
anything else is dropped. Before 22.05 each line was read with ``fgets`` into 4096 bytes,
so a longer line was split and its tail misread; lines here stay within PROLOG_LINE_MAX
(newline included) so every slurmd reads them whole.
"""

from __future__ import annotations

from . import decision as decisions
from .lean_os import fsencode

PROLOG = "prolog"
SHELL = "shell"

PROLOG_LINE_MAX = 4094

# Prompt settings are cosmetic and often hold newlines or escapes: a value that cannot be
# carried is left as the task had it instead of failing the whole restore.
PROMPT_NAMES = frozenset(("PS1", "PS2", "PS3", "PROMPT_COMMAND"))

_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_REST = _NAME_FIRST | frozenset("0123456789")


def is_valid_name(name: str) -> bool:
    """``^[A-Za-z_][A-Za-z0-9_]*$``, the names both Slurm's parser and a shell accept."""
    return bool(name) and name[0] in _NAME_FIRST and all(char in _NAME_REST for char in name)


def export_line(name: str, value: str) -> bytes:
    return b"export " + fsencode(name) + b"=" + fsencode(value) + b"\n"


def unset_line(name: str) -> bytes:
    return b"unset " + fsencode(name) + b"\n"


def directive(name: str, value) -> bytes:
    """The prolog line for one change: ``unset`` when ``value`` is None, else ``export``."""
    return unset_line(name) if value is None else export_line(name, value)


def why_unsafe(name: str, value, mode: str):
    """Why ``(name, value)`` cannot be carried in ``mode``, or None when it can."""
    if not is_valid_name(name):
        return f"the name {name!r} is not a valid variable name"
    if mode != PROLOG:
        return None
    for char, what in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL")):
        if value is not None and char in value:
            return f"the value of {name} contains {what}"
    length = len(directive(name, value))
    if length > PROLOG_LINE_MAX:
        kind = "unset" if value is None else "export"
        return f"the {kind} line for {name} is {length} bytes (limit {PROLOG_LINE_MAX})"
    return None


def carry(changes, mode: str):
    """``(changes that can be carried, None)``, or ``(None, reason)`` when one cannot.

    An uncarriable prompt setting is dropped and the rest still goes.
    """
    carried = []
    for name, value in changes:
        reason = why_unsafe(name, value, mode)
        if reason is None:
            carried.append((name, value))
        elif name not in PROMPT_NAMES:
            return None, reason
    return carried, None


def trim_utf8(data: bytes, limit: int) -> bytes:
    """``data`` cut to at most ``limit`` bytes, never inside a UTF-8 character."""
    if len(data) <= limit:
        return data
    cut = limit
    # Continuation bytes are 10xxxxxx: back off to the byte that starts a character.
    while cut > 0 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return data[:cut]


def print_line(message: str) -> bytes:
    """The ``print`` directive of ``message``, one line that Slurm copies to the task's
    output as it is: escaped (``shown``) and cut to fit."""
    text = fsencode(shown(message))
    return b"print " + trim_utf8(text, PROLOG_LINE_MAX - len(b"print \n")) + b"\n"


def shown(message: str) -> str:
    """``message`` as a terminal may show it: ``common.printable``, imported only for a
    message that needs it (the task path of a cached decision imports nothing more)."""
    if message.isprintable():
        return message
    from ..common.printable import printable  # noqa: PLC0415

    return printable(message)


def prolog_output(decision: decisions.Decision, local_id) -> bytes:
    """The TaskProlog's stdout; the message only for the node's first task (local id 0)."""
    lines = [directive(name, value) for name, value in decision.changes]
    if decision.message and local_id in (None, "0"):
        lines.append(print_line(decision.message))
    return b"".join(lines)


def shell_output(decision: decisions.Decision):
    """``(stdout, stderr)`` for ``eval "$(eessi-arch-guard --shell)"``."""
    import shlex  # noqa: PLC0415 (only the shell form needs it; the prolog path stays lean)

    lines = [
        unset_line(name)
        if value is None
        else b"export " + fsencode(name) + b"=" + fsencode(shlex.quote(value)) + b"\n"
        for name, value in decision.changes
    ]
    message = fsencode(shown(decision.message)) + b"\n" if decision.message else b""
    return b"".join(lines), message
