"""Failures this machine cannot produce, injected at one call for the tests that say why.

Each helper patches one function of ``os`` through pytest's ``monkeypatch`` (undone after
the test) and lets every other call through to the real one.
"""

from __future__ import annotations

import os
import stat


def directory_fsync_fails_with(monkeypatch, err: int) -> None:
    """``os.fsync`` of a directory fails with ``err``; files are flushed as usual."""
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(err, os.strerror(err))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
