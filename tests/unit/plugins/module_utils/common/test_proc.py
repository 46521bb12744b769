"""Children under a deadline: captured output, their own session, the group killed at the deadline."""

from __future__ import annotations

import os
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import proc


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
