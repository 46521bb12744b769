# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running a child process: its own session, stdin from /dev/null, an optional deadline, and
its whole process group killed whenever the caller stops waiting for it.

The child gets its own session, so the whole process group it starts (a shell, Lmod,
EasyBuild and the compilers it runs) can be killed at once. Its stdout and stderr never
reach the caller's own streams (a TaskProlog's stdout is parsed by Slurm, ``--json`` prints
one document): they are captured, or written to a file descriptor (a log), or streamed line
by line to a callback. On the deadline, on SIGTERM (``Terminated``, raised by the caller's
handler), and on any other exception while the child runs (a callback that raises, an
interrupt), the group is killed before the exception travels on, so nothing the child
started keeps running or writing after the caller has moved on.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess

from .deadline import Deadline, DeadlineExceeded, hold_sigterm, release_sigterm, unblock_sigterm

TYPE_CHECKING = False  # type checkers take this as True; typing costs the guard ~17 ms to import
if TYPE_CHECKING:
    from typing import Callable, Mapping, Optional, Sequence, Tuple

# After SIGKILL the group is gone, but a process that left the group can keep the pipes
# open: each of the (at most three) waits after the kill is bounded by this.
POST_KILL_WAIT_SECONDS = 5
_READ_BYTES = 65536


class ChildResult:
    """What a finished child left: its exit status and what it wrote, where it was captured.

    ``stdout`` and ``stderr`` are empty when the output went to a file descriptor or a
    callback.
    """

    __slots__ = ("returncode", "stderr", "stdout")

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def find_program(name: str, path: str):
    """The first executable file ``name`` in the directories of ``path``, else None: what
    ``shutil.which`` answers, without its import."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def summary(output: bytes, limit: int = 300) -> str:
    """A child's output as one line for a message: blank lines dropped, runs of space joined."""
    text = " ".join(os.fsdecode(output).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_child(
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]],
    deadline: Optional[Deadline] = None,
    cwd=None,
    output_fd: Optional[int] = None,
    on_line: Optional[Callable[[str], None]] = None,
    preexec: Optional[Callable[[], None]] = None,
    pass_fds: Sequence[int] = (),
    input_bytes: Optional[bytes] = None,
) -> ChildResult:
    """Run ``argv`` to completion, or until ``deadline`` (None: no limit) passes.

    Output, one of three ways: captured (the default; ``ChildResult.stdout`` and ``stderr``);
    both streams written to ``output_fd`` (a log the caller opened); or both streams merged
    and each line given to ``on_line`` as text (UTF-8, undecodable bytes replaced), with its
    newline. ``env=None`` passes this process's environment. ``preexec`` runs in the child
    between fork and exec (a sandbox's set-up); it must not return if it cannot do its job.
    ``pass_fds`` are descriptors the child keeps, at the same numbers (a file checked by its
    descriptor and run as ``/proc/self/fd/N``); every other one is closed.

    Raises ``DeadlineExceeded`` when the deadline passes, after killing the group. Any
    exception while the child runs (from ``on_line``, ``Terminated``, ``KeyboardInterrupt``)
    kills the group and is raised again. A SIGTERM that arrives while the child is being
    started is held until its process group exists, so that the ``Terminated`` it raises
    finds a group to kill. ``OSError`` from starting the program (not found, not
    executable, a missing ``cwd``) reaches the caller, with nothing left running.

    ``input_bytes``, with captured output only, is written to the child's stdin (a batch
    script for sbatch), which is /dev/null otherwise.
    """
    if output_fd is not None and on_line is not None:
        raise ValueError("run_child takes output_fd or on_line, not both")
    if input_bytes is not None and (output_fd is not None or on_line is not None):
        raise ValueError("run_child takes input_bytes with captured output only")
    stdout_to, stderr_to = _streams(output_fd, on_line)
    mask = hold_sigterm()
    try:
        child = _start(
            argv,
            env=env,
            cwd=cwd,
            stdout_to=stdout_to,
            stderr_to=stderr_to,
            preexec=preexec,
            pass_fds=pass_fds,
            stdin_from=subprocess.DEVNULL if input_bytes is None else subprocess.PIPE,
        )
    except BaseException:
        release_sigterm(mask)
        raise
    try:
        # Inside the try: a SIGTERM held meanwhile arrives here, and finds the group to kill.
        release_sigterm(mask)
        if input_bytes is not None:
            stdout, stderr = child.communicate(input_bytes, timeout=_remaining(deadline))
        else:
            stdout, stderr = _collect(child, deadline, output_fd, on_line)
    except (subprocess.TimeoutExpired, _Overdue):
        _kill_group(child)
        if deadline is None:  # only a deadline times out: anything else is a bug to show
            raise
        raise DeadlineExceeded(f"{argv[0]} still running after {deadline.seconds:g} s") from None
    except BaseException:
        _kill_group(child)
        raise
    return ChildResult(child.returncode, stdout, stderr)


