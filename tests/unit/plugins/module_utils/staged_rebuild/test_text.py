"""The text output's pieces: durations, local times, wrapping that never cuts a path, the
table, colour only on a terminal, and each subcommand's examples at the end of its --help.

The whole output of every command is compared in tests/integration/staged/test_staged_output.py.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import subprocess

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli, text
from tests.support import hostile
from tests.support.timezone import local_zone

UTC = datetime.timezone.utc


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (3660, "1 h 1 min"),
        (86399, "23 h 59 min"),
        (86400, "1 day"),
        (90000, "1 day 1 h"),
        (2 * 86400 + 7200 + 59, "2 days 2 h"),
    ],
)
def test_a_duration_is_two_units_at_most_rounded_down(seconds, words):
    assert text.duration(seconds) == words


@pytest.fixture
def new_york():
    with local_zone("America/New_York"):
        yield


def test_a_time_is_local_to_the_second_with_how_long_ago(new_york):
    now = datetime.datetime(2026, 7, 1, 12, 0, 0, tzinfo=UTC)

    assert text.when("2026-07-01T09:29:30.123456+00:00", now) == "2026-07-01 05:29:30 (2 h 30 min ago)"


def test_a_time_after_now_says_so_rather_than_a_negative_age(new_york):
    now = datetime.datetime(2026, 7, 1, 12, 0, 0, tzinfo=UTC)

    assert text.when("2026-07-01T12:00:40+00:00", now) == "2026-07-01 08:00:40 (40 s from now)"


LONG_PATH = "/" + "/".join(["a-rather-long-directory-name"] * 5) + "/software/GROMACS/2024.1-foss-2023b"


def test_wrapping_never_cuts_a_path_and_keeps_other_lines_within_the_width():
    sentence = (
        f"The previous tree is kept at {LONG_PATH} for the jobs still running from it, until gc removes it."
    )

    lines = text.wrap(sentence, "  ")

    assert len(LONG_PATH) > text.WIDTH
    assert f"  {LONG_PATH}" in lines or f"    {LONG_PATH}" in lines
    assert all(len(line) <= text.WIDTH for line in lines if LONG_PATH not in line)
    assert " ".join(line.strip() for line in lines) == sentence


def test_a_field_too_long_for_its_line_puts_the_value_on_the_next_line_whole():
    assert text.field("Live", "/apps/x", "  ", 14) == ["  Live:          /apps/x"]
    assert text.field("Live", LONG_PATH, "  ", 14) == ["  Live:", "    " + LONG_PATH]


def test_a_long_command_continues_after_a_word_so_that_it_still_pastes():
    words = ["eb-staged-rebuild", "rebuild", *(f"--module=Module{index}/1.0" for index in range(12))]

    lines = text.command("Undo", words)

    assert lines[0] == "Undo:"
    assert all(len(line) <= text.WIDTH for line in lines)
    assert all(line.endswith(" \\") for line in lines[1:-1])
    assert shlex.split(" ".join(line.rstrip("\\") for line in lines[1:])) == words


def _pasted(lines) -> str:
    """What a shell reads from a command's lines pasted: each `` \\`` at a line's end and the
    newline after it continue the line."""
    return "\n".join(lines).replace("\\\n", "")


# Arguments as a rebuild records them: blanks and tabs inside them, quotes of both kinds,
# each long enough that the command wraps.
ARGUMENTS = [
    "--installpath=/apps/site software/2024 stack",
    "--module=TinyApp/1.0",
    "--",
    "TinyApp-1.0.eb",
    "--try-amend=description=a description with  two blanks,\ta tab and 'single' and \"double\" quotes",
    "--hooks=/site/hooks dir/it's here.py",
    "\t",
    "ends with a blank ",
    "  starts with two",
]


def test_an_undo_command_wraps_only_between_arguments_and_reads_back_as_the_recorded_ones():
    context = text.Context(state_root="/apps/.staged", now=datetime.datetime.now(UTC))

    lines = text.command("Undo (build and publish again)", context.suggest("rebuild", *ARGUMENTS))

    assert len(lines) > 2
    assert all(line.endswith(" \\") for line in lines[1:-1])
    assert shlex.split(_pasted(lines[1:])) == ["eb-staged-rebuild", "rebuild", *ARGUMENTS]


def test_an_undo_command_with_control_characters_pastes_into_bash_as_the_recorded_arguments(en_us_utf8):
    arguments = [*ARGUMENTS, "\x1b]52;c;aGk=\x07", "line\nbreak\r", os.fsdecode(b"not utf-8 \xff")]
    context = text.Context(
        state_root="/apps/.staged", now=datetime.datetime.now(UTC), command=("printf", "%s\\0")
    )

    lines = text.command("Undo", context.suggest(*arguments))
    done = subprocess.run(
        ["bash", "-c", _pasted(lines[1:])], env=en_us_utf8.env(), capture_output=True, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split(b"\0")[:-1] == [os.fsencode(argument) for argument in arguments]
    assert not {"\x1b", "\x07", "\r", "\x00"} & set("".join(lines))


HEADER = ("RUN", "KIND", "STATE", "CREATED", "MODULES")
CREATED = "2026-12-02 11:15:00 (3 h ago)"


def test_the_table_fits_the_width_and_wraps_only_its_last_column_between_modules():
    modules = ", ".join(f"Lib{index}/1.{index}" for index in range(12))
    rows = [("20261202T101500-ab12cd", "publish", "published", CREATED, modules)]

    lines = text.table(HEADER, rows, text.Style())

    assert all(len(line) <= text.WIDTH for line in lines)
    assert lines[0].split() == list(HEADER)
    start = lines[0].index("MODULES")
    assert len(lines) > 2
    assert all(line[:start].strip() == "" for line in lines[2:])
    assert " ".join(line[start:].strip() for line in lines[1:]) == modules


def test_modules_too_long_for_the_last_column_go_under_their_row_whole():
    modules = ", ".join(f"Toolchain{index}/2024.{index}-GCCcore-13.2.0-CUDA-12.1.1" for index in range(3))
    rows = [("20261202T101500-ab12cd", "publish", "published", CREATED, modules)]

    lines = text.table(HEADER, rows, text.Style())

    assert all(len(line) <= text.WIDTH for line in lines)
    assert [line.split() for line in lines[:3]] == [
        ["RUN", "KIND", "STATE", "CREATED"],
        ["MODULES"],
        ["20261202T101500-ab12cd", "publish", "published", *CREATED.split()],
    ]
    assert all(line.startswith("    ") for line in lines[3:])
    assert " ".join(line.strip() for line in lines[3:]) == modules


class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_colour_only_on_a_terminal_without_no_color(tmp_path):
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as terminal, open(tmp_path / "file", "w") as regular:
            assert text.Style.for_stream(terminal, {"TERM": "xterm"}).colour
            assert not text.Style.for_stream(terminal, {"TERM": "xterm", "NO_COLOR": ""}).colour
            assert not text.Style.for_stream(terminal, {"TERM": "dumb"}).colour
            assert not text.Style.for_stream(regular, {"TERM": "xterm"}).colour
    finally:
        os.close(master)
        os.close(slave)


def test_colour_codes_take_no_room_in_the_table():
    rows = [("r1", "publish", "published", "now", "hello/1.0"), ("r22", "publish", "failed", "now", "x/1")]

    plain = text.table(("RUN", "KIND", "STATE", "CREATED", "MODULES"), rows, text.Style())
    coloured = text.table(("RUN", "KIND", "STATE", "CREATED", "MODULES"), rows, text.Style(colour=True))

    assert "\033[32mpublished\033[0m" in coloured[1]
    assert "\033[31mfailed   \033[0m" in coloured[2]
    assert [re.sub(r"\033\[\d+m", "", line) for line in coloured] == plain


# --help


@pytest.mark.parametrize("command", sorted(cli.EXAMPLES))
def test_each_subcommands_help_ends_with_its_examples(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])

    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.endswith("examples:\n" + "".join(f"  {line}\n" for line in cli.EXAMPLES[command]))
    assert 2 <= len(_commands(command)) <= 3
    assert all(len(line) <= text.WIDTH for line in out.splitlines())


def _commands(command):
    """The example command lines of ``command``, continuations joined, comments dropped."""
    joined = "\n".join(cli.EXAMPLES[command]).replace(" \\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines()]


@pytest.mark.parametrize("command", sorted(cli.EXAMPLES))
def test_each_example_is_a_command_line_the_parser_takes(command):
    for line in _commands(command):
        words = line[: line.index("|")] if "|" in line else line
        assert words[0] == cli.PROG
        args = cli.build_parser().parse_args(words[1:])
        assert args.command == command


@pytest.mark.parametrize("command", sorted(cli.EXAMPLES))
def test_the_docs_show_each_example(command):
    docs = "".join(
        (checkout.REPO / "docs" / page).read_text()
        for page in ("staged-rebuild.md", "reference/eb-staged-rebuild.md")
    )

    for line in cli.EXAMPLES[command]:
        assert line in docs, line


# Every field of the results that the text words without a journal, each holding the
# sequences: the output holds no control character and encodes in UTF-8.
H = hostile.SEQUENCES


def _count_shown(output) -> int:
    """How often the sequences are shown escaped in ``output``, wrapped lines joined."""
    return " ".join(output.split()).count(" ".join(hostile.SHOWN.split()))


def _context():
    return text.Context(state_root=f"/apps/{H}", now=datetime.datetime.now(UTC))


def test_gc_s_text_shows_every_field_of_its_report_escaped():
    entry = {"path": f"/apps/software/A/.1.0.{H}", "run_id": "r1", "why": f"in use by 1 process ({H})"}
    report = {
        "dry_run": False,
        "removed": [{"path": f"/apps/software/B/{H}", "run_id": "r2"}],
        "kept": [entry],
        "manual": [dict(entry, why=H)],
        "interrupted": [{"run_id": "r3", "state": "publishing", "why": H}],
        "incomplete": [{"path": f"/apps/.staged/runs/{H}", "run_id": "r4", "kind": "incomplete", "why": H}],
        "grace_hours": 144.0,
        "processes": {"scanned": 3, "unreadable": 0, "seen": H},
        "slurm": {"answered": False, "why": f"squeue exited 1: {H}"},
        "fleet": {"unanswered": [H]},
    }

    shown = text.collected(report, _context())

    hostile.assert_shown_safely(shown)
    assert _count_shown(shown) == 11


def test_probe_resume_and_a_dry_run_show_every_field_escaped():
    probed = {
        "path": H,
        "filesystem": H,
        "exchange": False,
        "exchange_errno": H,
        "publish_method": H,
        "bwrap": True,
        "userns": True,
        "max_user_namespaces": 10,
        "auto_backend": H,
        "easybuild_version": H,
        "recommendations": [H],
    }
    waiting = {"runs": [{"run_id": "r1", "state": H, "changed": False, "actions": [H]}]}
    dry = {
        "dry_run": True,
        "modules": [H],
        "backend": H,
        "generation": H,
        "command": ["eb", H],
        "removed_options": [H],
        "removed_environment": [H],
    }

    shown = [text.probed(probed, _context()), text.resume(waiting, _context()), text.rebuild(dry, _context())]

    for output in shown:
        hostile.assert_shown_safely(output)
    assert _count_shown(shown[0]) == 7
    assert _count_shown(shown[1]) == 2
    assert f"  $'{hostile.SHOWN}'\n" in shown[2]  # EasyBuild's command: a word bash reads back
