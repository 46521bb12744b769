"""Which directories the guard trusts, and what the restore helper's work directory and
report reading refuse. Real directories, modes, owners, FIFOs and links throughout."""

from __future__ import annotations

import os
import re
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache, restore, settings
from ansible_collections.hpcstack.ops.plugins.module_utils.common import proc
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline, DeadlineExceeded


def directory(path, mode: int, owner=None):
    path.mkdir()
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    return path


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1777, 0o1770, 0o1733])
def test_a_directory_of_ours_is_trusted_unless_others_can_write_without_the_sticky_bit(tmp_path, mode):
    path = directory(tmp_path / "d", mode)
    assert settings.distrust(str(path)) is None
    assert settings.trusted_dir(str(path))


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o733, 0o702, 0o720])
def test_a_directory_others_can_write_without_the_sticky_bit_is_not_trusted(tmp_path, mode):
    path = directory(tmp_path / "d", mode)
    assert settings.distrust(str(path)) == (
        f"{path} is writable by group or others without the sticky bit (mode {mode:04o})"
    )


def test_a_directory_of_another_user_is_not_trusted(tmp_path, unprivileged_user):
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    path = directory(tmp_path / "d", 0o700, owner=unprivileged_user)
    assert settings.distrust(str(path)) == f"{path} belongs to uid {unprivileged_user.uid}"


def test_a_symlink_to_a_trusted_directory_is_not_trusted(tmp_path):
    target = directory(tmp_path / "d", 0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert settings.distrust(str(link)) == f"{link} is a symlink"


def test_a_file_and_a_missing_path_are_not_trusted(tmp_path):
    (tmp_path / "file").write_text("")
    assert settings.distrust(str(tmp_path / "file")) == f"{tmp_path / 'file'} is not a directory"
    assert "cannot be looked at" in settings.distrust(str(tmp_path / "missing"))


def test_an_untrusted_tmpdir_gives_way_to_tmp(tmp_path):
    open_dir = directory(tmp_path / "open", 0o777)
    assert settings.scratch_dir({"TMPDIR": str(open_dir)}) == "/tmp"
    assert settings.scratch_dir({"TMPDIR": str(tmp_path)}) == str(tmp_path)
    assert settings.scratch_dir({"TMPDIR": "relative"}) == "/tmp"


def test_no_trusted_directory_means_no_step_cache_and_no_work_directory(tmp_path, monkeypatch):
    """The machine's /tmp cannot be made untrusted under the other tests' feet, so the
    fallback's name is pointed at a real directory of mode 0777 without the sticky bit."""
    open_tmp = directory(tmp_path / "tmp", 0o777)
    open_tmpdir = directory(tmp_path / "tmpdir", 0o777)
    monkeypatch.setattr(settings, "FALLBACK_SCRATCH", str(open_tmp))
    env = {"TMPDIR": str(open_tmpdir), "SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1"}

    assert settings.scratch_dir(env) is None
    assert cache.path_for(env, "prolog") is None
    with pytest.raises(restore.RestoreFailed) as raised:
        restore._make_work_dir(env)

    message = str(raised.value)
    assert message.startswith("no place for the restore helper's work directory: ")
    assert f"{open_tmpdir} is writable by group or others without the sticky bit" in message
    assert f"{open_tmp} is writable by group or others without the sticky bit" in message
    assert message.endswith(restore._WORK_DIR_REMEDY)
    assert os.listdir(open_tmp) == os.listdir(open_tmpdir) == []


def test_the_work_directory_goes_to_tmp_when_tmpdir_is_not_trusted(tmp_path):
    open_tmpdir = directory(tmp_path / "tmpdir", 0o777)
    work = restore._make_work_dir({"TMPDIR": str(open_tmpdir)})
    try:
        assert os.path.dirname(work) == "/tmp"
        assert os.listdir(open_tmpdir) == []
    finally:
        os.rmdir(work)


# ---------------------------------------------------------------- the helper's report

BEFORE = b"PATH=/usr/bin\0EESSI_SOFTWARE_SUBDIR=x86_64/intel/haswell\0"
AFTER = b"PATH=/usr/bin\0EESSI_SOFTWARE_SUBDIR=x86_64/amd/zen3\0"
FORGED = b"PATH=/evil\0LD_PRELOAD=/tmp/evil.so\0EESSI_SOFTWARE_SUBDIR=x86_64/amd/zen3\0"
REPORT_NAMES = ("failed-module", "complete", "before.env", "after.env")
OK = proc.ChildResult(0, b"", b"")


@pytest.fixture
def work(tmp_path):
    """A work directory as the helper leaves it after a good reload, and its descriptor."""
    path = tmp_path / "work"
    path.mkdir(mode=0o700)
    (path / "before.env").write_bytes(BEFORE)
    (path / "after.env").write_bytes(AFTER)
    (path / "complete").write_bytes(b"")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)


