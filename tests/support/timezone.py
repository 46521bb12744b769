"""The process's local time zone, set for a test: text output shows times in local time."""

from __future__ import annotations

import contextlib
import os
import time


@contextlib.contextmanager
def local_zone(name: str):
    """``TZ=name`` for the process (and the C library's idea of local time) within the block."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()
