"""tools/idle.py, which runs the static gates beside the cluster gate on idle time: the command
runs in a session of its own, at the lowest priority of its autogroup and of itself, its exit
status is the caller's, and a signal to the caller reaches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import checkout

IDLE = [sys.executable, str(checkout.REPO / "tools" / "idle.py"), "--"]
# What the command reports of itself: its session, its autogroup's line, its niceness.
REPORT = (
    "import os; print(os.getsid(0)); print(open('/proc/self/autogroup').read().strip()); print(os.nice(0))"
)


def test_the_command_runs_in_a_session_of_its_own_at_the_lowest_priority_and_its_status_is_returned():
    done = subprocess.run(
        [*IDLE, sys.executable, "-c", REPORT + "; raise SystemExit(3)"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 3, done.stderr
    session, autogroup, niceness = done.stdout.splitlines()
    assert int(session) != os.getsid(0)
    assert autogroup.endswith(" nice 19")
    assert niceness == "19"


def test_a_signal_to_the_caller_ends_the_command_and_its_status_says_which():
    ready = "import signal, sys, time; print('ready', flush=True); time.sleep(60)"
    with subprocess.Popen([*IDLE, sys.executable, "-c", ready], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout.readline() == "ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)

    assert status == 128 + signal.SIGTERM
    assert time.monotonic() - started < 30


def test_no_command_is_refused_in_one_line():
    done = subprocess.run([*IDLE], capture_output=True, text=True, timeout=30, check=False)

    assert (done.returncode, done.stderr) == (2, "idle: usage: idle.py -- COMMAND [ARG...]\n")
