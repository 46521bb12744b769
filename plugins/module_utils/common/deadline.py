# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One deadline for an operation, and SIGTERM turned into an exception it can clean up after.

Kept apart from ``proc`` and free of ``signal`` (whose enums cost several milliseconds to
import): the guard's cached-decision path runs in every task of a step and imports this.
``Terminated`` is ``errors.Terminated``, the one class both commands raise for SIGTERM.
"""

from __future__ import annotations

import _signal
import time

from .errors import Terminated

SIGTERM = _signal.SIGTERM


class DeadlineExceeded(Exception):
    """The deadline passed; whatever ran on its time was stopped."""


class Deadline:
    """One point in time that every step of an operation must finish before."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


def _raise_terminated(signum, frame) -> None:
    raise Terminated("terminated by SIGTERM")


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in the main thread."""
    _signal.signal(SIGTERM, _raise_terminated)


def hold_sigterm():
    """Block SIGTERM; returns the mask to give ``release_sigterm`` (a pending one then arrives)."""
    return _signal.pthread_sigmask(_signal.SIG_BLOCK, {SIGTERM})


def release_sigterm(mask) -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)


def unblock_sigterm() -> None:
    """For a child between fork and exec: the blocked mask would survive exec."""
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {SIGTERM})


class SigtermHeld:
    """``with SigtermHeld():`` a SIGTERM arriving inside waits until the block is done.

    For work that must not be cut in half: removing a work directory, publishing a result.
    """

    def __enter__(self) -> SigtermHeld:
        self._mask = hold_sigterm()
        return self

    def __exit__(self, *exc_info) -> None:
        release_sigterm(self._mask)


class SigtermScope:
    """Restores SIGTERM's handler and mask on exit, dropping a SIGTERM held meanwhile.

    A command run in-process (by a test, or by Ansible) leaves the process as it found it,
    and a held SIGTERM does not turn a finished run into a death by signal.
    """

    def __enter__(self) -> SigtermScope:
        self._handler = _signal.getsignal(SIGTERM)
        self._mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, ())
        # A SIGTERM already pending (the caller had it blocked) is the caller's, not ours.
        self._was_pending = SIGTERM in _signal.sigpending()
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._was_pending:
            # Ignoring a signal discards it if pending; then the old mask and handler return.
            _signal.signal(SIGTERM, _signal.SIG_IGN)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, self._mask)
        _signal.signal(SIGTERM, self._handler)
