# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The few ``os`` services a short-lived command's fast path needs, without importing ``os``.

``import os`` costs about 2 ms of CPU at interpreter start (it builds ``os.environ`` and
imports ``collections.abc``), and eessi-arch-guard's cached-decision path runs in every task
of every job step. These use ``posix``, the built-in module ``os`` is made of, with the same
encoding rules as ``os``: the file system encoding and its error handler.
"""

from __future__ import annotations

import _stat
import posix
import sys


def fsencode(text: str) -> bytes:
    """``os.fsencode`` for a str."""
    return text.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def fsdecode(data: bytes) -> str:
    """``os.fsdecode`` for bytes."""
    return data.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def environ() -> dict:
    """The process's environment as ``os.environ`` shows it, copied into a dict."""
    return {fsdecode(name): fsdecode(value) for name, value in posix.environ.items()}


def isdir(path: str) -> bool:
    """``os.path.isdir``: False for anything that is not a directory or cannot be looked at."""
    try:
        return _stat.S_ISDIR(posix.stat(path).st_mode)
    except (OSError, ValueError):
        return False
