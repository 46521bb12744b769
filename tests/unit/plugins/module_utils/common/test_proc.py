"""Children with their own session: output captured, logged or streamed by line; the whole
group killed at the deadline, on SIGTERM and on any exception while the caller waits.

All real processes; a killed group is checked on a helper the child started in the background.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors, proc
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import raise_on_sigterm


def test_output_and_status_are_captured_not_passed_on(capfd):
    result = proc.run_child(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], env={"PATH": os.defpath}, deadline=proc.Deadline(30)
    )
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert capfd.readouterr() == ("", "")


def test_child_leads_its_own_session_with_stdin_from_dev_null():
    result = proc.run_child(
        ["sh", "-c", "ps -o sid= -p $$; echo $$; cat; readlink /proc/self/fd/0"],
        env={"PATH": os.defpath},
        deadline=proc.Deadline(30),
    )
    sid, pid, stdin = result.stdout.decode().split()
    assert sid == pid
    assert stdin == "/dev/null"


def test_input_bytes_are_the_child_s_stdin_and_its_end():
    # sbatch reads its batch script from stdin.
    result = proc.run_child(
        ["sh", "-c", "cat; echo end"],
        env={"PATH": os.defpath},
        deadline=proc.Deadline(30),
        input_bytes=b"a\nb",
    )
    assert (result.returncode, result.stdout) == (0, b"a\nbend\n")
    with pytest.raises(ValueError, match="input_bytes with captured output only"):
        proc.run_child(["true"], env=None, input_bytes=b"", on_line=lambda line: None)


def test_a_child_that_does_not_read_its_input_bytes_still_ends_at_the_deadline():
    with pytest.raises(proc.DeadlineExceeded):
        proc.run_child(["sleep", "30"], env=None, deadline=proc.Deadline(0.5), input_bytes=b"x" * (1 << 20))


def test_a_passed_descriptor_is_the_child_s_at_its_number_and_no_other_is(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho ran from $0\n")
    script.chmod(0o755)
    passed = os.open(script, os.O_RDONLY | os.O_CLOEXEC)
    kept_back = os.open(script, os.O_RDONLY)  # inheritable, yet not passed
    try:
        # The file checked by its descriptor, run through it: its name is never looked up again.
        script.rename(tmp_path / "moved.sh")
        ran = proc.run_child([f"/proc/self/fd/{passed}"], env={"PATH": os.defpath}, pass_fds=[passed])
        listed = proc.run_child(["ls", "/proc/self/fd"], env={"PATH": os.defpath}, pass_fds=[passed])
    finally:
        os.close(passed)
        os.close(kept_back)

    assert (ran.returncode, ran.stdout) == (0, f"ran from /proc/self/fd/{passed}\n".encode())
    assert str(passed) in listed.stdout.decode().split()
    assert str(kept_back) not in listed.stdout.decode().split()


def test_child_runs_in_the_given_directory_with_the_given_environment(tmp_path):
    result = proc.run_child(
        ["sh", "-c", 'pwd; echo "$ONLY"'],
        env={"PATH": os.defpath, "ONLY": "this"},
        deadline=proc.Deadline(30),
        cwd=tmp_path,
    )
    assert result.stdout.decode().split() == [str(tmp_path), "this"]


def test_deadline_kills_the_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; sleep 300"
    started = time.monotonic()
    with pytest.raises(proc.DeadlineExceeded):
        proc.run_child(["sh", "-c", script], env={"PATH": os.defpath}, deadline=proc.Deadline(1))
    assert time.monotonic() - started < 60
    grandchild = int(pids.read_text())
    # The pipes close in the kernel's exit path a moment before the process becomes a zombie.
    give_up = time.monotonic() + 5
    while is_running(grandchild) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not is_running(grandchild)


def is_running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_deadline_already_passed_still_ends_the_child():
    deadline = proc.Deadline(0)
    assert deadline.expired()
    with pytest.raises(proc.DeadlineExceeded):
        proc.run_child(["sleep", "300"], env={"PATH": os.defpath}, deadline=deadline)


def test_missing_program_raises_oserror():
    with pytest.raises(FileNotFoundError):
        proc.run_child(["/nonexistent/program"], env={}, deadline=proc.Deadline(30))


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (b"", ""),
        (b"\n\n  one\n\n two  \n", "one two"),
        (b"x" * 400, "x" * 297 + "..."),
        (b"bad \xff byte", "bad \udcff byte"),
    ],
)
def test_summary_is_one_bounded_line(output, expected):
    assert proc.summary(output) == expected


# the three ways out for the output


def test_output_fd_receives_both_streams_and_nothing_is_captured(tmp_path, capfd):
    log = tmp_path / "child.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        result = proc.run_child(
            ["sh", "-c", "echo out; echo err >&2; exit 4"], env={"PATH": os.defpath}, output_fd=fd
        )
    finally:
        os.close(fd)

    assert (result.returncode, result.stdout, result.stderr) == (4, b"", b"")
    assert log.read_text() == "out\nerr\n"
    assert capfd.readouterr() == ("", "")


def test_on_line_gets_every_line_of_both_streams_in_order_with_its_newline(capfd):
    lines = []

    result = proc.run_child(
        ["sh", "-c", "echo one; echo two >&2; printf 'no newline at the end'"],
        env={"PATH": os.defpath},
        on_line=lines.append,
    )

    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert lines == ["one\n", "two\n", "no newline at the end"]
    assert capfd.readouterr() == ("", "")


def test_on_line_replaces_bytes_that_are_not_utf_8_and_keeps_long_lines_whole():
    lines = []
    # 50,000 two-byte characters: more than one read, and more than a pipe holds at once.
    code = "import sys; sys.stdout.buffer.write('é'.encode() * 50000 + b'\\ncaf\\xe9\\n')"

    proc.run_child([sys.executable, "-c", code], env={}, on_line=lines.append)

    assert lines == ["é" * 50000 + "\n", "caf\ufffd\n"]


def test_output_fd_and_on_line_together_are_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"

    with pytest.raises(ValueError, match="not both"):
        proc.run_child(["touch", str(marker)], env={"PATH": os.defpath}, output_fd=2, on_line=print)

    assert not marker.exists()


def test_without_a_deadline_the_child_runs_to_its_end():
    result = proc.run_child(["sh", "-c", "sleep 0.3; echo done"], env={"PATH": os.defpath})

    assert (result.returncode, result.stdout) == (0, b"done\n")


# the whole group goes, however the caller stops


def _helper_script(pids):
    return f"sleep 300 & echo $! > {pids}; echo started; sleep 300"


def _wait_until_gone(pid):
    # The pipes close in the kernel's exit path a moment before the process becomes a zombie.
    give_up = time.monotonic() + 5
    while is_running(pid) and time.monotonic() < give_up:
        time.sleep(0.05)
    return not is_running(pid)


@pytest.mark.parametrize("mode", ["output_fd", "on_line"])
def test_the_deadline_kills_the_whole_group_whatever_the_output(tmp_path, mode):
    pids = tmp_path / "pids"
    log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    output = {"output_fd": log_fd} if mode == "output_fd" else {"on_line": lambda line: None}
    try:
        with pytest.raises(proc.DeadlineExceeded, match="still running after 1 s"):
            proc.run_child(
                ["sh", "-c", _helper_script(pids)],
                env={"PATH": os.defpath},
                deadline=proc.Deadline(1),
                **output,
            )
    finally:
        os.close(log_fd)

    assert _wait_until_gone(int(pids.read_text()))


def test_a_child_that_keeps_writing_does_not_outrun_the_deadline():
    started = time.monotonic()
    seen = []

    with pytest.raises(proc.DeadlineExceeded):
        proc.run_child(["yes"], env={"PATH": os.defpath}, deadline=proc.Deadline(0.5), on_line=seen.append)

    assert time.monotonic() - started < 30
    assert seen[0] == "y\n"


def test_an_exception_from_on_line_kills_the_whole_group_and_reaches_the_caller(tmp_path):
    pids = tmp_path / "pids"

    def stop(line):
        raise KeyboardInterrupt(line)

    with pytest.raises(KeyboardInterrupt, match="started"):
        proc.run_child(["sh", "-c", _helper_script(pids)], env={"PATH": os.defpath}, on_line=stop)

    assert _wait_until_gone(int(pids.read_text()))


@pytest.fixture
def sigterm_raises_terminated():
    previous = signal.getsignal(signal.SIGTERM)
    raise_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("mode", ["captured", "output_fd", "on_line", "no deadline"])
def test_sigterm_while_the_child_runs_kills_the_whole_group(tmp_path, sigterm_raises_terminated, mode):
    # The child signals this process itself, once it is running; Python runs the handler in
    # the main thread, where run_child waits.
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; sleep 0.2; kill -TERM $PPID; sleep 300"
    log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    output = {"output_fd": {"output_fd": log_fd}, "on_line": {"on_line": lambda line: None}}.get(mode, {})
    deadline = None if mode == "no deadline" else proc.Deadline(60)
    try:
        with pytest.raises(errors.Terminated):
            proc.run_child(["sh", "-c", script], env={"PATH": os.defpath}, deadline=deadline, **output)
    finally:
        os.close(log_fd)

    assert _wait_until_gone(int(pids.read_text()))


def test_preexec_runs_in_the_child_before_exec(tmp_path):
    marker = tmp_path / "preexec-pid"

    result = proc.run_child(
        ["sh", "-c", f'echo $$ "$(cat {marker})"'],
        env={"PATH": os.defpath},
        preexec=lambda: marker.write_text(str(os.getpid())),
    )

    shell, seen = result.stdout.decode().split()
    assert shell == seen
    assert int(shell) != os.getpid()


def test_a_missing_working_directory_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        proc.run_child(["true"], env={"PATH": os.defpath}, cwd=tmp_path / "missing")


# several children at once


def test_run_children_runs_them_at_the_same_time(tmp_path):
    # The first waits for a file only the second makes: one after the other, the first
    # would wait out the deadline.
    flag = tmp_path / "flag"
    waits = f"while [ ! -e {flag} ]; do sleep 0.01; done; echo saw it"
    makes = f"touch {flag}; echo made it"

    first, second = proc.run_children(
        [["sh", "-c", waits], ["sh", "-c", makes]], env={"PATH": os.defpath}, deadline=proc.Deadline(30)
    )

    assert (first.returncode, first.stdout) == (0, b"saw it\n")
    assert (second.returncode, second.stdout) == (0, b"made it\n")


def test_run_children_gives_each_its_own_status_and_streams_in_order():
    results = proc.run_children(
        [["sh", "-c", "echo one; echo err1 >&2; exit 3"], ["sh", "-c", "echo two"]],
        env={"PATH": os.defpath},
        deadline=proc.Deadline(30),
    )

    assert [(result.returncode, result.stdout, result.stderr) for result in results] == [
        (3, b"one\n", b"err1\n"),
        (0, b"two\n", b""),
    ]


def test_run_children_on_the_deadline_kills_every_group(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"

    with pytest.raises(proc.DeadlineExceeded, match="still running after 1 s"):
        proc.run_children(
            [["sh", "-c", _helper_script(first)], ["sh", "-c", _helper_script(second)]],
            env={"PATH": os.defpath},
            deadline=proc.Deadline(1),
        )

    assert _wait_until_gone(int(first.read_text()))
    assert _wait_until_gone(int(second.read_text()))


def test_run_children_a_program_that_cannot_start_ends_those_already_started():
    # A sleep this test alone runs, found by its argument: it may not have run a line yet.
    seconds = f"300.{os.getpid()}"

    with pytest.raises(FileNotFoundError):
        proc.run_children(
            [["sleep", seconds], ["/nonexistent/program"]],
            env={"PATH": os.defpath},
            deadline=proc.Deadline(30),
        )

    give_up = time.monotonic() + 5
    while _running_with_argument(seconds) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not _running_with_argument(seconds)


def _running_with_argument(argument: str) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().split(b"\0")
        except OSError:
            continue
        if argument.encode() in args and is_running(int(entry)):
            found.append(int(entry))
    return found


def test_run_children_sigterm_kills_every_group(tmp_path, sigterm_raises_terminated):
    first, second = tmp_path / "first", tmp_path / "second"
    signals = f"sleep 300 & echo $! > {second}; sleep 0.2; kill -TERM $PPID; sleep 300"

    with pytest.raises(errors.Terminated):
        proc.run_children(
            [["sh", "-c", _helper_script(first)], ["sh", "-c", signals]],
            env={"PATH": os.defpath},
            deadline=proc.Deadline(60),
        )

    assert _wait_until_gone(int(first.read_text()))
    assert _wait_until_gone(int(second.read_text()))


def test_find_program_takes_the_first_executable_file_on_the_path(tmp_path):
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for directory in (first, second, third):
        directory.mkdir()
    (first / "tool").write_text("not executable\n")
    (second / "tool").mkdir()  # a directory is no program, executable bits or not
    (third / "tool").write_text("#!/bin/sh\n")
    (third / "tool").chmod(0o755)

    assert proc.find_program("tool", f"{first}:{second}:{third}") == str(third / "tool")
    assert proc.find_program("tool", f"{first}:{second}") is None
    assert proc.find_program("absent", str(third)) is None
