"""How slurmd applies a TaskProlog's output to a task: the tests' oracle for the guard.

Modelled on Slurm's ``src/slurmd/slurmstepd/task.c``. Slurm 17.11-21.08 read the output
with ``fgets(buf, sizeof(buf) - 1)`` on ``char buf[4096]``: each read returns at most 4094
bytes, newline included, so a longer line is split and its tail is read as a line of its
own. Each piece is a C string (it ends
at a NUL). Of the pieces, only those starting at column 0 with ``export ``, ``unset `` or
``print `` count:

- ``export NAME=value``: the name is what lies between ``export `` and the first ``=``,
  with blanks around it trimmed (C ``isspace``); the value is the rest of the piece
  verbatim (quotes, ``$``, backslashes, a trailing ``\\r`` kept), only the final ``\\n``
  removed. A piece without ``=`` is dropped. Names are not validated.
- ``unset NAME``: the name with blanks around it trimmed; a missing name is no error.
- ``print text``: the text, leading blanks stripped, goes to the task's stdout.

Everything is bytes: a task's environment need not be UTF-8.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

# fgets(buf, 4095) on char buf[4096]: 4094 bytes and the terminating NUL.
LINE_MAX = 4094

# C isspace() in the "C" locale.
_BLANKS = b" \t\n\v\f\r"


@dataclasses.dataclass(frozen=True)
class Applied:
    """The task's environment once the directives ran, and the lines ``print`` wrote."""

    env: Dict[bytes, bytes]
    printed: List[bytes]


def read_lines(output: bytes, line_max: Optional[int] = LINE_MAX) -> List[bytes]:
    """The pieces slurmd reads: lines of at most ``line_max`` bytes, newline included.

    ``line_max=None`` reads whole lines, as slurmd 22.05.1 and later do.
    """
    pieces = []
    # Only b"\n" ends a line (bytes.splitlines would also split at a carriage return).
    for line in re.findall(rb"[^\n]*\n|[^\n]+\Z", output):
        size = line_max or len(line)
        pieces.extend(line[start : start + size] for start in range(0, len(line), size))
    return pieces


def parse(output: bytes, env: Dict[bytes, bytes], *, line_max: Optional[int] = LINE_MAX) -> Applied:
    """Apply ``output`` to a copy of ``env`` (``bytes -> bytes``) as slurmd does."""
    new_env = dict(env)
    printed = []
    for piece in read_lines(output, line_max):
        line = piece.split(b"\0", 1)[0]
        if line.endswith(b"\n"):
            line = line[:-1]
        if line.startswith(b"export "):
            name, sep, value = line[len(b"export ") :].partition(b"=")
            if sep:
                new_env[name.strip(_BLANKS)] = value
        elif line.startswith(b"unset "):
            new_env.pop(line[len(b"unset ") :].strip(_BLANKS), None)
        elif line.startswith(b"print "):
            printed.append(line[len(b"print ") :].lstrip(_BLANKS))
    return Applied(new_env, printed)
