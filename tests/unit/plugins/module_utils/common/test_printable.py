"""The one escape form of what reaches a terminal (``printable``), of a word to paste into a
shell (``shell_word``) and of a result's string that is not Unicode (``unicode_result``).

A shell word is checked by the real bash, which reads it back into the argument it was made
from, byte for byte (``printf '%s\\0'``), in a strict UTF-8 locale.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common.printable import (
    exact,
    is_unicode,
    printable,
    shell_word,
    unicode_result,
)

# Every character a terminal obeys or shows as something else, each with the form people see.
SHOWN = [
    ("\x1b", "\\x1b"),  # ESC: CSI, OSC 52 (the clipboard), title changes
    ("\x07", "\\x07"),  # BEL: ends an OSC
    ("\x00", "\\x00"),
    ("\x08", "\\x08"),  # backspace
    ("\x7f", "\\x7f"),  # DEL
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\t", "\\t"),
    ("\x9b", "\\u009b"),  # C1 CSI, which an 8-bit terminal obeys
    ("\x85", "\\u0085"),  # C1 NEL, a line break
    ("\u202e", "\\u202e"),  # right-to-left override: the line reads backwards
    ("\u200b", "\\u200b"),  # zero width space
    ("\u2028", "\\u2028"),  # line separator
    ("\u00a0", "\\u00a0"),  # a blank that is not a space
    ("\U000e0041", "\\U000e0041"),  # a tag character: invisible
    (os.fsdecode(b"\xff"), "\\xff"),  # a byte that is not UTF-8: the byte
    (os.fsdecode(b"\x85"), "\\x85"),  # the byte 0x85, not the character U+0085
    ("\ud800", "\\ud800"),  # a lone surrogate that was never a byte
]
# Control characters everywhere, ISO 6429 C0 and C1, and DEL.
CONTROL = {chr(code) for code in [*range(0x20), *range(0x7F, 0xA0)]}


@pytest.mark.parametrize(("char", "shown"), SHOWN)
def test_each_character_a_terminal_would_act_on_is_shown_escaped(char, shown):
    assert printable(f"a{char}b") == f"a{shown}b"
    assert exact(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize(
    "text", ["/apps/software/GROMACS/2024.1-foss-2023b", "grace period of 144 h", "naïve 😀 日本", "a\\x1b"]
)
def test_printable_text_is_shown_as_it_is(text):
    assert printable(text) is text


def test_printable_keeps_a_backslash_and_exact_doubles_it_so_that_it_reads_back():
    assert printable("C:\\dir\x1b") == "C:\\dir\\x1b"
    assert exact("C:\\dir\x1b") == "C:\\\\dir\\x1b"


def test_what_printable_shows_holds_no_control_character_and_encodes_in_utf_8():
    hostile = "".join(chr(code) for code in range(0x100)) + os.fsdecode(bytes(range(0x80, 0x100))) + "\ud800"

    shown = printable(hostile)

    assert not CONTROL & set(shown)
    assert shown.isprintable()
    shown.encode("utf-8")
    assert printable(shown) == shown


@pytest.fixture(scope="module")
def strict_locale(en_us_utf8):
    return en_us_utf8.env()


HOSTILE_WORDS = [
    "plain",
    "",
    "two words",
    "it's",
    'say "hi"',
    "tab\there",
    "--reason=CVE-2023-45853 (zlib) 'urgent'",
    "\x1b]52;c;aGVsbG8=\x07",
    "line one\nline two\r",
    "back\\slash and 'quote'\x1b",
    os.fsdecode(b"latin-1 \xe9t\xe9"),
    "naïve 😀 \x9b \u202e",
    "$(touch /tmp/x) `id` ${HOME} !!",
]


def test_a_shell_word_is_read_back_by_bash_as_the_argument_it_was_made_from(strict_locale):
    script = "printf '%s\\0' " + " ".join(shell_word(word) for word in HOSTILE_WORDS)

    done = subprocess.run(["bash", "-c", script], env=strict_locale, capture_output=True, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split(b"\0")[:-1] == [os.fsencode(word) for word in HOSTILE_WORDS]


def test_a_shell_word_shows_no_control_character_but_a_tab_inside_single_quotes():
    words = [shell_word(word) for word in HOSTILE_WORDS]

    assert not CONTROL & set("".join(words)) - {"\t"}
    assert shell_word("tab\there") == "'tab\there'"
    assert shell_word("it's") == "'it'\"'\"'s'"
    assert shell_word("a\x1bb") == "$'a\\x1bb'"
    assert shell_word("plain/path-1.0") == "plain/path-1.0"


def test_a_result_that_is_unicode_is_unchanged_and_says_nothing_more():
    result = {"path": "/apps/é", "why": "grace period", "kept": [{"job_id": "4242"}], "count": 3}

    assert unicode_result(result) == result


def test_a_string_that_is_not_unicode_is_given_exactly_and_named_by_its_pointer():
    job = os.fsdecode(b"42\xff\x1b")
    tree = os.fsdecode(b"/apps/a~b/c\xfe")
    result = {"kept": [{"path": "/apps/x", "processes": [{"job_id": job}]}], "in_use": {tree: []}, "n": 1}

    shown = unicode_result(result)

    assert shown["kept"][0]["processes"][0]["job_id"] == "42\\xff\\x1b"
    assert shown["in_use"] == {"/apps/a~b/c\\xfe": []}
    assert shown["escaped"] == ["/kept/0/processes/0/job_id", "/in_use/~1apps~1a~0b~1c\\xfe"]
    assert is_unicode(json.dumps(shown, ensure_ascii=False))
    assert json.loads(json.dumps(shown)) == shown
