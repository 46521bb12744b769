"""The live-change record: ``fsutil.tree_digest`` of a 20,000-file install beside ``sha256sum``.

``planner.record_live`` hashes every live tree a rebuild names before EasyBuild starts, and
again before the swap, to prove nothing wrote into it meanwhile; on a big install that is
the tool's own cost in a rebuild. The baseline is what an administrator would type for the
same check: ``find DIR -type f -print0 | xargs -0 sha256sum``. It does less (no directories,
no link targets, no file types), so being at least as fast is the goal.

The tree is made once per run and both sides hash the same one, so both read it from the
page cache after the first round: this measures the walk and the hashing, not the disk.
Its shape is an install's: a seeded mix of headers, Python modules with their bytecode,
man pages and docs in nested directories (sizes from a few hundred bytes to 64 KiB, most
of them a few KiB), a few shared libraries and executables of several MiB, and symbolic
links for the libraries' sonames, some man page aliases and a ``lib64`` alias.
"""

from __future__ import annotations

import os
import random
import subprocess

from benchlib import Case
from hpcstack_ops.staged_rebuild import fsutil

FILES = 20_000
# The tree of ``run.py --once``: every kind of file and link, a few of each.
SMALLEST_FILES = 300
ROUNDS = 5
SEED = 4
# (directory, files per leaf directory, suffix): the bulk of the small files.
_SMALL = (
    ("include/tiny{0}/detail", 40, ".h"),
    ("lib/python3.11/site-packages/tiny{0}/sub{1}", 25, ".py"),
    ("lib/python3.11/site-packages/tiny{0}/sub{1}/__pycache__", 25, ".cpython-311.pyc"),
    ("share/man/man3", 60, ".3"),
    ("share/doc/tiny{0}/html/api", 50, ".html"),
)
# A few big files: shared libraries (with soname links) and executables.
_LIBRARIES = 8
_EXECUTABLES = 4
_BIG_SIZES = (1 << 20, 8 << 20)


def _small_size(rng):
    # Log-uniform from 256 bytes to 64 KiB: most files a few KiB, as in a real install.
    return int(2 ** rng.uniform(8, 16))


class _Bytes:
    """File contents: slices of one random pool at random offsets (one pool is quick to make)."""

    def __init__(self, rng):
        self.rng = rng
        self.pool = rng.randbytes(2 * _BIG_SIZES[1])

    def write(self, path, size):
        start = self.rng.randrange(len(self.pool) - size)
        with open(path, "wb") as handle:
            handle.write(self.pool[start : start + size])


def _write_big(root, rng, contents):
    """The libraries with their soname links, the executables, and the lib64 alias."""
    os.makedirs(os.path.join(root, "lib"), exist_ok=True)
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    for index in range(_LIBRARIES):
        real = f"libtiny{index}.so.1.{index}.0"
        contents.write(os.path.join(root, "lib", real), rng.randint(*_BIG_SIZES))
        os.symlink(real, os.path.join(root, "lib", f"libtiny{index}.so.1"))
        os.symlink(f"libtiny{index}.so.1", os.path.join(root, "lib", f"libtiny{index}.so"))
    for index in range(_EXECUTABLES):
        contents.write(os.path.join(root, "bin", f"tiny-tool{index}"), rng.randint(*_BIG_SIZES))
    os.symlink("lib", os.path.join(root, "lib64"))
    return _LIBRARIES + _EXECUTABLES


def make_tree(root, files=FILES):
    """Write the benchmark's install tree at ``root`` (``files`` regular files); return it."""
    rng = random.Random(SEED)  # noqa: S311 - reproducible sizes and contents, not secrets
    contents = _Bytes(rng)
    written = _write_big(root, rng, contents)
    easybuild = os.path.join(root, "easybuild")
    os.makedirs(easybuild)
    for name in ("Tiny-1.0.eb", "easybuild-Tiny-1.0.log", "Tiny-1.0-easybuild-devel"):
        contents.write(os.path.join(easybuild, name), _small_size(rng))
    written += 3
    package = 0
    while written < files:
        pattern, count, suffix = _SMALL[package % len(_SMALL)]
        group = package // len(_SMALL)  # a package's modules and their bytecode share a directory
        directory = os.path.join(root, pattern.format(group, group % 7))
        os.makedirs(directory, exist_ok=True)
        for index in range(min(count, files - written)):
            name = f"f{package}_{index}{suffix}"
            contents.write(os.path.join(directory, name), _small_size(rng))
            if suffix == ".3" and index % 10 == 0:  # man pages documented under a second name
                os.symlink(name, os.path.join(directory, f"alias{package}_{index}{suffix}"))
        written += count
        package += 1
    return root


def _shared_tree(scratch, files=FILES):
    return make_tree(scratch / "Tiny" / "1.0", files)


def _smallest_tree(scratch):
    return _shared_tree(scratch, SMALLEST_FILES)


def tree_digest(_scratch, tree):
    return lambda: fsutil.tree_digest(tree)


def find_sha256sum(_scratch, tree):
    command = ["sh", "-c", 'find "$1" -type f -print0 | xargs -0 sha256sum', "find-sha256sum", str(tree)]
    # The output is kept, as the record is: a check has to compare it with the next one.
    return lambda: subprocess.run(command, stdout=subprocess.PIPE, check=True)


CASES = [
    Case(
        f"live_check: tree_digest, {FILES} files",
        tree_digest,
        "find | xargs sha256sum",
        find_sha256sum,
        rounds=ROUNDS,
        setup=_shared_tree,
        smallest={"name": f"live_check: tree_digest, {SMALLEST_FILES} files", "setup": _smallest_tree},
    )
]
