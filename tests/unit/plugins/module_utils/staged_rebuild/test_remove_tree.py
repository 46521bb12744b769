"""``fsutil.remove_tree``: a stage or generation goes, sealed or not; nothing outside it does.

A sealed install (EasyBuild's ``--read-only-installdir``) has 0444 files in 0555 directories.
Root ignores those bits, so the build user's cases run ``remove_tree`` in a child under
``setpriv`` as the unprivileged test user, on a tree that user owns.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil
from tests.support.staged import snapshot

AS_USER = r"""
import sys
from hpcstack_ops.staged_rebuild import fsutil
fsutil.remove_tree(sys.argv[1])
"""


@pytest.fixture
def user_dir(unprivileged_user):
    path = Path(tempfile.mkdtemp(prefix="hpcstack-remove-"))
    os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    yield path
    shutil.rmtree(path)


def _sealed_tree(root):
    """An install as --read-only-installdir leaves it: read-only files in read-only directories."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "pkgconfig").mkdir(parents=True)
    (root / "bin" / "tiny").write_text("#!/bin/sh\n")
    (root / "lib" / "libtiny.so.1").write_bytes(b"\x7fELF\x00")
    (root / "lib" / "libtiny.so").symlink_to("libtiny.so.1")
    (root / "lib" / "pkgconfig" / "tiny.pc").write_text("prefix=/apps\n")
    (root / "easybuild").mkdir()
    (root / "easybuild" / "Tiny-1.0.eb").write_text("name = 'Tiny'\n")
    _seal(root)
    return root


def _seal(root):
    for directory, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink():
                path.chmod(0o444)
        Path(directory).chmod(0o555)
    return root


def _chown_tree(root, user):
    for directory, dirs, files in os.walk(root):
        os.chown(directory, user.uid, user.gid)
        for name in dirs + files:
            os.chown(os.path.join(directory, name), user.uid, user.gid, follow_symlinks=False)


def _outside(base):
    """A directory and a file outside the tree, which links in the tree point at."""
    outside = base / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "DATA").write_text("keep me\n")
    (outside / "FILE").write_text("keep me too\n")
    return outside


def _link_out(tree, outside):
    (tree / "to-dir").symlink_to(outside / "keep", target_is_directory=True)
    (tree / "to-file").symlink_to(outside / "FILE")
    (tree / "lib" / "to-dir").symlink_to(outside, target_is_directory=True)


def _remove_as(user, package_dir, path):
    env = dict(user.env(), PYTHONPATH=str(package_dir))
    return user.run([sys.executable, "-c", AS_USER, str(path)], env=env)


# as root


def test_remove_tree_removes_a_plain_tree(tmp_path):
    tree = tmp_path / "stage"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")

    fsutil.remove_tree(str(tree))

    assert not os.path.lexists(tree)
    assert list(tmp_path.iterdir()) == []


def test_remove_tree_removes_a_sealed_tree_as_root(tmp_path):
    tree = _sealed_tree(tmp_path / "stage")

    fsutil.remove_tree(str(tree))

    assert not os.path.lexists(tree)


def test_remove_tree_never_follows_a_symlink_out_of_the_tree(tmp_path):
    outside = _outside(tmp_path)
    tree = tmp_path / "stage"
    (tree / "lib").mkdir(parents=True)
    _link_out(tree, outside)
    _seal(tree)
    before = snapshot(outside)

    fsutil.remove_tree(str(tree))

    assert not os.path.lexists(tree)
    assert snapshot(outside) == before


def test_remove_tree_of_a_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        fsutil.remove_tree(str(tmp_path / "missing"))


def test_remove_tree_of_a_missing_path_leaves_a_sealed_parent_sealed(tmp_path):
    parent = tmp_path / "Tiny"
    parent.mkdir()
    parent.chmod(0o555)

    with pytest.raises(FileNotFoundError):
        fsutil.remove_tree(str(parent / ".1.0.run1"))

    assert stat.S_IMODE(parent.stat().st_mode) == 0o555


def test_remove_tree_refuses_a_symlink_in_place_of_the_tree(tmp_path):
    # Not removed silently: the caller would go on as if the tree were gone.
    outside = _outside(tmp_path)
    parent = tmp_path / "Tiny"
    parent.mkdir()
    (parent / ".1.0.run1").symlink_to(outside / "keep", target_is_directory=True)
    parent.chmod(0o555)
    before = snapshot(outside)

    with pytest.raises(errors.UsageError, match="symbolic link"):
        fsutil.remove_tree(str(parent / ".1.0.run1"))

    assert snapshot(outside) == before
    assert stat.S_IMODE(parent.stat().st_mode) == 0o555


# as the build user


def test_remove_tree_removes_a_sealed_tree_as_the_build_user(
    user_dir,
    unprivileged_user,
    package_dir,
):
    tree = user_dir / "stage"
    _sealed_tree(tree)
    _chown_tree(user_dir, unprivileged_user)

    done = _remove_as(unprivileged_user, package_dir, tree)

    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(tree)


def test_the_build_user_removing_a_sealed_tree_never_follows_a_symlink_out_of_it(
    user_dir,
    unprivileged_user,
    package_dir,
):
    outside = _outside(user_dir)
    tree = user_dir / "stage"
    (tree / "lib").mkdir(parents=True)
    _link_out(tree, outside)
    _chown_tree(user_dir, unprivileged_user)
    _seal(tree)
    _seal(outside)  # sealed too: a followed link would have to open it to delete anything
    before = snapshot(outside)

    done = _remove_as(unprivileged_user, package_dir, tree)

    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(tree)
    assert snapshot(outside) == before


def test_the_build_user_cannot_remove_a_tree_it_does_not_own(
    user_dir,
    unprivileged_user,
    package_dir,
):
    tree = user_dir / "stage"
    _sealed_tree(tree)  # root's
    before = snapshot(tree)

    done = _remove_as(unprivileged_user, package_dir, tree)

    assert done.returncode != 0
    assert "PermissionError" in done.stderr
    assert snapshot(tree) == before
