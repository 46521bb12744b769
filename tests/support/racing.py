"""A racing swapper: a directory of a tree exchanged with a symbolic link to a victim tree.

A helper process swaps the two names with ``renameat2(RENAME_EXCHANGE)`` in a tight loop
while a test runs the real commands against the tree, again and again. The test keeps a
descriptor of the real directory, so it can look at it (or rebuild what an attempt needs in
it) whatever its name is at the moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# 50 in `make test`; `make stress` sets 1,000.
ATTEMPTS = int(os.environ.get("HPCSTACK_RACE_ATTEMPTS", "50"))

# The swapper: exchange the two names until the stop file appears (glibc's renameat2). While
# the pause file exists it puts the real directory back under its name, says so with the
# paused file, and waits.
_SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b, stop, pause, paused = (os.fsencode(arg) for arg in sys.argv[1:6])
swapped = False
parent = os.getppid()
while not os.path.exists(stop) and os.getppid() == parent:  # an orphan (its test killed) stops too
    if os.path.exists(pause):
        if swapped and libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
            swapped = False
        if not swapped and not os.path.exists(paused):
            open(paused, "w").close()
        time.sleep(0.001)
        continue
    if os.path.exists(paused):
        os.unlink(paused)
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
        swapped = not swapped
"""


class Swapper:
    """``with Swapper(directory, victim, scratch) as real_fd:`` swap ``directory`` and a link
    to ``victim`` (planted beside it as ``.<name>-swap``) until the block ends; then stop
    and put the real directory back under its name. ``with swapper.paused():`` holds the
    real directory at its name for the block (to set up what an attempt needs)."""

    def __init__(self, directory: Path, victim: Path, scratch: Path) -> None:
        self.directory = directory
        self.link = directory.with_name(f".{directory.name}-swap")
        self.victim = victim
        self.stop = scratch / f"stop-{directory.name}"
        self.pause = scratch / f"pause-{directory.name}"
        self.paused_file = scratch / f"paused-{directory.name}"
        self.parked = scratch / f"parked-{directory.name}"

    def __enter__(self) -> int:
        self.link.symlink_to(self.victim)
        self.real_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        files = (self.directory, self.link, self.stop, self.pause, self.paused_file)
        self.process = subprocess.Popen([sys.executable, "-c", _SWAPPER, *map(str, files)])
        return self.real_fd

    def __exit__(self, *exc_info) -> None:
        self.stop.touch()
        self.process.wait(timeout=30)
        if self.directory.is_symlink():  # the swapper stopped with the link at the real name
            os.rename(self.directory, self.parked)
            os.rename(self.link, self.directory)
        else:
            self.link.unlink()
        os.close(self.real_fd)

    @contextlib.contextmanager
    def paused(self):
        self.pause.touch()
        _wait_for(self.paused_file.exists)
        try:
            yield
        finally:
            self.pause.unlink()
            _wait_for(lambda: not self.paused_file.exists())


# The progress line a rebuild with the test builder's backend prints before it builds.
UNSANDBOXED = "eb-staged-rebuild: warning: backend installpath: EasyBuild runs WITHOUT a sandbox"


def _wait_for(condition, seconds: float = 30) -> None:
    give_up = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < give_up, "the swapper did not answer"
        time.sleep(0.005)


def assert_completed_or_refused(done: subprocess.CompletedProcess) -> str:
    """``completed`` (exit 0) or ``refused`` (exit 2 with one ``eb-staged-rebuild:`` line,
    after the backend's progress line when the command was a rebuild)."""
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        return "completed"
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if not line.startswith(UNSANDBOXED)]
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith("eb-staged-rebuild: "), line
    return "refused"


def runs_in(runs_fd: int) -> dict:
    """{run id: journal} of the real ``runs`` directory, read through its descriptor."""
    found = {}
    for name in os.listdir(runs_fd):
        if name.startswith("."):
            continue
        try:
            fd = os.open(f"{name}/journal.json", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=runs_fd)
        except FileNotFoundError:
            continue
        with os.fdopen(fd, "rb") as handle:
            found[name] = json.loads(handle.read())
    return found
