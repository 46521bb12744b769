"""Which directories the guard trusts, and what the restore helper's work directory and
report reading refuse. Real directories, modes, owners, FIFOs and links throughout."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache, restore, settings


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
