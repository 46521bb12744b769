"""One try of a lock and one poll: real flock and POSIX record locks, held by real processes.

flock conflicts between two open file descriptions even in one process, so a second open
of the file holds it against the first. A POSIX record lock never conflicts within one
process, so the holder there is a child process that signals through a pipe when it has
the lock and lets go when the pipe's other end closes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import lockwait
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline

# The child: take the lock named by argv[1] on argv[2], say "locked", hold until stdin closes.
HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[2], os.O_RDWR)
take = fcntl.flock if sys.argv[1] == "flock" else fcntl.lockf
take(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""
CHILD_TIMEOUT = 60


@pytest.fixture
def lock_file(tmp_path):
    path = tmp_path / "lock"
    path.write_bytes(b"")
    return path


@pytest.fixture
def open_fd(lock_file):
    fd = os.open(lock_file, os.O_RDWR)
    yield fd
    os.close(fd)


@pytest.fixture
def held_by_child(lock_file):
    """Start a process holding ``kind`` on the lock file; returns a function that releases it."""
    children = []

    def hold(kind):
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, kind, str(lock_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        assert child.stdout.readline() == "locked\n"
        return lambda: _release(child)

    yield hold
    for child in children:
        _release(child)


def _release(child):
    if child.returncode is None:
        child.stdin.close()
        child.wait(timeout=CHILD_TIMEOUT)
        child.stdout.close()


# the contention errnos


@pytest.mark.parametrize("err", [errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK], ids=errno.errorcode.get)
def test_eacces_eagain_and_ewouldblock_mean_another_holder(err):
    assert lockwait.is_contention(OSError(err, os.strerror(err)))


@pytest.mark.parametrize(
    "err", [errno.EPERM, errno.EBADF, errno.ENOLCK, errno.EINVAL], ids=errno.errorcode.get
)
def test_other_errnos_are_failures_not_contention(err):
    assert not lockwait.is_contention(OSError(err, os.strerror(err)))


# try_flock


def test_try_flock_takes_a_free_lock(lock_file, open_fd):
    assert lockwait.try_flock(open_fd) is True

    other = os.open(lock_file, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)


def test_try_flock_answers_false_at_once_while_another_open_holds_it(lock_file, open_fd):
    holder = os.open(lock_file, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        assert lockwait.try_flock(open_fd) is False
        assert time.monotonic() - started < 1
    finally:
        os.close(holder)


TRIES = {"flock": lockwait.try_flock, "lockf": lockwait.try_record_lock}


@pytest.mark.parametrize(("kind", "try_lock"), TRIES.items(), ids=TRIES)
def test_a_try_answers_false_while_another_process_holds_the_lock_and_true_after(
    open_fd, held_by_child, kind, try_lock
):
    release = held_by_child(kind)

    assert try_lock(open_fd) is False
    release()
    assert try_lock(open_fd) is True


def test_try_flock_raises_a_failure_that_is_not_contention(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)

    with pytest.raises(OSError) as raised:
        lockwait.try_flock(fd)

    assert raised.value.errno == errno.EBADF


# try_record_lock


def test_try_record_lock_takes_a_free_lock_and_a_child_then_cannot(lock_file, open_fd):
    assert lockwait.try_record_lock(open_fd) is True

    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError as e:\n"
            "    print(e.errno)\nelse:\n    print('taken')",
            str(lock_file),
        ],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=True,
    )
    assert int(probe.stdout) in (errno.EACCES, errno.EAGAIN)


def test_try_record_lock_on_a_descriptor_not_open_for_writing_raises_ebadf(lock_file):
    fd = os.open(lock_file, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as raised:
            lockwait.try_record_lock(fd)
    finally:
        os.close(fd)

    assert raised.value.errno == errno.EBADF


# poll


class Attempts:
    """An attempt that succeeds on call number ``succeed_on`` (never when None), counting calls."""

    def __init__(self, succeed_on=None):
        self.succeed_on = succeed_on
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.calls == self.succeed_on


def test_poll_returns_true_at_once_when_the_first_attempt_succeeds():
    attempt = Attempts(succeed_on=1)

    assert lockwait.poll(attempt, Deadline(0)) is True
    assert attempt.calls == 1


def test_a_deadline_of_zero_tries_exactly_once():
    attempt = Attempts()
    started = time.monotonic()

    assert lockwait.poll(attempt, Deadline(0)) is False
    assert attempt.calls == 1
    assert time.monotonic() - started < 1


def test_an_expired_deadline_still_tries_once():
    deadline = Deadline(0.01)
    time.sleep(0.05)
    attempt = Attempts(succeed_on=1)

    assert lockwait.poll(attempt, deadline) is True


def test_poll_gives_up_at_the_deadline_without_sleeping_past_it():
    attempt = Attempts()
    started = time.monotonic()

    assert lockwait.poll(attempt, Deadline(0.3), longest_pause=5) is False

    waited = time.monotonic() - started
    assert 0.3 <= waited < 2
    assert attempt.calls > 1


def test_poll_without_a_deadline_waits_until_the_attempt_succeeds():
    attempt = Attempts(succeed_on=6)

    assert lockwait.poll(attempt, None, first_pause=0.001) is True
    assert attempt.calls == 6


def test_the_pause_doubles_from_the_first_up_to_the_longest(monkeypatch):
    """``time.sleep`` is recorded instead of slept: the exact sequence of pauses cannot be read
    off a wall clock on a shared machine."""
    pauses = []
    monkeypatch.setattr(time, "sleep", pauses.append)

    assert lockwait.poll(Attempts(succeed_on=7), None, first_pause=0.01, longest_pause=0.05) is True

    assert pauses == [0.01, 0.02, 0.04, 0.05, 0.05, 0.05]


def test_an_exception_from_the_attempt_reaches_the_caller():
    def attempt():
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    with pytest.raises(OSError) as raised:
        lockwait.poll(attempt, Deadline(10))

    assert raised.value.errno == errno.ENOLCK


def test_poll_of_try_flock_gets_the_lock_once_another_process_lets_go(open_fd, held_by_child):
    release = held_by_child("flock")
    answers = []

    def attempt():
        if len(answers) == 2:
            release()
        answers.append(lockwait.try_flock(open_fd))
        return answers[-1]

    assert lockwait.poll(attempt, Deadline(30)) is True
    assert answers == [False, False, True]


def test_the_module_imports_only_fcntl_besides_itself(package_dir):
    # Not typing (about 17 ms), not errno before a try fails: every task of a step takes this lock.
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); before = set(sys.modules)\n"
        "from hpcstack_ops.common import lockwait\n"
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-IS", "-c", code, str(package_dir)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=True,
    )

    assert set(done.stdout.split()) == {
        "__future__",
        "fcntl",
        "hpcstack_ops",
        "hpcstack_ops.common",
        "hpcstack_ops.common.lockwait",
    }
