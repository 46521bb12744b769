"""The two output forms: TaskProlog lines as Slurm reads them, and shell code for eval."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import decision, emit
from tests.support.guard_reference import bash_env_after_eval
from tests.support.slurm_taskprolog import parse

LIMIT = 4094
UNSAFE_CHARS = [("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL")]


def _value_for_line(name: str, length: int, fill: str = "v") -> str:
    """A value whose export line (newline included) is ``length`` bytes."""
    return fill * (length - len(f"export {name}=\n"))


def _reload(changes, message="eessi-arch-guard: reloaded"):
    return decision.Decision(decision.RELOAD, "reloaded", changes, message)


@pytest.mark.parametrize("name", ["A", "_", "_x9", "PATH", "lower_case", "A1_B2", "Z" * 5000])
def test_valid_names(name):
    assert emit.is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "1A", "a-b", "a.b", "a b", " A", "A ", "A=B", "é", "A\n", os.fsdecode(b"A\xff"), "BASH_FUNC_f%%"],
)
def test_invalid_names(name):
    assert not emit.is_valid_name(name)


def test_an_export_line_keeps_the_bytes_of_the_value():
    value = os.fsdecode(b"'quoted' $HOME \\ \xff\xfe")
    assert emit.export_line("A", value) == b"export A='quoted' $HOME \\ \xff\xfe\n"


@pytest.mark.parametrize(("char", "what"), UNSAFE_CHARS)
def test_a_control_character_makes_a_value_unsafe_for_the_prolog(char, what):
    assert (
        emit.why_unsafe("MODULEPATH", f"/a{char}/b", emit.PROLOG)
        == f"the value of MODULEPATH contains {what}"
    )


@pytest.mark.parametrize("char", ["\n", "\r"])
def test_the_shell_form_carries_newlines_and_carriage_returns(char):
    assert emit.why_unsafe("MODULEPATH", f"/a{char}/b", emit.SHELL) is None


@pytest.mark.parametrize("mode", [emit.PROLOG, emit.SHELL])
@pytest.mark.parametrize("value", ["1", None])
def test_an_invalid_name_is_unsafe_in_both_modes(mode, value):
    assert emit.why_unsafe("a-b", value, mode) == "the name 'a-b' is not a valid variable name"


def test_an_export_line_of_4094_bytes_is_safe():
    value = _value_for_line("A", LIMIT)
    assert len(emit.export_line("A", value)) == LIMIT
    assert emit.why_unsafe("A", value, emit.PROLOG) is None


def test_an_export_line_of_4095_bytes_is_unsafe():
    value = _value_for_line("A", LIMIT + 1)
    assert emit.why_unsafe("A", value, emit.PROLOG) == "the export line for A is 4095 bytes (limit 4094)"


def test_an_unset_line_of_4094_bytes_is_safe_and_one_more_is_not():
    assert emit.why_unsafe("N" * (LIMIT - len("unset \n")), None, emit.PROLOG) is None
    reason = emit.why_unsafe("N" * (LIMIT - len("unset \n") + 1), None, emit.PROLOG)
    assert reason.startswith("the unset line for NNN")
    assert reason.endswith(" is 4095 bytes (limit 4094)")


def test_the_line_limit_counts_bytes_not_characters():
    # "export A=" + 2042 two-byte characters + "\n" is 4094 bytes, one character more is
    # 4096: both far fewer characters than the limit.
    assert emit.why_unsafe("A", "é" * 2042, emit.PROLOG) is None
    assert emit.why_unsafe("A", "é" * 2043, emit.PROLOG) == "the export line for A is 4096 bytes (limit 4094)"


def test_the_shell_form_has_no_line_limit():
    assert emit.why_unsafe("A", "v" * 100_000, emit.SHELL) is None


@pytest.mark.parametrize("prompt", sorted(emit.PROMPT_NAMES))
def test_an_unsafe_prompt_setting_is_dropped_and_the_rest_carried(prompt):
    changes = [("A", "1"), (prompt, "line one\nline two"), ("B", None)]
    assert emit.carry(changes, emit.PROLOG) == ([("A", "1"), ("B", None)], None)


def test_an_overlong_prompt_setting_is_dropped_too():
    assert emit.carry([("PS1", "x" * LIMIT), ("A", "1")], emit.PROLOG) == ([("A", "1")], None)


def test_a_safe_prompt_setting_is_carried():
    changes = [("PS1", r"[\u@\h \W]\$ "), ("PROMPT_COMMAND", None)]
    assert emit.carry(changes, emit.PROLOG) == (changes, None)


@pytest.mark.parametrize(("char", "what"), UNSAFE_CHARS)
def test_one_unsafe_value_refuses_the_whole_delta(char, what):
    carried, reason = emit.carry([("A", "1"), ("B", f"x{char}y"), ("C", "3")], emit.PROLOG)
    assert carried is None
    assert reason == f"the value of B contains {what}"


def test_an_invalid_name_refuses_the_whole_delta():
    carried, reason = emit.carry([("A", "1"), ("x.y", None)], emit.SHELL)
    assert (carried, reason) == (None, "the name 'x.y' is not a valid variable name")


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_trim_utf8_never_cuts_a_character(width, offset):
    char = {2: "é", 3: "€", 4: "😀"}[width]
    data = ("a" * offset + char * 100).encode()
    for limit in range(offset, offset + 3 * width):
        trimmed = emit.trim_utf8(data, limit)
        assert len(trimmed) <= limit
        # The longest whole-character prefix: one byte more would cut a character.
        assert len(trimmed) > limit - width
        assert data.startswith(trimmed)
        trimmed.decode()


def test_trim_utf8_leaves_short_data_alone():
    assert emit.trim_utf8("😀".encode(), 4) == "😀".encode()
    assert emit.trim_utf8(b"", 0) == b""


def test_a_long_message_is_trimmed_on_a_character_boundary_within_the_line():
    for prefix in ("", "a", "ab", "abc"):
        line = emit.print_line(prefix + "😀€é" * 2000)
        assert len(line) <= LIMIT
        assert len(line) > LIMIT - 4
        assert line.startswith(b"print ")
        assert line.endswith(b"\n")
        line.decode()


def test_a_message_of_exactly_the_limit_is_kept_whole():
    message = "m" * (LIMIT - len(b"print \n"))
    assert emit.print_line(message) == b"print " + message.encode() + b"\n"


def test_control_characters_in_a_message_are_shown_escaped_on_its_one_line():
    assert emit.print_line("one\ntwo\r\nthree") == b"print one\\ntwo\\r\\nthree\n"
    assert emit.print_line("a\x1b]52;c;eA==\x07b\x9bc") == b"print a\\x1b]52;c;eA==\\x07b\\u009bc\n"
    assert emit.print_line(os.fsdecode(b"x\xffy")) == b"print x\\xffy\n"


def _failure():
    return decision.Decision(
        decision.FAIL,
        "detail",
        [(decision.FAILED_MARKER, "x86_64/amd/zen3->archdetect-failed")],
        "eessi-arch-guard: could not detect",
    )


@pytest.mark.parametrize("local_id", ["0", None])
def test_the_first_task_on_a_node_gets_the_print_line(local_id):
    output = emit.prolog_output(_failure(), local_id)
    assert output == (
        b"export EESSI_ARCH_GUARD_FAILED=x86_64/amd/zen3->archdetect-failed\n"
        b"print eessi-arch-guard: could not detect\n"
    )
    assert parse(output, {}).printed == [b"eessi-arch-guard: could not detect"]


@pytest.mark.parametrize("local_id", ["1", "7", "", "00", " 0"])
def test_other_tasks_get_no_print_line(local_id):
    output = emit.prolog_output(_failure(), local_id)
    assert output == b"export EESSI_ARCH_GUARD_FAILED=x86_64/amd/zen3->archdetect-failed\n"


def test_a_decision_without_a_message_prints_nothing():
    assert emit.prolog_output(decision.skip("target already matches this node"), "0") == b""
    assert emit.shell_output(decision.skip("target already matches this node")) == (b"", b"")


def test_prolog_output_applied_by_slurm_gives_the_changes():
    odd = os.fsdecode(b"/x\xff/'q' \"d\" $V \\")
    changes = [("A", "1"), ("B", None), ("ODD", odd), ("EMPTY", ""), ("SPACED", "  lead and trail  ")]
    output = emit.prolog_output(_reload(changes), "0")
    applied = parse(output, {b"B": b"gone", b"KEEP": b"k"})
    assert applied.env == {
        b"A": b"1",
        b"ODD": b"/x\xff/'q' \"d\" $V \\",
        b"EMPTY": b"",
        b"SPACED": b"  lead and trail  ",
        b"KEEP": b"k",
    }
    assert applied.printed == [b"eessi-arch-guard: reloaded"]


def test_shell_output_quotes_values_and_sends_the_message_to_stderr():
    stdout, stderr = emit.shell_output(_reload([("A", "it's"), ("B", None)], "reloaded for you"))
    assert stdout == b"export A='it'\"'\"'s'\nunset B\n"
    assert stderr == b"reloaded for you\n"


def test_shell_output_evaluated_by_bash_carries_newlines_quotes_and_bytes():
    values = {
        "NEWLINES": "one\ntwo\n\n",
        "QUOTES": "'single' \"double\" `back` $(date) $HOME \\",
        "PS1": "multi\nline $ ",
        "BYTES": os.fsdecode(b"\xff\xfe\x01\x7f"),
        "CR": "a\rb\r",
        "EMPTY": "",
        "LONG": "L" * 10_000,
    }
    changes = [*values.items(), ("GONE", None)]
    stdout, _message = emit.shell_output(_reload(changes))
    env = bash_env_after_eval(stdout, {b"GONE": b"x", b"KEEP": b"k"})
    for name, value in values.items():
        assert env[name.encode()] == os.fsencode(value)
    assert b"GONE" not in env
    assert env[b"KEEP"] == b"k"
