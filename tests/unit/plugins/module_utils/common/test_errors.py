"""The expected errors, and the one ``Terminated`` both commands raise for SIGTERM.

SIGTERM is sent for real, to the main thread (``pthread_kill``): a pytest-xdist worker has
other threads, and a process-wide SIGTERM could reach one of those instead.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import deadline, errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import commands


@pytest.fixture(autouse=True)
def sigterm_restored():
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def _sigterm_then_sleep() -> None:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    time.sleep(30)


def test_terminated_is_an_expected_error_with_exit_code_2():
    assert issubclass(errors.Terminated, errors.HpcstackError)
    assert errors.Terminated("x").exit_code == errors.EXIT_ERROR


def test_the_guard_and_the_staged_tool_share_the_one_terminated_class():
    assert deadline.Terminated is errors.Terminated


def test_the_staged_tool_s_sigterm_raises_terminated_saying_the_steps_were_reversed():
    with pytest.raises(errors.Terminated) as raised, commands.sigterm_raises():
        _sigterm_then_sleep()

    assert str(raised.value) == "terminated by signal 15; completed steps were reversed"


def test_the_guard_s_sigterm_raises_the_same_class_with_its_own_words():
    deadline.raise_on_sigterm()

    with pytest.raises(errors.Terminated) as raised:
        _sigterm_then_sleep()

    assert str(raised.value) == "terminated by SIGTERM"
    assert isinstance(raised.value, errors.HpcstackError)
