"""Values a hostile user chooses so that an administrator's terminal obeys them, and the
check that none of it reached the output raw.

``SEQUENCES`` holds what a terminal acts on: an OSC 52 that writes the clipboard (ended by
BEL), a CSI that erases the line, a carriage return and a line feed that start a forged
line of the tool's own, the C1 CSI an 8-bit terminal obeys, and a byte that is not UTF-8
(held by Python as a surrogate, ``os.fsdecode``). ``SHOWN`` is how the tools show it.
"""

from __future__ import annotations

import os

CLIPBOARD = "\x1b]52;c;aGFja2Vk\x07"
ERASE_LINE = "\x1b[2K"
FORGED = "\rremoved  /apps/software/TinyApp/1.0\n"
C1_CSI = "\x9b"
NOT_UTF8 = os.fsdecode(b"\xff")

# Everything at once: for values that may hold CR and LF (a job id, a reason, a state root).
SEQUENCES = CLIPBOARD + ERASE_LINE + FORGED + C1_CSI + NOT_UTF8
SHOWN = "\\x1b]52;c;aGFja2Vk\\x07\\x1b[2K\\rremoved  /apps/software/TinyApp/1.0\\n\\u009b\\xff"
# For a path that a module file names as its root, which holds no line break.
IN_A_PATH = CLIPBOARD + ERASE_LINE + C1_CSI + NOT_UTF8
IN_A_PATH_SHOWN = "\\x1b]52;c;aGFja2Vk\\x07\\x1b[2K\\u009b\\xff"
# For an install path, which a rebuild writes into module files and so refuses with a C0
# control character in it: the C1 CSI that erases the line, a right-to-left override.
IN_AN_INSTALL_PATH = C1_CSI + "2K\u202e" + NOT_UTF8
IN_AN_INSTALL_PATH_SHOWN = "\\u009b2K\\u202e\\xff"

# The control characters of ISO 6429 (C0, DEL, C1) but the line feed that ends each line.
CONTROL = {chr(code) for code in [*range(0x20), *range(0x7F, 0xA0)]} - {"\n"}


def assert_shown_safely(text) -> None:
    """``text`` (output for people, str or bytes) holds no control character but its line
    ends, and is valid UTF-8."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # raises on a byte that is not UTF-8
    text.encode("utf-8")  # raises on a surrogate
    found = sorted(CONTROL & set(text))
    assert not found, f"control characters {found!r} in {text!r}"
