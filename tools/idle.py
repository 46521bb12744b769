"""Run a command on the time of the cores that everything else leaves idle.

    .venv/bin/python tools/idle.py -- COMMAND [ARG...]

``nice`` alone does not do it where the kernel groups tasks by session (autogroup, on by
default in Debian's kernels): a niced command competes with the tasks of its own session
only, and its session as a whole gets as much of a core as any other session, such as a
Slurm job's or an SSH login's (measured: a busy loop at nice 19 beside two busy loops in
sessions of their own got 66% of a core, as they did). So the command runs in a session of
its own, whose autogroup has the lowest weight (nice 19), and niced itself, where autogroups
are off: it then got 2.5%.

This process stays in the caller's session and waits, so that Ctrl-C, or a signal to the
caller's process group, still reaches the command (forwarded to its session's process group).
The exit status is the command's (128 + N when a signal N ended it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

LOWEST = 19
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _lowest_priority() -> None:
    """In the child, before the command starts: the autogroup of its new session, then itself."""
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(LOWEST))
    except OSError:
        pass  # no autogroups (CONFIG_SCHED_AUTOGROUP off, or disabled): nice alone works then
    os.nice(LOWEST)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("idle: usage: idle.py -- COMMAND [ARG...]\n")
        return 2
    # This program has no threads: a preexec_fn is safe here.
    child = subprocess.Popen(argv, start_new_session=True, preexec_fn=_lowest_priority)  # noqa: PLW1509

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    status = child.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
