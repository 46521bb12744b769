"""``eessi-arch-guard`` as Slurm and a job script run it: the streams it writes, and exit 0 always.

(Named test_guard_cli.py, not test_cli.py: the test directories are not packages, and
staged_rebuild/test_cli.py already holds the module name ``test_cli``.)
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cli
from tests.support import hostile
from tests.support.slurm_taskprolog import parse

FAILED_EXPORT = b"export EESSI_ARCH_GUARD_FAILED=x86_64/amd/zen3->archdetect-failed\n"


def _loaded_elsewhere(**extra):
    """EESSI loaded for zen3 with a prefix that does not exist here: archdetect cannot run."""
    env = {
        "EESSI_SOFTWARE_SUBDIR": "x86_64/amd/zen3",
        "EESSI_PREFIX": "/nonexistent/eessi",
        "PATH": os.defpath,
    }
    env.update(extra)
    return env


def _main(argv, environ):
    """``cli.main`` with in-memory streams: ``(status, stdout, stderr)``."""
    stdout, stderr = io.BytesIO(), io.BytesIO()
    status = cli.main(argv, environ=environ, stdout=stdout, stderr=stderr)
    return status, stdout.getvalue(), stderr.getvalue()


class BrokenPipe(io.RawIOBase):
    """A stream whose reader is gone: every write fails as a pipe without a reader does."""

    def writable(self):
        return True

    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")


class ExplodingEnviron(dict):
    """An environment whose reads fail: stands for any bug the guard did not foresee."""

    def get(self, key, default=None):
        raise RuntimeError("environment unreadable\nsecond line")


def _run_cli(package_dir, args, env, stdout=subprocess.PIPE, wrapper=()):
    return subprocess.run(
        [*wrapper, *checkout.guard_argv(sys.executable, package_dir, *args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=120,
        check=False,
    )


def test_a_task_without_eessi_gets_nothing():
    assert _main([], {"PATH": os.defpath}) == (0, b"", b"")
    assert _main([], {"EESSI_SOFTWARE_SUBDIR": ""}) == (0, b"", b"")
    assert _main(["--shell"], {}) == (0, b"", b"")


@pytest.mark.parametrize("switch", ["0", "off", "no", "false"])
def test_a_disabled_guard_emits_nothing(switch):
    assert _main([], _loaded_elsewhere(EESSI_ARCH_GUARD=switch)) == (0, b"", b"")


def test_a_disabled_guard_says_why_when_verbose():
    status, stdout, stderr = _main(
        [], _loaded_elsewhere(EESSI_ARCH_GUARD="off", EESSI_ARCH_GUARD_VERBOSE="1")
    )
    assert (status, stdout) == (0, b"")
    assert stderr == b"eessi-arch-guard: disabled by EESSI_ARCH_GUARD=off\n"


@pytest.mark.parametrize("local_id", [None, "0"])
def test_a_failure_exports_the_marker_and_prints_for_the_first_task(local_id):
    env = _loaded_elsewhere() if local_id is None else _loaded_elsewhere(SLURM_LOCALID=local_id)
    status, stdout, stderr = _main([], env)
    assert (status, stderr) == (0, b"")
    export, message = stdout.splitlines(keepends=True)
    assert export == FAILED_EXPORT
    assert message.startswith(b"print eessi-arch-guard: could not detect this node's CPU; ")
    assert b"module reset" in message
    assert b"--export=NONE" in message
    applied = parse(stdout, {os.fsencode(k): os.fsencode(v) for k, v in env.items()})
    assert applied.env[b"EESSI_ARCH_GUARD_FAILED"] == b"x86_64/amd/zen3->archdetect-failed"
    assert applied.printed == [message[len(b"print ") : -1]]


@pytest.mark.parametrize("local_id", ["1", "12", ""])
def test_other_local_tasks_get_the_marker_without_the_print_line(local_id):
    assert _main([], _loaded_elsewhere(SLURM_LOCALID=local_id)) == (0, FAILED_EXPORT, b"")


def test_verbose_writes_the_reason_to_stderr_only():
    status, stdout, stderr = _main([], _loaded_elsewhere(SLURM_LOCALID="1", EESSI_ARCH_GUARD_VERBOSE="1"))
    assert (status, stdout) == (0, FAILED_EXPORT)
    assert (
        stderr == b"eessi-arch-guard: no eessi_archdetect.sh in /nonexistent/eessi/init/eessi_archdetect.sh\n"
    )


def test_the_shell_form_writes_code_to_stdout_and_the_message_to_stderr():
    status, stdout, stderr = _main(["--shell"], _loaded_elsewhere(SLURM_LOCALID="3"))
    assert status == 0
    assert stdout == b"export EESSI_ARCH_GUARD_FAILED='x86_64/amd/zen3->archdetect-failed'\n"
    assert stderr.startswith(b"eessi-arch-guard: could not detect this node's CPU; ")
    assert stderr.count(b"\n") == 1


@pytest.mark.parametrize("argv", [["--bogus"], ["extra"], ["--sh"], ["--json", "x"]])
def test_bad_arguments_in_prolog_mode_are_one_print_skip_line(argv):
    status, stdout, stderr = _main(argv, _loaded_elsewhere())
    assert (status, stderr) == (0, b"")
    assert stdout.startswith(b"print eessi-arch-guard: skipped, ")
    assert stdout.count(b"\n") == 1
    assert stdout.endswith(b"\n")


@pytest.mark.parametrize(
    "argv", [["--shell", "--bogus"], ["--bogus", "--shell"], ["--shell", "extra"], ["--shell=yes"]]
)
def test_bad_arguments_in_shell_mode_are_one_skip_line_on_stderr(argv):
    # Anything on stdout would be run by eval "$(eessi-arch-guard --shell ...)".
    status, stdout, stderr = _main(argv, _loaded_elsewhere())
    assert (status, stdout) == (0, b"")
    assert stderr.startswith(b"eessi-arch-guard: skipped, ")
    assert stderr.count(b"\n") == 1


def test_an_unexpected_exception_is_one_print_skip_line():
    status, stdout, stderr = _main([], ExplodingEnviron())
    assert (status, stderr) == (0, b"")
    assert stdout == b"print eessi-arch-guard: skipped, RuntimeError: environment unreadable second line\n"


def test_an_unexpected_exception_in_shell_mode_is_one_skip_line_on_stderr():
    status, stdout, stderr = _main(["--shell"], ExplodingEnviron())
    assert (status, stdout) == (0, b"")
    assert stderr == b"eessi-arch-guard: skipped, RuntimeError: environment unreadable second line\n"


@pytest.mark.parametrize("local_id", ["1", "127"])
def test_other_local_tasks_get_no_skip_line(local_id):
    status, stdout, stderr = _main(["--bogus"], {"SLURM_LOCALID": local_id})
    assert (status, stdout, stderr) == (0, b"", b"")


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_goes_to_stdout_in_prolog_mode(flag):
    status, stdout, stderr = _main([flag], _loaded_elsewhere())
    assert (status, stderr) == (0, b"")
    assert stdout.startswith(b"usage: eessi-arch-guard")
    assert b"--shell" in stdout


def test_help_goes_to_stderr_in_shell_mode_where_stdout_is_evaluated():
    status, stdout, stderr = _main(["--shell", "--help"], _loaded_elsewhere())
    assert (status, stdout) == (0, b"")
    assert stderr.startswith(b"usage: eessi-arch-guard")


def test_abbreviated_options_are_refused_not_guessed():
    status, stdout, stderr = _main(["--sh"], _loaded_elsewhere())
    assert (status, stderr) == (0, b"")
    assert stdout == b"print eessi-arch-guard: skipped, unrecognized arguments: --sh\n"


@pytest.mark.parametrize("argv", [[], ["--shell"], ["--bogus"]])
def test_a_stdout_whose_write_raises_broken_pipe_still_returns_0(argv):
    stderr = io.BytesIO()
    assert cli.main(argv, environ=_loaded_elsewhere(), stdout=BrokenPipe(), stderr=stderr) == 0
    if argv == ["--shell"]:
        assert stderr.getvalue().startswith(b"eessi-arch-guard: could not detect")


@pytest.mark.parametrize("argv", [[], ["--shell"], ["--bogus"], ["--shell", "--bogus"]])
def test_closed_streams_still_return_0(argv):
    stdout, stderr = io.BytesIO(), io.BytesIO()
    stdout.close()
    stderr.close()
    assert cli.main(argv, environ=_loaded_elsewhere(), stdout=stdout, stderr=stderr) == 0


def test_a_real_run_writes_the_prolog_lines_and_nothing_on_stderr(package_dir):
    result = _run_cli(package_dir, [], _loaded_elsewhere(SLURM_LOCALID="1"))
    assert (result.returncode, result.stdout, result.stderr) == (0, FAILED_EXPORT, b"")


@pytest.mark.parametrize("args", [[], ["--shell"], ["--bogus"], ["--shell", "--bogus"]])
def test_a_real_run_with_stdout_closed_by_its_reader_exits_0_quietly(package_dir, args):
    # DEVNULL would accept every write: a pipe whose read end is closed makes them fail
    # with EPIPE, as when slurmstepd or the job script's $(...) stopped reading.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = _run_cli(package_dir, args, _loaded_elsewhere(SLURM_LOCALID="0"), stdout=write_end)
    finally:
        os.close(write_end)
    assert result.returncode == 0
    assert b"Exception ignored" not in result.stderr
    assert b"Traceback" not in result.stderr
    if args == ["--shell"]:
        assert result.stderr.startswith(b"eessi-arch-guard: could not detect this node's CPU")
    elif args == []:
        assert result.stderr == b""


def test_a_real_run_without_any_stdout_exits_0_quietly(package_dir):
    # `eessi-arch-guard >&-`: descriptor 1 is not open at all, so Python has no sys.stdout.
    without_fd1 = ("/bin/sh", "-c", 'exec "$@" >&-', "sh")
    result = _run_cli(package_dir, [], _loaded_elsewhere(), wrapper=without_fd1)
    assert (result.returncode, result.stderr) == (0, b"")


# What a job's user (or a site's module tree) put in the environment reaches the job's output
# and a verbose stderr escaped, as every value eb-staged-rebuild shows.


def test_the_verbose_detail_shows_a_hostile_prefix_escaped_on_its_one_line():
    env = _loaded_elsewhere(
        SLURM_LOCALID="1", EESSI_ARCH_GUARD_VERBOSE="1", EESSI_PREFIX=f"/nonexistent/{hostile.SEQUENCES}"
    )

    status, stdout, stderr = _main([], env)

    assert (status, stdout) == (0, FAILED_EXPORT)
    assert (
        stderr
        == (
            "eessi-arch-guard: no eessi_archdetect.sh in "
            f"/nonexistent/{hostile.SHOWN}/init/eessi_archdetect.sh\n"
        ).encode()
    )


class HostileEnviron(dict):
    """An environment whose reads fail with a message that holds the sequences."""

    def get(self, key, default=None):
        raise RuntimeError(hostile.CLIPBOARD + hostile.ERASE_LINE + hostile.C1_CSI + hostile.NOT_UTF8)


@pytest.mark.parametrize("argv", [[], ["--shell"]])
def test_a_skip_line_shows_what_it_quotes_escaped(argv):
    status, stdout, stderr = _main(argv, HostileEnviron())

    line = stdout if not argv else stderr
    assert status == 0
    assert line.endswith(b"skipped, RuntimeError: " + hostile.IN_A_PATH_SHOWN.encode() + b"\n")
    hostile.assert_shown_safely(line)


def test_json_is_valid_unicode_and_names_a_value_that_is_not():
    env = _loaded_elsewhere(EESSI_PREFIX=f"/nonexistent/{hostile.NOT_UTF8}")

    status, stdout, _stderr = _main(["--json"], env)

    decision = json.loads(stdout.decode("utf-8"))
    assert status == 0
    assert decision["detail"] == "no eessi_archdetect.sh in /nonexistent/\\xff/init/eessi_archdetect.sh"
    assert decision["escaped"] == ["/detail"]
    assert b"\\ud" not in stdout


def _documented_json_keys() -> set:
    """The keys the reference's "JSON (`--json`)" paragraph names (what its parentheses hold
    are values, not keys)."""
    text = (checkout.REPO / "docs" / "reference" / "eessi-arch-guard.md").read_text()
    paragraph = text.split("### JSON (`--json`)\n", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^()]*\)", "", paragraph)))


@pytest.mark.parametrize("argv", [["--json"], ["--shell", "--json"]])
@pytest.mark.parametrize(
    ("action", "environ"), [("skip", {"PATH": os.defpath}), ("fail", _loaded_elsewhere())]
)
def test_the_json_decision_has_the_keys_the_reference_lists(argv, action, environ):
    status, stdout, _stderr = _main(argv, environ)

    decision = json.loads(stdout)
    assert status == 0
    assert decision["action"] == action
    documented = _documented_json_keys()
    assert documented == {"action", "detail", "changes", "message", "mode", "escaped"}
    # escaped only when a value is not UTF-8 (test_json_is_valid_unicode_and_names_a_value_that_is_not).
    assert set(decision) == documented - {"escaped"}
