"""The tests' model of slurmd reading a TaskProlog's output (tests/support/slurm_taskprolog.py)."""

from __future__ import annotations

from tests.support import slurm_taskprolog
from tests.support.slurm_taskprolog import parse


def test_export_sets_the_value_and_unset_removes_the_name():
    applied = parse(b"export NEW=1\nunset OLD\n", {b"OLD": b"x", b"KEEP": b"y"})
    assert applied.env == {b"NEW": b"1", b"KEEP": b"y"}
    assert applied.printed == []


def test_the_given_environment_is_not_changed():
    env = {b"A": b"1"}
    parse(b"export A=2\nunset A\n", env)
    assert env == {b"A": b"1"}


def test_later_directives_win():
    assert parse(b"export A=1\nexport A=2\n", {}).env == {b"A": b"2"}
    assert parse(b"export A=1\nunset A\n", {}).env == {}
    assert parse(b"unset A\nexport A=3\n", {b"A": b"0"}).env == {b"A": b"3"}


def test_a_5000_byte_line_is_split_and_its_tail_read_as_a_line_of_its_own():
    tail = b"export TAIL=from-the-tail"
    head = b"export LONG=" + b"x" * (slurm_taskprolog.LINE_MAX - len(b"export LONG="))
    line = head + tail + b"y" * (5000 - len(head) - len(tail) - 1) + b"\n"
    assert len(line) == 5000

    applied = parse(line, {})

    assert applied.env[b"LONG"] == b"x" * (slurm_taskprolog.LINE_MAX - len(b"export LONG="))
    assert applied.env[b"TAIL"] == b"from-the-tail" + b"y" * (5000 - len(head) - len(tail) - 1)


def test_a_line_of_exactly_4094_bytes_with_its_newline_is_read_whole():
    value = b"v" * (slurm_taskprolog.LINE_MAX - len(b"export A=\n"))
    assert parse(b"export A=" + value + b"\nexport B=2\n", {}).env == {b"A": value, b"B": b"2"}


def test_a_line_of_4096_bytes_loses_its_last_value_byte():
    value = b"v" * (slurm_taskprolog.LINE_MAX - len(b"export A=\n") + 1) + b"w"
    line = b"export A=" + value + b"\n"
    assert len(line) == 4096
    assert slurm_taskprolog.read_lines(line) == [line[:4094], b"w\n"]
    assert parse(line, {}).env == {b"A": value[:-1]}


def test_without_a_line_limit_long_lines_are_read_whole():
    value = b"v" * 10000
    assert parse(b"export A=" + value + b"\n", {}, line_max=None).env == {b"A": value}


def test_read_lines_splits_only_at_newline():
    assert slurm_taskprolog.read_lines(b"a\rb\r\nc\n\nd", line_max=3) == [
        b"a\rb",
        b"\r\n",
        b"c\n",
        b"\n",
        b"d",
    ]


def test_a_trailing_carriage_return_is_kept_in_the_value():
    assert parse(b"export A=1\r\n", {}).env == {b"A": b"1\r"}


def test_the_value_is_taken_verbatim():
    line = b"export A= 'q' \"d\" $HOME \\n\\ b=c \xff\n"
    assert parse(line, {}).env == {b"A": b" 'q' \"d\" $HOME \\n\\ b=c \xff"}


def test_blanks_around_the_name_are_trimmed():
    assert parse(b"export  \tA \t=1\nunset \t B \t\n", {b"B": b"x"}).env == {b"A": b"1"}


def test_names_are_not_validated():
    assert parse(b"export a-b.c=1\nunset SLURM_JOB_ID\n", {b"SLURM_JOB_ID": b"7"}).env == {b"a-b.c": b"1"}


def test_export_without_equals_is_dropped():
    assert parse(b"export A\n", {b"A": b"1"}).env == {b"A": b"1"}


def test_unset_of_a_missing_name_changes_nothing():
    assert parse(b"unset MISSING\n", {b"A": b"1"}).env == {b"A": b"1"}


def test_other_lines_are_ignored():
    output = (
        b" export A=1\n"
        b"Export B=1\n"
        b"export\tC=1\n"
        b"exportD=1\n"
        b"unsetE\n"
        b"printf x\n"
        b"# export F=1\n"
        b"\n"
        b"garbage\n"
        b"\tprint x\n"
    )
    applied = parse(output, {b"E": b"kept"})
    assert applied.env == {b"E": b"kept"}
    assert applied.printed == []


def test_print_strips_leading_blanks_and_keeps_the_rest():
    applied = parse(b"print   hello  world \nprint \t second\nprint third", {})
    assert applied.printed == [b"hello  world ", b"second", b"third"]
    assert applied.env == {}


def test_a_piece_ends_at_a_nul():
    applied = parse(b"export A=1\x002\nprint a\x00b\n", {})
    assert applied.env == {b"A": b"1"}
    assert applied.printed == [b"a"]
