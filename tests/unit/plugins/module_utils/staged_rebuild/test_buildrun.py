"""Running the build: step lines streamed, the whole output kept, nothing left running.

The "EasyBuild" here is a small shell script that prints what EasyBuild prints (``== ...``
step lines between compiler noise); the processes, pipes, sessions and signals are real.
"""

from __future__ import annotations

import os
import select
import sys
import textwrap

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import buildrun

# Generous: only a broken kill makes the test wait this long.
EXIT_DEADLINE_SECONDS = 60
EB_OUTPUT = [
    "== Temporary log file in case of crash /tmp/eb-x/easybuild-x.log",
    "== found valid index for /easyconfigs, so using it...",
    "== processing EasyBuild easyconfig /easyconfigs/t/Tiny/Tiny-1.0.eb",
    "== building and installing Tiny/1.0...",
    "gcc -O2 -c tiny.c",
    "==not a step line",
    " == indented, not a step line",
    "== ... (took 2 secs)",
    "== COMPLETED: Installation ended successfully (took 3 secs)",
]
STEP_LINES = [
    "== Temporary log file in case of crash /tmp/eb-x/easybuild-x.log",
    "== found valid index for /easyconfigs, so using it...",
    "== processing EasyBuild easyconfig /easyconfigs/t/Tiny/Tiny-1.0.eb",
    "== building and installing Tiny/1.0...",
    "== COMPLETED: Installation ended successfully (took 3 secs)",
]


class ProgressStopped(Exception):
    """What a caller's progress callback might raise."""