def run_children(
    argvs: Sequence[Sequence[str]], *, env: Optional[Mapping[str, str]], deadline: Deadline
) -> list:
    """Run every command of ``argvs`` at the same time, output captured, and return their
    ``ChildResult``s in the same order once all have ended.

    Each child is started as ``run_child`` starts one, in its own session. On the deadline
    (``DeadlineExceeded``), on SIGTERM and on any other exception, every child not yet
    reaped has its group killed before the exception travels on. The outputs are read one
    child after the other: a child that fills its pipe waits until its turn comes.
    """
    started: list = []
    mask = hold_sigterm()
    try:
        for argv in argvs:
            started.append(
                _start(
                    argv,
                    env=env,
                    cwd=None,
                    stdout_to=subprocess.PIPE,
                    stderr_to=subprocess.PIPE,
                    preexec=None,
                )
            )
        # Inside the try: a SIGTERM held meanwhile arrives here, and every group is killed.
        release_sigterm(mask)
        results = []
        for argv, child in zip(argvs, started):
            try:
                stdout, stderr = child.communicate(timeout=_remaining(deadline))
            except subprocess.TimeoutExpired:
                raise DeadlineExceeded(f"{argv[0]} still running after {deadline.seconds:g} s") from None
            results.append(ChildResult(child.returncode, stdout, stderr))
        return results
    except BaseException:
        release_sigterm(mask)
        for child in started:
            # Only a child not yet reaped: a reaped one's process group id may be reused.
            if child.returncode is None:
                _kill_group(child)
        raise


def _start(
    argv, *, env, cwd, stdout_to, stderr_to, preexec, pass_fds=(), stdin_from=subprocess.DEVNULL
) -> subprocess.Popen:
    """``argv`` started in its own session, stdin from /dev/null unless the caller writes it;
    SIGTERM is held by the caller."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=stdin_from,
        stdout=stdout_to,
        stderr=stderr_to,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        preexec_fn=_in_child(preexec),  # noqa: PLW1509 (the blocked mask would survive exec)
    )


def _collect(
    child: subprocess.Popen,
    deadline: Optional[Deadline],
    output_fd: Optional[int],
    on_line: Optional[Callable[[str], None]],
) -> Tuple[bytes, bytes]:
    """Wait for ``child`` and return ``(stdout, stderr)``, empty unless captured here."""
    if on_line is not None:
        pipe = child.stdout
        if pipe is not None:  # always: the lines come through the pipe Popen made
            _stream_lines(pipe.fileno(), on_line, deadline)
            pipe.close()
    elif output_fd is None:
        return child.communicate(timeout=_remaining(deadline))
    child.wait(timeout=_remaining(deadline))
    return b"", b""


def _streams(output_fd: Optional[int], on_line: Optional[Callable[[str], None]]) -> Tuple[int, int]:
    """``(stdout, stderr)`` for Popen: pipes to capture, the log, or one pipe for lines."""
    if output_fd is not None:
        return output_fd, output_fd
    if on_line is not None:
        return subprocess.PIPE, subprocess.STDOUT
    return subprocess.PIPE, subprocess.PIPE


def _in_child(preexec: Optional[Callable[[], None]]) -> Callable[[], None]:
    if preexec is None:
        return unblock_sigterm

    def run():
        unblock_sigterm()
        preexec()

    return run


def _remaining(deadline: Optional[Deadline]) -> Optional[float]:
    return None if deadline is None else deadline.remaining()


class _Overdue(Exception):
    """The deadline passed while lines were streamed (``communicate`` and ``wait`` raise
    ``TimeoutExpired`` for the same)."""


def _stream_lines(fd: int, on_line: Callable[[str], None], deadline: Optional[Deadline]) -> None:
    """Give each line read from ``fd`` to ``on_line`` until the child's end of the pipe closes."""
    pending = bytearray()
    while True:
        if deadline is not None:
            left = deadline.remaining()
            # Checked even when output keeps coming: a chatty child must not outrun the deadline.
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Overdue
        chunk = os.read(fd, _READ_BYTES)
        if not chunk:
            break
        pending += chunk
        # Split on bytes, decode whole lines: a character is never cut between two reads.
        *lines, rest = pending.split(b"\n")
        pending = bytearray(rest)
        for line in lines:
            on_line((line + b"\n").decode("utf-8", "replace"))
    if pending:
        on_line(pending.decode("utf-8", "replace"))


def _kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group, then reap the child and close its pipes."""
    # The child leads its own session, so its pid is the group id of everything it started
    # that stayed in the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    if child.stdin is not None:  # input a child never read: nobody reads it now
        with contextlib.suppress(OSError):
            child.stdin.close()
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
