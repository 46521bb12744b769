"""Real FUSE mounts (bindfs): a filesystem on which RENAME_EXCHANGE fails with EINVAL, and
two views of one directory whose locks do not reach each other unless forwarded."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def bindfs_mount(backing: Path, mountpoint: Path, *options: str):
    """``backing`` served through bindfs at ``mountpoint`` (created) until the block ends."""
    if shutil.which("bindfs") is None:
        pytest.fail("bindfs is not installed; tools/bootstrap.sh test installs it")
    mountpoint.mkdir()
    done = subprocess.run(
        ["bindfs", *options, str(backing), str(mountpoint)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"bindfs mount failed: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        # bindfs pulls in either fuse (fusermount) or fuse3 (fusermount3).
        fusermount = shutil.which("fusermount") or shutil.which("fusermount3")
        unmount = [fusermount, "-u"] if fusermount else ["umount"]
        subprocess.run([*unmount, str(mountpoint)], capture_output=True, check=True, timeout=30)


@pytest.fixture
def fuse_dir(tmp_path):
    """A directory served through bindfs; its contents live in a sibling ``backing`` dir."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with bindfs_mount(backing, tmp_path / "fuse") as mountpoint:
        yield mountpoint
