"""One deadline, and SIGTERM held, raised or dropped: real signals sent to this process.

The guard is a single-threaded process, where SIGTERM from ``kill`` reaches the main
thread. A pytest-xdist worker has other threads, and the kernel would hand a process-wide
SIGTERM to one that does not block it, so the tests here send it to the main thread
(``pthread_kill``); the tests in a child process use ``os.kill`` as Slurm would. An autouse
fixture puts back the handler and the mask a test found, after discarding a SIGTERM that a
failing test left pending.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import (
    SIGTERM,
    Deadline,
    SigtermHeld,
    SigtermScope,
    Terminated,
    hold_sigterm,
    raise_on_sigterm,
    release_sigterm,
    unblock_sigterm,
)


@pytest.fixture(autouse=True)
def sigterm_restored():
    handler = signal.getsignal(SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.signal(SIGTERM, signal.SIG_IGN)  # discards a pending SIGTERM
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(SIGTERM, handler)


@pytest.fixture
def received() -> list:
    """SIGTERM recorded instead of acted on: the list of signals the handler saw."""
    seen = []
    signal.signal(SIGTERM, lambda signum, frame: seen.append(signum))
    return seen


def blocked() -> bool:
    return SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def pending() -> bool:
    return SIGTERM in signal.sigpending()


def send_sigterm() -> None:
    signal.pthread_kill(threading.main_thread().ident, SIGTERM)


def let_handlers_run() -> None:
    # Python runs a signal's handler between bytecodes of the main thread; a call suffices,
    # a short sleep makes sure.
    time.sleep(0.01)


# ------------------------------------------------------------------------ Deadline


def test_deadline_keeps_its_seconds_and_counts_down_from_them():
    deadline = Deadline(30)
    first = deadline.remaining()
    let_handlers_run()
    assert deadline.seconds == 30
    assert 0 < deadline.remaining() < first <= 30
    assert not deadline.expired()


def test_deadline_of_zero_seconds_has_expired():
    deadline = Deadline(0)
    assert deadline.expired()
    assert deadline.remaining() == 0.0


def test_remaining_stops_at_zero_once_the_deadline_passed():
    deadline = Deadline(0.01)
    time.sleep(0.05)
    assert deadline.remaining() == 0.0
    assert deadline.expired()


# ------------------------------------------------------- raise_on_sigterm, holding


def test_sigterm_raises_terminated_where_the_process_is():
    raise_on_sigterm()
    with pytest.raises(Terminated, match="terminated by SIGTERM"):
        sigterm_then_sleep()


def sigterm_then_sleep() -> None:
    send_sigterm()
    time.sleep(30)


def test_sigterm_inside_a_held_block_is_delivered_after_it(received):
    with SigtermHeld():
        assert blocked()
        send_sigterm()
        let_handlers_run()
        assert received == []
        assert pending()
    let_handlers_run()
    assert received == [SIGTERM]
    assert not blocked()


def test_terminated_from_a_held_block_comes_once_the_block_is_done():
    raise_on_sigterm()
    finished = []
    with pytest.raises(Terminated):
        held_block_then_more(finished)
    assert finished == ["block"]


def held_block_then_more(finished: list) -> None:
    with SigtermHeld():
        send_sigterm()
        let_handlers_run()
        finished.append("block")
    let_handlers_run()
    finished.append("after the block")


def test_nested_held_blocks_deliver_when_the_outer_one_ends(received):
    with SigtermHeld():
        with SigtermHeld():
            send_sigterm()
        let_handlers_run()
        assert received == []
        assert blocked()
    let_handlers_run()
    assert received == [SIGTERM]


def test_held_block_that_raises_still_unblocks_sigterm(received):
    with pytest.raises(ValueError), SigtermHeld():
        raise ValueError("boom")
    assert not blocked()


def test_held_block_inside_a_blocked_region_keeps_sigterm_blocked(received):
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGTERM})
    with SigtermHeld():
        send_sigterm()
    let_handlers_run()
    assert blocked()
    assert received == []
    assert pending()


def test_hold_returns_the_mask_that_release_puts_back(received):
    mask = hold_sigterm()
    assert SIGTERM not in mask
    assert blocked()
    send_sigterm()
    release_sigterm(mask)
    let_handlers_run()
    assert not blocked()
    assert received == [SIGTERM]


def test_unblock_sigterm_lets_a_held_one_in(received):
    hold_sigterm()
    send_sigterm()
    unblock_sigterm()
    let_handlers_run()
    assert not blocked()
    assert received == [SIGTERM]


# ---------------------------------------------------------------------- SigtermScope


def test_scope_restores_the_handler_it_found(received):
    handler = signal.getsignal(SIGTERM)
    with SigtermScope():
        raise_on_sigterm()
        assert signal.getsignal(SIGTERM) is not handler
    assert signal.getsignal(SIGTERM) is handler


def test_scope_restores_the_mask_it_found():
    with SigtermScope():
        hold_sigterm()
        assert blocked()
    assert not blocked()


def test_scope_keeps_sigterm_blocked_when_it_was_blocked_before():
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGTERM})
    with SigtermScope():
        unblock_sigterm()
    assert blocked()


def test_scope_drops_a_sigterm_held_inside_it(received):
    with SigtermScope():
        raise_on_sigterm()
        hold_sigterm()
        send_sigterm()
        assert pending()
    let_handlers_run()
    assert not pending()
    assert received == []


def test_scope_drops_a_held_sigterm_even_when_an_exception_leaves_it(received):
    with pytest.raises(ValueError, match="boom"):
        scope_left_by_an_exception()
    let_handlers_run()
    assert (pending(), received, blocked()) == (False, [], False)


def scope_left_by_an_exception() -> None:
    with SigtermScope():
        hold_sigterm()
        send_sigterm()
        raise ValueError("boom")


def test_scope_leaves_a_sigterm_that_was_pending_before_it_to_its_owner(received):
    # The caller blocked SIGTERM and one arrived: it is the caller's, not the scope's to drop.
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGTERM})
    send_sigterm()
    with SigtermScope():
        pass
    assert pending(), "SigtermScope discarded a SIGTERM that was pending before it was entered"


SCOPE_IN_A_CHILD = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.common.deadline import SigtermScope, hold_sigterm, raise_on_sigterm
with SigtermScope():
    raise_on_sigterm()
    hold_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.SIGTERM in signal.sigpending())
"""


def test_held_sigterm_does_not_kill_a_process_whose_scope_ended(package_dir):
    # With the default action back in place, a SIGTERM still pending would end the process.
    done = subprocess.run(
        [sys.executable, "-IS", "-c", SCOPE_IN_A_CHILD, str(package_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "True False\n", "")


HELD_IN_A_CHILD = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.common.deadline import SigtermHeld
received = []
signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
with SigtermHeld():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    print(len(received))
time.sleep(0.1)
print(len(received))
"""


def test_kill_of_the_process_inside_a_held_block_is_delivered_after_it(package_dir):
    done = subprocess.run(
        [sys.executable, "-IS", "-c", HELD_IN_A_CHILD, str(package_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["0", "1"], "")
