"""``fsutil.remove_tree``: a stage or generation goes, sealed or not; nothing outside it does.

A sealed install (EasyBuild's ``--read-only-installdir``) has 0444 files in 0555 directories.
Root ignores those bits, so the build user's cases run ``remove_tree`` in a child under
``setpriv`` as the unprivileged test user, on a tree that user owns.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import dirfd, errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil
from tests.support.deep import nest
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


# deep trees: the walk keeps its own stack, within a few descriptors

# A child that removes a tree under a low RLIMIT_NOFILE: argv is (limit, path, root).
UNDER_LIMIT = r"""
import resource, sys
from hpcstack_ops.staged_rebuild import fsutil
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
fsutil.remove_tree(sys.argv[2], root=sys.argv[3])
"""


def test_remove_tree_removes_a_chain_deeper_than_python_recurses(deep_scratch):
    tree = deep_scratch / "software" / "Tiny" / ".1.0.run1"
    tree.mkdir(parents=True)
    nest(tree, 1_500)
    tree.chmod(0o555)  # sealed, as --read-only-installdir leaves an install

    fsutil.remove_tree(str(tree), root=str(deep_scratch / "software"))

    assert os.listdir(deep_scratch / "software" / "Tiny") == []


def test_remove_tree_of_a_deep_chain_stays_within_a_low_descriptor_limit(deep_scratch, package_dir):
    tree = deep_scratch / "software" / "Tiny" / ".1.0.run1"
    tree.mkdir(parents=True)
    nest(tree, 400)
    env = dict(os.environ, PYTHONPATH=str(package_dir))

    done = subprocess.run(
        [sys.executable, "-c", UNDER_LIMIT, "32", str(tree), str(deep_scratch / "software")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert os.listdir(deep_scratch / "software" / "Tiny") == []


def test_the_descriptor_budget_is_a_sixteenth_of_the_limit_between_2_and_64(monkeypatch):
    limits = {1024: 64, 65536: 64, 512: 32, 32: 2, 8: 2}
    found = {}
    for soft, _budget in limits.items():
        monkeypatch.setattr(dirfd.resource, "getrlimit", lambda which, soft=soft: (soft, soft))
        found[soft] = dirfd._descriptor_budget()
    monkeypatch.setattr(dirfd.resource, "getrlimit", lambda which: (dirfd.resource.RLIM_INFINITY,) * 2)

    assert found == limits
    assert dirfd._descriptor_budget() == 64


class _MoveDuringRemoval:
    """Calls ``move(levels)`` once, when the removal enters the directory ``depth`` levels
    below the top: a rename another user makes at that moment. The moment cannot be timed
    from outside the process; the racing attacker of another uid in test_staged_races does
    it for real, at random moments."""

    def __init__(self, monkeypatch, depth, move):
        real_enter = dirfd._Removal._enter
        self.moved = False

        def enter(removal, parent_fd, name, where):
            real_enter(removal, parent_fd, name, where)
            if len(removal.levels) == depth + 1 and not self.moved:
                self.moved = True
                move(removal)

        monkeypatch.setattr(dirfd._Removal, "_enter", enter)
        # Two levels held below the top: the levels above the deepest two are let go.
        monkeypatch.setattr(dirfd, "_descriptor_budget", lambda: 2)


def _chain_path(top, depth):
    """The path of the level ``depth`` below ``top`` (short enough to name)."""
    return top.joinpath(*["d"] * depth)


def _outside(base):
    """A world-writable sticky directory beside the tree with root's files: what a '..'
    climbed out of a moved directory would reach."""
    outside = base / "outside"
    (outside / "victim-dir").mkdir(parents=True)
    (outside / "victim-dir" / "keep").write_text("keep\n")
    (outside / "victim-file").write_text("keep too\n")
    outside.chmod(0o1777)
    return outside


def test_a_directory_moved_out_of_the_tree_during_removal_is_emptied_and_nothing_beside_it_is(
    deep_scratch, monkeypatch
):
    tree = deep_scratch / "software" / "Tiny" / ".1.0.run1"
    tree.mkdir(parents=True)
    nest(tree, 30)
    outside = _outside(deep_scratch)
    before = snapshot(outside)
    moved = outside / "moved"
    # Level 5 goes, with what is below it, into the sticky directory while the walk is at 20.
    _MoveDuringRemoval(monkeypatch, 20, lambda removal: os.rename(_chain_path(tree, 5), moved))

    fsutil.remove_tree(str(tree), root=str(deep_scratch / "software"))

    assert not os.path.lexists(tree)
    assert os.listdir(moved) == []  # emptied: it was the tree's when the walk reached it
    moved.rmdir()
    assert snapshot(outside) == before


def test_a_level_replaced_during_removal_stops_it_in_one_line_and_nothing_else_goes(
    deep_scratch, monkeypatch
):
    tree = deep_scratch / "software" / "Tiny" / ".1.0.run1"
    tree.mkdir(parents=True)
    nest(tree, 30)
    outside = _outside(deep_scratch)

    def replace(removal):
        # Level 8 moves out, so its '..' is elsewhere and the walk goes down again by name
        # from the top; and level 3's name now holds another directory with a file in it.
        os.rename(_chain_path(tree, 8), outside / "moved")
        os.rename(_chain_path(tree, 3), deep_scratch / "level-3")
        _chain_path(tree, 3).mkdir()
        (_chain_path(tree, 3) / "keep").write_text("another directory\n")

    _MoveDuringRemoval(monkeypatch, 20, replace)
    before = snapshot(outside / "victim-dir")

    with pytest.raises(errors.UsageError) as raised:
        fsutil.remove_tree(str(tree), root=str(deep_scratch / "software"))

    assert str(raised.value) == (
        f"{_chain_path(tree, 3)} was replaced while its tree was being removed; the removal stopped"
    )
    assert (_chain_path(tree, 3) / "keep").read_text() == "another directory\n"
    assert snapshot(outside / "victim-dir") == before
    assert (outside / "victim-file").read_text() == "keep too\n"