def _script(tmp_path, body, name="eb"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def _eb_printing(tmp_path, lines, exit_code=0):
    printed = "".join(f"printf '%s\\n' '{line}'\n" for line in lines)
    return _script(tmp_path, printed + f"exit {exit_code}\n")


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


def _run(argv, run_dir, setup=None, env=None):
    lines = []
    log = buildrun.run(argv, dict(os.environ) if env is None else env, str(run_dir), lines.append, setup)
    return log, lines


# success


def test_only_step_lines_stream_to_progress(tmp_path, run_dir):
    _log, lines = _run([_eb_printing(tmp_path, EB_OUTPUT)], run_dir)

    assert lines == STEP_LINES


def test_the_whole_output_is_kept_in_build_log(tmp_path, run_dir):
    log, _lines = _run([_eb_printing(tmp_path, EB_OUTPUT)], run_dir)

    assert log == str(run_dir / "build.log")
    assert (run_dir / "build.log").read_text() == "".join(line + "\n" for line in EB_OUTPUT)


def test_standard_error_goes_to_the_log_in_order_and_its_step_lines_stream(tmp_path, run_dir):
    eb = _script(tmp_path, "echo '== out'\necho 'warning: err' >&2\necho '== err step' >&2\necho tail\n")

    _log, lines = _run([eb], run_dir)

    assert (run_dir / "build.log").read_text() == "== out\nwarning: err\n== err step\ntail\n"
    assert lines == ["== out", "== err step"]


def test_the_build_gets_the_arguments_and_environment_it_is_given(tmp_path, run_dir):
    eb = _script(tmp_path, 'echo "== args $* marker=$HPCSTACK_MARKER"\n')

    _log, lines = _run(
        [eb, "--robot", "Tiny-1.0.eb"], run_dir, env={"HPCSTACK_MARKER": "set", "PATH": "/bin"}
    )

    assert lines == ["== args --robot Tiny-1.0.eb marker=set"]


def test_the_build_reads_nothing_from_standard_input(tmp_path, run_dir):
    eb = _script(tmp_path, 'if read -r line; then echo "== read $line"; else echo "== no input"; fi\n')

    _log, lines = _run([eb], run_dir)

    assert lines == ["== no input"]


def test_the_build_leads_a_session_of_its_own(run_dir):
    code = "import os; print('== session', os.getsid(0), os.getpgid(0), os.getpid())"

    _log, lines = _run([sys.executable, "-c", code], run_dir)

    _word, _session, sid, pgid, pid = lines[0].split()
    assert sid == pgid == pid
    assert int(sid) != os.getsid(0)


def test_a_setup_runs_in_the_build_process_before_the_build(tmp_path, run_dir):
    marker = tmp_path / "setup-pid"
    eb = _script(tmp_path, 'echo "== pid $$ saw $(cat "$1")"\n')

    def setup():
        marker.write_text(str(os.getpid()))

    _log, lines = _run([eb, str(marker)], run_dir, setup=setup)

    _eq, _word, pid, _saw, seen = lines[0].split()
    assert pid == seen  # the same process, before exec
    assert int(pid) != os.getpid()


def test_output_that_is_not_utf_8_is_kept_with_replacement_characters(tmp_path, run_dir):
    eb = _script(tmp_path, "printf '== caf\\351\\n'\n")

    _log, lines = _run([eb], run_dir)

    assert lines == ["== caf\ufffd"]
    assert (run_dir / "build.log").read_text() == "== caf\ufffd\n"


# failures


def test_a_failing_build_raises_publish_error_naming_its_exit_code_easybuild_s_reason_and_log(
    tmp_path, run_dir
):
    eb = _eb_printing(tmp_path, [*EB_OUTPUT[:4], "ERROR: build failed"], exit_code=3)

    with pytest.raises(errors.PublishError) as caught:
        _run([eb], run_dir)

    log = run_dir / "build.log"
    assert (
        str(caught.value) == f"EasyBuild failed (exit 3): build failed; nothing was swapped; its log is {log}"
    )
    assert caught.value.details == {"easybuild_reason": "build failed", "build_log": str(log)}


# What EasyBuild 5.4 prints when a sanity check fails: its "== FAILED:" line wrapped at 80
# columns, then the summary, then the "ERROR:" line in one piece.
SANITY_FAILURE = [
    "== FAILED: Installation ended unsuccessfully: Sanity check failed: no file found",
    "at 'bin/yot' or 'bin/nothere' in /apps/software/toy/0.0 (took 0",
    "secs)",
    "== Results of the build can be found in the log file(s) ",
    "/tmp/eb-h31l5ges/easybuild-toy-0.0-20261204.175505.HbOoV.log",
    "== Summary:",
    "   * [FAILED]  toy/0.0",
    "",
    "",
    "ERROR: Installation of toy-0.0.eb failed: Sanity check failed: no file found at 'bin/yot' or "
    "'bin/nothere' in /apps/software/toy/0.0",
    "",
]


def test_easybuild_s_reason_is_its_last_error_line(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("ERROR: an earlier one\n" + "\n".join(SANITY_FAILURE))

    assert buildrun.easybuild_reason(str(log)) == (
        "Installation of toy-0.0.eb failed: Sanity check failed: no file found at 'bin/yot' or "
        "'bin/nothere' in /apps/software/toy/0.0"
    )


def test_without_an_error_line_the_reason_is_the_failed_line_with_its_wrapped_lines(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("\n".join(SANITY_FAILURE[:7]) + "\n")

    assert buildrun.easybuild_reason(str(log)) == (
        "Installation ended unsuccessfully: Sanity check failed: no file found at 'bin/yot' or "
        "'bin/nothere' in /apps/software/toy/0.0 (took 0 secs)"
    )


@pytest.mark.parametrize("text", ["", "== building...\n", "an ERROR: inside a line\n"])
def test_output_without_easybuild_s_words_has_no_reason(tmp_path, text):
    log = tmp_path / "build.log"
    log.write_text(text)

    assert buildrun.easybuild_reason(str(log)) is None


def test_a_missing_log_has_no_reason(tmp_path):
    assert buildrun.easybuild_reason(str(tmp_path / "none.log")) is None


def test_a_failing_build_keeps_its_whole_output_in_the_log(tmp_path, run_dir):
    output = [*EB_OUTPUT[:4], "ERROR: build failed"]

    with pytest.raises(errors.PublishError):
        _run([_eb_printing(tmp_path, output, exit_code=1)], run_dir)

    assert (run_dir / "build.log").read_text() == "".join(line + "\n" for line in output)


def test_a_build_killed_by_a_signal_is_a_failure(tmp_path, run_dir):
    eb = _script(tmp_path, "echo '== starting'\nkill -KILL $$\n")

    with pytest.raises(errors.PublishError) as caught:
        _run([eb], run_dir)

    assert str(caught.value).startswith("EasyBuild failed (exit -9); nothing was swapped")
    assert caught.value.details["easybuild_reason"] is None


def test_a_missing_command_is_refused_with_one_line(tmp_path, run_dir):
    missing = str(tmp_path / "no-such-eb")

    with pytest.raises(errors.UsageError) as caught:
        _run([missing], run_dir)

    assert str(caught.value) == f"cannot run {missing}: No such file or directory"


def test_a_setup_that_raises_is_reported_and_the_build_never_runs(tmp_path, run_dir):
    ran = tmp_path / "ran"
    eb = _script(tmp_path, f"touch {ran}\necho '== building'\n")

    def setup():
        raise OSError("mount /apps/software: Operation not permitted")

    with pytest.raises(errors.PublishError) as caught:
        _run([eb], run_dir, setup=setup)

    assert str(caught.value) == (
        "the build sandbox failed: mount /apps/software: Operation not permitted; "
        "nothing was built or swapped"
    )
    assert not ran.exists()


@pytest.mark.parametrize(
    "exception", [RuntimeError(), KeyboardInterrupt()], ids=["RuntimeError", "KeyboardInterrupt"]
)
def test_a_setup_that_raises_without_a_message_is_still_reported_as_the_sandbox_s_failure(
    tmp_path, run_dir, exception
):
    # A SIGINT during the set-up, or an exception without text: EasyBuild never ran, so the
    # message must not say that EasyBuild failed.
    ran = tmp_path / "ran"
    eb = _script(tmp_path, f"touch {ran}\n")

    def setup():
        raise exception

    with pytest.raises(errors.PublishError) as caught:
        _run([eb], run_dir, setup=setup)

    assert str(caught.value).startswith("the build sandbox failed")
    assert not ran.exists()


# the caller stops: the whole process group goes


def _grandchild_eb(tmp_path):
    """A build that starts a long-lived helper (as make or a compiler daemon would)."""
    pid_file = tmp_path / "helper.pid"
    eb = _script(tmp_path, f"sleep 100000 &\necho $! > {pid_file}\necho '== building Tiny/1.0'\nwait\n")
    return eb, pid_file


def _has_exited(pidfd):
    ready, _w, _x = select.select([pidfd], [], [], EXIT_DEADLINE_SECONDS)
    return ready == [pidfd]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, ProgressStopped], ids=["KeyboardInterrupt", "custom"])
def test_an_exception_in_progress_kills_the_whole_process_group(tmp_path, run_dir, stop):
    eb, pid_file = _grandchild_eb(tmp_path)
    helper = {}

    def progress(line):
        # The helper is alive here: a pidfd of it can be opened, and will report its exit.
        helper["pid"] = int(pid_file.read_text())
        helper["pidfd"] = os.pidfd_open(helper["pid"])
        raise stop(line)

    with pytest.raises(stop) as caught:
        buildrun.run([eb], dict(os.environ), str(run_dir), progress)

    try:
        assert str(caught.value) == "== building Tiny/1.0"
        assert _has_exited(helper["pidfd"])
    finally:
        os.close(helper["pidfd"])


def test_the_log_keeps_what_came_before_the_caller_stopped(tmp_path, run_dir):
    eb, _pid_file = _grandchild_eb(tmp_path)

    def progress(line):
        raise ProgressStopped(line)

    with pytest.raises(ProgressStopped):
        buildrun.run([eb], dict(os.environ), str(run_dir), progress)

    assert (run_dir / "build.log").read_text() == "== building Tiny/1.0\n"
