"""The directory swap: one RENAME_EXCHANGE against the three-rename fallback."""

from __future__ import annotations

import os

from benchlib import Case
from hpcstack_ops.staged_rebuild import fsutil


def _pair(scratch):
    live, stage = scratch / "live", scratch / "stage"
    for path in (live, stage):
        path.mkdir()
        (path / "PAYLOAD").write_text(path.name)
    return live, stage


def exchange(scratch):
    live, stage = _pair(scratch)
    return lambda: fsutil.rename_exchange(stage, live)


def three_renames(scratch):
    live, stage = _pair(scratch)
    hold = scratch / "stage.fallback-old"

    def swap():
        os.rename(live, hold)
        os.rename(stage, live)
        os.rename(hold, stage)

    return swap


CASES = [Case("swap: rename_exchange", exchange, "three renames (fallback)", three_renames)]
