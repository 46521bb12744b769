"""Directory chains thousands of levels deep, and a scratch directory that can hold them.

A chain that deep has paths longer than the kernel resolves (PATH_MAX, 4,096 bytes) past
about 2,000 levels, so it is made through directory descriptors; and Python's own
``shutil.rmtree`` recurses once per level before 3.12, so a chain left behind by a failing
test is removed with GNU ``rm -rf``, which walks without recursion.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import pytest


def nest(
    directory: Path,
    levels: int,
    name: str = "d",
    *,
    files: bool = True,
    beside: Sequence[str] = (),
    uid: int = -1,
    gid: int = -1,
) -> None:
    """``directory/name/name/...``, ``levels`` deep, with a file ``f`` in each level unless
    ``files`` is false, and an empty directory of each name in ``beside``; owned by
    ``uid``:``gid`` when given (``-1``: as made)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _level in range(levels):
            os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
            made = []
            if files:
                made.append(os.open("f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
            for other in beside:
                os.mkdir(other, 0o755, dir_fd=fd)
                made.append(os.open(other, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd))
            for made_fd in [fd, *made]:
                if uid != -1 or gid != -1:
                    os.fchown(made_fd, uid, gid)
            for made_fd in made:
                os.close(made_fd)
    finally:
        os.close(fd)


def depth_of(directory: Path, name: str = "d") -> int:
    """How many levels of ``name`` are nested in ``directory`` (read through descriptors)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    levels = 0
    try:
        while True:
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return levels
            os.close(fd)
            fd = child
            levels += 1
    finally:
        os.close(fd)


def remove_whatever_is_left(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


@pytest.fixture
def deep_scratch():
    """A fresh directory under /tmp (every user may search it), removed with ``rm -rf``."""
    path = Path(tempfile.mkdtemp(prefix="hpcstack-deep-"))
    path.chmod(0o755)
    yield path
    remove_whatever_is_left(path)
