"""A real FUSE mount (bindfs): a filesystem on which RENAME_EXCHANGE fails with EINVAL."""

from __future__ import annotations

import shutil
import subprocess

import pytest


@pytest.fixture
def fuse_dir(tmp_path):
    """A directory served through bindfs; its contents live in a sibling ``backing`` dir."""
    if shutil.which("bindfs") is None:
        pytest.fail("bindfs is not installed; tools/bootstrap.sh test installs it")
    backing, mountpoint = tmp_path / "backing", tmp_path / "fuse"
    backing.mkdir()
    mountpoint.mkdir()
    done = subprocess.run(
        ["bindfs", str(backing), str(mountpoint)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"bindfs mount failed: {done.stderr.strip()}")
    yield mountpoint
    # bindfs pulls in either fuse (fusermount) or fuse3 (fusermount3).
    fusermount = shutil.which("fusermount") or shutil.which("fusermount3")
    unmount = [fusermount, "-u"] if fusermount else ["umount"]
    subprocess.run([*unmount, str(mountpoint)], capture_output=True, check=True, timeout=30)
