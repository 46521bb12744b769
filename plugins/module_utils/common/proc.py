# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running a child process under one deadline shared by several children.

The child gets its own session, so the whole process group it starts (a shell, Lmod, the
programs they run) can be killed at once, and stdin from /dev/null. Its stdout and stderr
are always captured: a caller such as a TaskProlog must never let a child write to its own
streams.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from .deadline import Deadline, DeadlineExceeded, hold_sigterm, release_sigterm, unblock_sigterm

# After SIGKILL the group is gone, but a process that left the group can keep the pipes
# open: each of the (at most three) waits after the kill is bounded by this.
POST_KILL_WAIT_SECONDS = 5


class ChildResult:
    """What a finished child left: its exit status and everything it wrote."""

    __slots__ = ("returncode", "stderr", "stdout")

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def summary(output: bytes, limit: int = 300) -> str:
    """A child's output as one line for a message: blank lines dropped, runs of space joined."""
    text = " ".join(os.fsdecode(output).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_child(argv, *, env, deadline: Deadline, cwd=None) -> ChildResult:
    """Run ``argv`` to completion or until ``deadline``; raise DeadlineExceeded on the latter.

    A SIGTERM that arrives while the child is being started is held until its process
    group is known, so that the exception it raises (deadline.Terminated) finds a group to
    kill. ``OSError`` from starting the program (not found, not executable) reaches the
    caller.
    """
    mask = hold_sigterm()
    try:
        child = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=unblock_sigterm,  # noqa: PLW1509 (the blocked mask would survive exec)
        )
    except BaseException:
        release_sigterm(mask)
        raise
    try:
        release_sigterm(mask)
        stdout, stderr = child.communicate(timeout=deadline.remaining())
    except subprocess.TimeoutExpired:
        _kill_group(child)
        raise DeadlineExceeded(f"{argv[0]} still running after {deadline.seconds:g} s") from None
    except BaseException:
        _kill_group(child)
        raise
    return ChildResult(child.returncode, stdout, stderr)


def _kill_group(child: subprocess.Popen) -> None:
    # The child leads its own session, so its pid is the group id of everything it started
    # that stayed in the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    try:
        child.communicate(timeout=POST_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        # A process outside the group still holds a pipe: stop reading and close it.
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=POST_KILL_WAIT_SECONDS)
    if child.returncode is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=POST_KILL_WAIT_SECONDS)