def replace(path, how: str, tmp_path, unprivileged_user) -> None:
    """Put at ``path`` what the helper did not write there."""
    if path.exists():
        path.unlink()
    if how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "symlink":
        target = tmp_path / "forged"
        target.write_bytes(FORGED)
        path.symlink_to(target)
    elif how == "hard-link":
        target = tmp_path / "forged"
        target.write_bytes(FORGED)
        os.link(target, path)
    elif how == "other-owner":
        assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
        path.write_bytes(FORGED)
        os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    elif how == "directory":
        path.mkdir()


def test_a_good_report_is_read(work):
    _path, fd = work
    report = restore._read_report(fd, OK, Deadline(5))
    assert report.after["EESSI_SOFTWARE_SUBDIR"] == "x86_64/amd/zen3"
    assert report.before["EESSI_SOFTWARE_SUBDIR"] == "x86_64/intel/haswell"


@pytest.mark.parametrize("name", REPORT_NAMES)
@pytest.mark.parametrize("how", ["fifo", "symlink", "hard-link", "other-owner", "directory"])
def test_a_report_file_that_is_not_the_helpers_is_refused_at_once(
    work, tmp_path, unprivileged_user, name, how
):
    path, fd = work
    replace(path / name, how, tmp_path, unprivileged_user)
    forged_before = (tmp_path / "forged").read_bytes() if (tmp_path / "forged").exists() else None

    started = time.monotonic()
    with pytest.raises(restore.RestoreFailed, match=re.escape(f"the restore helper's report {name} ")):
        restore._read_report(fd, OK, Deadline(5))

    assert time.monotonic() - started < 1  # a FIFO is opened without waiting for a writer
    if forged_before is not None:
        assert (tmp_path / "forged").read_bytes() == forged_before


def test_a_missing_env_report_is_refused(work):
    path, fd = work
    (path / "after.env").unlink()
    with pytest.raises(restore.RestoreFailed, match=r"left no report after\.env"):
        restore._read_report(fd, OK, Deadline(5))


def test_the_report_is_not_read_after_the_deadline(work):
    _path, fd = work
    with pytest.raises(DeadlineExceeded, match="not read after"):
        restore._read_report(fd, OK, Deadline(0))


def test_a_work_directory_swapped_after_it_was_opened_is_not_read(tmp_path):
    # The attack of issue 18: the directory renamed away and another planted at its name.
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    fd = restore._open_work_dir(str(work))
    try:
        work.rename(tmp_path / "moved")
        work.mkdir(mode=0o700)
        (work / "before.env").write_bytes(BEFORE)
        (work / "after.env").write_bytes(FORGED)
        (work / "complete").write_bytes(b"")
        with pytest.raises(restore.RestoreFailed, match="exited 0"):
            restore._read_report(fd, OK, Deadline(5))
    finally:
        os.close(fd)


def test_a_work_directory_that_is_a_symlink_or_open_to_others_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(restore.RestoreFailed, match="cannot open"):
        restore._open_work_dir(str(tmp_path / "link"))
    os.chmod(real, 0o755)  # noqa: S103 (a work directory others can read)
    with pytest.raises(restore.RestoreFailed, match="mode 0700"):
        restore._open_work_dir(str(real))
