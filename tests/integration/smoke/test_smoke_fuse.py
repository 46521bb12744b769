"""FUSE refuses RENAME_EXCHANGE with EINVAL: the trigger of the three-rename fallback."""

from __future__ import annotations

import errno

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil


def test_rename_exchange_on_fuse_fails_with_einval_and_moves_nothing(fuse_dir):
    (fuse_dir / "live").mkdir()
    (fuse_dir / "live" / "PAYLOAD").write_text("old")
    (fuse_dir / "stage").mkdir()
    (fuse_dir / "stage" / "PAYLOAD").write_text("new")

    with pytest.raises(OSError) as raised:
        fsutil.rename_exchange(fuse_dir / "stage", fuse_dir / "live")

    assert raised.value.errno == errno.EINVAL
    assert (fuse_dir / "live" / "PAYLOAD").read_text() == "old"
    assert (fuse_dir / "stage" / "PAYLOAD").read_text() == "new"


def test_plain_rename_still_works_on_fuse(fuse_dir):
    # The fallback is built from ordinary renames, so they must work where exchange does not.
    (fuse_dir / "live").mkdir()
    (fuse_dir / "live").rename(fuse_dir / "held")
    assert (fuse_dir / "held").is_dir()
    assert not (fuse_dir / "live").exists()
