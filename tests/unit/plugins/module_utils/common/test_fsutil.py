"""rename_exchange on the test filesystem: the directory swap the publish step builds on."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import tempfile

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import fsutil


def _tree(path, payload):
    path.mkdir()
    (path / "PAYLOAD").write_text(payload)
    return path.stat().st_ino


def test_rename_exchange_swaps_two_directories(tmp_path):
    live_ino = _tree(tmp_path / "live", "old")
    stage_ino = _tree(tmp_path / "stage", "new")

    fsutil.rename_exchange(tmp_path / "stage", tmp_path / "live")

    assert (tmp_path / "live").stat().st_ino == stage_ino
    assert (tmp_path / "live" / "PAYLOAD").read_text() == "new"
    assert (tmp_path / "stage").stat().st_ino == live_ino
    assert (tmp_path / "stage" / "PAYLOAD").read_text() == "old"


def test_rename_exchange_twice_restores_both_names(tmp_path):
    live_ino = _tree(tmp_path / "live", "old")
    _tree(tmp_path / "stage", "new")

    fsutil.rename_exchange(tmp_path / "stage", tmp_path / "live")
    fsutil.rename_exchange(tmp_path / "stage", tmp_path / "live")

    assert (tmp_path / "live").stat().st_ino == live_ino
    assert (tmp_path / "live" / "PAYLOAD").read_text() == "old"


def test_rename_exchange_with_a_missing_name_raises_enoent_and_moves_nothing(tmp_path):
    live_ino = _tree(tmp_path / "live", "old")

    with pytest.raises(OSError) as raised:
        fsutil.rename_exchange(tmp_path / "missing", tmp_path / "live")

    assert raised.value.errno == errno.ENOENT
    assert raised.value.filename == tmp_path / "missing"
    assert raised.value.filename2 == tmp_path / "live"
    assert (tmp_path / "live").stat().st_ino == live_ino
    assert not (tmp_path / "missing").exists()


def test_rename_exchange_across_filesystems_raises_exdev(tmp_path):
    # /dev/shm is a tmpfs on every Linux machine; pytest's tmp_path lives elsewhere.
    assert os.stat("/dev/shm").st_dev != tmp_path.stat().st_dev
    _tree(tmp_path / "live", "here")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other_fs:
        with pytest.raises(OSError) as raised:
            fsutil.rename_exchange(other_fs, tmp_path / "live")
        assert os.path.isdir(other_fs)
    assert raised.value.errno == errno.EXDEV
    assert (tmp_path / "live" / "PAYLOAD").read_text() == "here"


def test_the_raw_syscall_path_swaps_like_the_libc_wrapper(tmp_path):
    _tree(tmp_path / "live", "old")
    _tree(tmp_path / "stage", "new")
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = fsutil._syscall_renameat2(libc, fsutil._SYS_RENAMEAT2[platform.machine()])

    result = renameat2(
        fsutil._AT_FDCWD,
        os.fsencode(tmp_path / "stage"),
        fsutil._AT_FDCWD,
        os.fsencode(tmp_path / "live"),
        fsutil.RENAME_EXCHANGE,
    )

    assert result == 0
    assert (tmp_path / "live" / "PAYLOAD").read_text() == "new"
