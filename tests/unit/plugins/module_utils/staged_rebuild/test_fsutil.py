"""rename_exchange on the test filesystem: the directory swap the publish step builds on."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import platform
import signal
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import dirfd, errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil
from tests.support.injected import directory_fsync_fails_with
from tests.support.mountns import in_private_mounts


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
    renameat2 = dirfd._syscall_renameat2(libc, dirfd._SYS_RENAMEAT2[platform.machine()])

    result = renameat2(
        dirfd._AT_FDCWD,
        os.fsencode(tmp_path / "stage"),
        dirfd._AT_FDCWD,
        os.fsencode(tmp_path / "live"),
        fsutil.RENAME_EXCHANGE,
    )

    assert result == 0
    assert (tmp_path / "live" / "PAYLOAD").read_text() == "new"


# fsync_dir


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_fsync_dir_flushes_a_directory_and_closes_its_descriptor(tmp_path):
    (tmp_path / "entry").write_text("x")
    before = _open_fds()

    assert fsutil.fsync_dir(tmp_path) is None

    assert _open_fds() == before
    assert (tmp_path / "entry").read_text() == "x"


def test_fsync_dir_of_a_regular_file_raises_enotdir(tmp_path):
    (tmp_path / "file").write_text("x")
    before = _open_fds()

    with pytest.raises(NotADirectoryError):
        fsutil.fsync_dir(tmp_path / "file")

    assert _open_fds() == before


def test_fsync_dir_of_a_missing_directory_raises_enoent(tmp_path):
    with pytest.raises(FileNotFoundError):
        fsutil.fsync_dir(tmp_path / "missing")


@pytest.mark.parametrize("directory", ["/proc", "/sys"])
def test_fsync_dir_of_a_filesystem_that_cannot_sync_directories_returns_quietly(directory):
    # Real: procfs and sysfs have no fsync for their directories, and Linux says EINVAL.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as refused:
            os.fsync(fd)
    finally:
        os.close(fd)
    assert refused.value.errno == errno.EINVAL
    before = _open_fds()

    assert fsutil.fsync_dir(directory) is None

    assert _open_fds() == before


def test_fsync_dir_takes_eopnotsupp_as_a_filesystem_that_does_not_sync_directories(tmp_path, monkeypatch):
    """Injected: no filesystem mountable here answers EOPNOTSUPP to a directory fsync (tmpfs,
    ext4, overlay and bindfs flush; procfs and sysfs say EINVAL, tested above for real)."""
    directory_fsync_fails_with(monkeypatch, errno.EOPNOTSUPP)
    before = _open_fds()

    assert fsutil.fsync_dir(tmp_path) is None

    assert _open_fds() == before


@pytest.mark.parametrize("err", [errno.EIO, errno.EROFS, errno.ENOSPC, errno.EDQUOT], ids=errno.errorcode.get)
def test_fsync_dir_raises_a_flush_that_was_tried_and_failed(tmp_path, monkeypatch, err):
    """Injected: a failing disk or an aborted ext4 journal cannot be produced here."""
    directory_fsync_fails_with(monkeypatch, err)
    before = _open_fds()

    with pytest.raises(OSError) as raised:
        fsutil.fsync_dir(tmp_path)

    assert raised.value.errno == err
    assert _open_fds() == before


# open_nofollow


def test_open_nofollow_opens_a_regular_file_close_on_exec(tmp_path):
    (tmp_path / "state").write_bytes(b"contents")

    fd = fsutil.open_nofollow(tmp_path / "state", os.O_RDONLY)
    try:
        assert os.read(fd, 100) == b"contents"
        assert os.get_inheritable(fd) is False
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)


def test_open_nofollow_creates_with_mode_0600_by_default(tmp_path):
    fd = fsutil.open_nofollow(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    os.close(fd)

    assert stat.S_IMODE((tmp_path / "lock").stat().st_mode) == 0o600


def test_open_nofollow_refuses_a_symlink_naming_the_path(tmp_path):
    (tmp_path / "target").write_bytes(b"keep")
    (tmp_path / "link").symlink_to(tmp_path / "target")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/link is a symbolic link"):
        fsutil.open_nofollow(tmp_path / "link", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)

    assert (tmp_path / "target").read_bytes() == b"keep"


def test_open_nofollow_refuses_a_dangling_symlink_instead_of_creating_its_target(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "planted")

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        fsutil.open_nofollow(tmp_path / "link", os.O_WRONLY | os.O_CREAT)

    assert not (tmp_path / "planted").exists()


def test_open_nofollow_refuses_a_symlink_to_a_directory(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        fsutil.open_nofollow(tmp_path / "link", os.O_RDONLY | os.O_DIRECTORY)


def test_open_nofollow_keeps_other_errors_as_oserror(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        fsutil.open_nofollow(tmp_path / "missing", os.O_RDONLY)

    assert raised.value.filename == str(tmp_path / "missing")


def test_open_nofollow_opens_a_real_directory_with_o_directory(tmp_path):
    fd = fsutil.open_nofollow(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def test_open_nofollow_keeps_enotdir_for_a_file_opened_as_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")

    with pytest.raises(NotADirectoryError):
        fsutil.open_nofollow(tmp_path / "file", os.O_RDONLY | os.O_DIRECTORY)


# durable_replace


def _listing(directory):
    return sorted(path.name for path in directory.iterdir())


class Stopped(Exception):
    """What a caller's block might raise."""


@contextlib.contextmanager
def _within(seconds):
    """Fail instead of hanging: a write that opened a planted FIFO would wait for a reader."""

    def expire(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_durable_replace_puts_the_bytes_written_in_the_block_at_the_path(tmp_path):
    (tmp_path / "state").write_bytes(b"old")
    before = _open_fds()

    with fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"new ")
        stream.write(b"bytes")
        assert (tmp_path / "state").read_bytes() == b"old"

    assert (tmp_path / "state").read_bytes() == b"new bytes"
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o644
    assert _listing(tmp_path) == ["state"]
    assert _open_fds() == before


def test_durable_replace_with_text_writes_str_in_the_encoding(tmp_path):
    with fsutil.durable_replace(tmp_path / "greeting", 0o600, text=True, encoding="latin-1") as stream:
        stream.write("café\n")

    assert (tmp_path / "greeting").read_bytes() == b"caf\xe9\n"
    assert stat.S_IMODE((tmp_path / "greeting").stat().st_mode) == 0o600


def test_durable_replace_without_a_mode_keeps_what_the_block_set_on_the_open_file(tmp_path):
    with fsutil.durable_replace(tmp_path / "module.lua", mode=None) as stream:
        stream.write(b"x")
        stream.flush()
        os.fchmod(stream.fileno(), 0o640)

    assert stat.S_IMODE((tmp_path / "module.lua").stat().st_mode) == 0o640


def test_durable_replace_without_a_mode_or_a_chmod_leaves_a_private_file(tmp_path):
    with fsutil.durable_replace(tmp_path / "private", mode=None) as stream:
        stream.write(b"x")

    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_durable_replace_writes_a_close_on_exec_temp_file_beside_the_target(tmp_path):
    with fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"x")
        (temp,) = _listing(tmp_path)
        inside = os.fstat(stream.fileno())
        fd_flags = fcntl.fcntl(stream.fileno(), fcntl.F_GETFD)

    assert temp.startswith(".state.")
    assert temp.endswith(".tmp")
    assert len(temp) == len(".state.") + 16 + len(".tmp")
    assert fd_flags & fcntl.FD_CLOEXEC
    assert os.lstat(tmp_path / "state").st_ino == inside.st_ino
    assert stream.closed


def _write_then_raise(path, stop):
    with fsutil.durable_replace(path) as stream:
        stream.write(b"half of the new")
        raise stop("stopped")


@pytest.mark.parametrize("stop", [Stopped, KeyboardInterrupt, errors.Terminated], ids=lambda e: e.__name__)
def test_an_exception_in_the_block_leaves_the_old_file_and_no_temp_file(tmp_path, stop):
    (tmp_path / "state").write_bytes(b"old")
    before = _open_fds()

    with pytest.raises(stop):
        _write_then_raise(tmp_path / "state", stop)

    assert (tmp_path / "state").read_bytes() == b"old"
    assert _listing(tmp_path) == ["state"]
    assert _open_fds() == before


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    (tmp_path / "state").write_bytes(b"old")

    with pytest.raises(TypeError), fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write("text into a binary stream")

    assert (tmp_path / "state").read_bytes() == b"old"
    assert _listing(tmp_path) == ["state"]


def test_a_failed_fsync_of_the_file_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    """Injected: an fsync that fails (EIO from a dying disk) cannot be produced here."""
    (tmp_path / "state").write_bytes(b"old")
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    before = _open_fds()

    with pytest.raises(OSError) as raised, fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"new")

    assert raised.value.errno == errno.EIO
    assert (tmp_path / "state").read_bytes() == b"old"
    assert _listing(tmp_path) == ["state"]
    assert _open_fds() == before


def test_a_failed_replace_onto_an_immutable_file_leaves_it_and_no_temp_file(tmp_path):
    (tmp_path / "state").write_bytes(b"old")
    subprocess.run(["chattr", "+i", str(tmp_path / "state")], check=True)
    try:
        with pytest.raises(PermissionError), fsutil.durable_replace(tmp_path / "state") as stream:
            stream.write(b"new")
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "state")], check=True)

    assert (tmp_path / "state").read_bytes() == b"old"
    assert _listing(tmp_path) == ["state"]


def test_a_failed_directory_fsync_after_the_replace_is_raised_with_the_new_file_in_place(
    tmp_path, monkeypatch
):
    """Injected: a directory fsync that fails (EIO) cannot be produced here."""
    (tmp_path / "state").write_bytes(b"old")
    directory_fsync_fails_with(monkeypatch, errno.EIO)

    with pytest.raises(OSError) as raised, fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"new")

    assert raised.value.errno == errno.EIO
    assert (tmp_path / "state").read_bytes() == b"new"
    assert _listing(tmp_path) == ["state"]


def test_a_directory_that_cannot_sync_directories_still_gets_the_new_file(tmp_path, monkeypatch):
    """Injected EINVAL: the filesystems that answer it for real (procfs, sysfs) hold no files of ours."""
    directory_fsync_fails_with(monkeypatch, errno.EINVAL)

    with fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"new")

    assert (tmp_path / "state").read_bytes() == b"new"


def _plant_at_predictable_names(directory, victim):
    names = (".state.tmp", "state.tmp", "state.new", ".state", ".state.new", "state~")
    for index, name in enumerate(names):
        if index % 2:
            os.mkfifo(directory / name)
        else:
            (directory / name).symlink_to(victim)
    return names


def test_a_symlink_or_fifo_at_a_predictable_name_is_never_followed_or_opened(tmp_path):
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    planted = _plant_at_predictable_names(work, victim)

    with _within(10), fsutil.durable_replace(work / "state") as stream:
        stream.write(b"payload")

    assert (work / "state").read_bytes() == b"payload"
    assert victim.read_bytes() == b"precious"
    assert _listing(work) == sorted([*planted, "state"])
    assert all(
        os.path.islink(work / name) or stat.S_ISFIFO(os.lstat(work / name).st_mode) for name in planted
    )


@pytest.mark.parametrize("planted", ["symlink", "fifo", "hard link"])
def test_even_a_guessed_temp_name_is_refused_and_another_one_taken(tmp_path, monkeypatch, planted):
    """``os.urandom`` is made to repeat itself once: only that lets a test plant something at
    the exact temporary name, which is what an attacker cannot do."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    guessed = work / f".state.{'00' * 8}.tmp"
    if planted == "symlink":
        guessed.symlink_to(victim)
    elif planted == "fifo":
        os.mkfifo(guessed)
    else:
        os.link(victim, guessed)
    randoms = iter([b"\0" * 8, b"\1" * 8])
    monkeypatch.setattr(os, "urandom", lambda size: next(randoms))

    with _within(10), fsutil.durable_replace(work / "state") as stream:
        stream.write(b"payload")

    assert (work / "state").read_bytes() == b"payload"
    assert victim.read_bytes() == b"precious"
    assert _listing(work) == sorted([guessed.name, "state"])


def test_a_temp_name_that_keeps_being_taken_raises_and_creates_nothing(tmp_path, monkeypatch):
    """``os.urandom`` is made constant: a directory filled with every name tried cannot be
    made otherwise."""
    guessed = tmp_path / f".state.{'00' * 8}.tmp"
    guessed.symlink_to(tmp_path / "nowhere")
    monkeypatch.setattr(os, "urandom", lambda size: b"\0" * size)

    with pytest.raises(FileExistsError), fsutil.durable_replace(tmp_path / "state") as stream:
        stream.write(b"never")

    assert _listing(tmp_path) == [guessed.name]
    assert not (tmp_path / "nowhere").exists()


def test_a_long_file_name_gets_a_temp_name_within_the_name_limit(tmp_path):
    name = "m" * 250

    fsutil.atomic_write(tmp_path / name, b"x")

    assert (tmp_path / name).read_bytes() == b"x"
    assert _listing(tmp_path) == [name]


# The child: a tmpfs of 64 KiB in its own mount namespace, an old file, a write too big for it.
DISK_FULL = r"""
import errno, json, os, sys
from hpcstack_ops.staged_rebuild import fsutil, modulefile
root = sys.argv[1]
report = {}
writers = (("atomic_write", fsutil.atomic_write), ("module_file", modulefile.replace_keeping_metadata))
for name, replace in writers:
    path = os.path.join(root, name)
    fsutil.atomic_write(path, b"old contents\n")
    try:
        replace(path, b"x" * (1 << 20))
        outcome = "written"
    except OSError as err:
        outcome = errno.errorcode.get(err.errno, str(err.errno))
    with open(path, "rb") as handle:
        report[name] = {"outcome": outcome, "contents": handle.read().decode()}
report["listing"] = sorted(os.listdir(root))
print(json.dumps(report))
"""


def test_a_disk_full_write_leaves_the_old_file_and_no_temp_file(package_dir, tmp_path):
    point = tmp_path / "small"
    point.mkdir()
    done = subprocess.run(
        in_private_mounts(
            'mount -t tmpfs -o size=64k none "$1" && exec "$PYTHON" -c "$CODE" "$1"', str(point)
        ),
        env=dict(os.environ, PYTHONPATH=str(package_dir), PYTHON=sys.executable, CODE=DISK_FULL),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    assert report["atomic_write"] == {"outcome": "ENOSPC", "contents": "old contents\n"}
    assert report["module_file"] == {"outcome": "ENOSPC", "contents": "old contents\n"}
    assert report["listing"] == ["atomic_write", "module_file"]
    assert os.listdir(point) == []


# atomic_write


def test_atomic_write_creates_the_file_with_the_bytes_and_mode_0644(tmp_path):
    fsutil.atomic_write(tmp_path / "module.lua", b"root = 1\n")

    assert (tmp_path / "module.lua").read_bytes() == b"root = 1\n"
    assert stat.S_IMODE((tmp_path / "module.lua").stat().st_mode) == 0o644
    assert _listing(tmp_path) == ["module.lua"]


def test_atomic_write_sets_the_requested_mode_whatever_the_umask(tmp_path):
    old_umask = os.umask(0o077)
    try:
        fsutil.atomic_write(tmp_path / "wide", b"x", mode=0o664)
        fsutil.atomic_write(tmp_path / "narrow", b"x", mode=0o600)
    finally:
        os.umask(old_umask)

    assert stat.S_IMODE((tmp_path / "wide").stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "narrow").stat().st_mode) == 0o600


def test_atomic_write_replaces_the_inode_so_an_open_reader_keeps_the_old_bytes(tmp_path):
    target = tmp_path / "journal.json"
    target.write_bytes(b"old")
    old_ino = target.stat().st_ino

    with target.open("rb") as reader:
        fsutil.atomic_write(target, b"new")
        assert reader.read() == b"old"

    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != old_ino
    assert _listing(tmp_path) == ["journal.json"]


def test_atomic_write_takes_a_random_temp_name_in_the_target_directory(tmp_path, monkeypatch):
    # The temporary name exists only inside the call; a spy on os.replace (which still
    # performs the real rename, relative to the directory's descriptor) is the only place it
    # can be seen from a test.
    sources = []
    real_replace = os.replace

    def spy(source, target, **dir_fds):
        sources.append((os.readlink(f"/proc/self/fd/{dir_fds['src_dir_fd']}"), source))
        real_replace(source, target, **dir_fds)

    monkeypatch.setattr(os, "replace", spy)
    fsutil.atomic_write(tmp_path / "state", b"1")
    fsutil.atomic_write(tmp_path / "state", b"2")

    assert [directory for directory, _name in sources] == [str(tmp_path)] * 2
    assert all(name.startswith(".state.") for _directory, name in sources)
    assert sources[0] != sources[1]
    assert (tmp_path / "state").read_bytes() == b"2"


def test_atomic_write_does_not_write_through_a_planted_hard_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for fixed_name in ("state.tmp", ".state.tmp", "state.new", ".state"):
        os.link(victim, tmp_path / fixed_name)

    fsutil.atomic_write(tmp_path / "state", b"payload")

    assert victim.read_bytes() == b"precious"
    assert victim.stat().st_nlink == 5
    assert (tmp_path / "state").read_bytes() == b"payload"


def test_atomic_write_refuses_a_symlink_and_leaves_link_and_target(tmp_path):
    (tmp_path / "target").write_bytes(b"keep")
    (tmp_path / "link").symlink_to("target")

    with pytest.raises(errors.UsageError, match=f"{tmp_path}/link is a symbolic link"):
        fsutil.atomic_write(tmp_path / "link", b"new")

    assert os.readlink(tmp_path / "link") == "target"
    assert (tmp_path / "target").read_bytes() == b"keep"
    assert _listing(tmp_path) == ["link", "target"]


def test_atomic_write_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        fsutil.atomic_write(tmp_path / "link", b"new")

    assert not (tmp_path / "nowhere").exists()


def test_atomic_write_unlinks_the_temp_file_when_the_write_fails(tmp_path):
    (tmp_path / "state").write_bytes(b"old")

    with pytest.raises(TypeError):
        fsutil.atomic_write(tmp_path / "state", "text, not bytes")

    assert (tmp_path / "state").read_bytes() == b"old"
    assert _listing(tmp_path) == ["state"]


def test_atomic_write_unlinks_the_temp_file_when_the_replace_fails(tmp_path):
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "inside").write_text("x")

    with pytest.raises(IsADirectoryError):
        fsutil.atomic_write(tmp_path / "occupied", b"new")

    assert _listing(tmp_path) == ["occupied"]
    assert (tmp_path / "occupied" / "inside").read_text() == "x"


def test_atomic_write_into_a_missing_directory_raises_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        fsutil.atomic_write(tmp_path / "missing" / "state", b"x")

    assert _listing(tmp_path) == []


def test_durable_replace_docstring_explains_the_order():
    # atomic_write is a thin user of durable_replace, which keeps the list.
    numbered = [
        line.strip()
        for line in fsutil.durable_replace.__doc__.splitlines()
        if line.strip()[:2] in {f"{n}." for n in range(1, 10)}
    ]
    expected = ["mkstemp", "flush", "fchmod", "``fsync`` the file", "os.replace", "``fsync`` the directory"]

    assert len(numbered) == len(expected)
    assert all(word in line for word, line in zip(expected, numbered))
    assert "hard link" in fsutil.durable_replace.__doc__


# refuse_symlink_components


def test_refuse_symlink_components_accepts_a_path_without_links(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "file").write_text("x")

    assert fsutil.refuse_symlink_components(tmp_path / "a" / "b" / "file") is None


def test_refuse_symlink_components_accepts_a_missing_tail(tmp_path):
    (tmp_path / "a").mkdir()

    assert fsutil.refuse_symlink_components(tmp_path / "a" / "not" / "yet" / "there") is None


def test_refuse_symlink_components_names_a_linked_middle_component(tmp_path):
    (tmp_path / "real" / "b").mkdir(parents=True)
    (tmp_path / "a").symlink_to("real")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/a is a symbolic link"):
        fsutil.refuse_symlink_components(tmp_path / "a" / "b")


def test_refuse_symlink_components_names_the_first_of_two_links(tmp_path):
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "real" / "link2").symlink_to("inner")
    (tmp_path / "link1").symlink_to("real")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/link1 is a symbolic link"):
        fsutil.refuse_symlink_components(tmp_path / "link1" / "link2" / "file")


def test_refuse_symlink_components_refuses_a_link_as_the_last_component(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "module.lua").symlink_to("file")

    with pytest.raises(errors.UsageError, match=r"module\.lua is a symbolic link"):
        fsutil.refuse_symlink_components(tmp_path / "module.lua")


def test_refuse_symlink_components_refuses_a_dangling_last_link(tmp_path):
    (tmp_path / "module.lua").symlink_to(tmp_path / "nowhere")

    with pytest.raises(errors.UsageError, match=r"module\.lua is a symbolic link"):
        fsutil.refuse_symlink_components(tmp_path / "module.lua")


def test_refuse_symlink_components_refuses_a_link_above_a_missing_tail(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "modules").symlink_to("elsewhere")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/modules is a symbolic link"):
        fsutil.refuse_symlink_components(tmp_path / "modules" / "all" / "Name" / "1.0.lua")


def test_refuse_symlink_components_walks_dotdot_as_written(tmp_path):
    # abspath would turn link/../x into x and never look at the link the kernel follows.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/link is a symbolic link"):
        fsutil.refuse_symlink_components(f"{tmp_path}/link/../x")


def test_refuse_symlink_components_resolves_a_relative_path_from_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/link is a symbolic link"):
        fsutil.refuse_symlink_components("link/state")
    assert fsutil.refuse_symlink_components("real/state") is None


def test_refuse_symlink_components_trusts_stop_at_and_checks_below_it(tmp_path):
    (tmp_path / "site" / "Name" / "1.0").mkdir(parents=True)
    (tmp_path / "software").symlink_to("site")
    (tmp_path / "site" / "Name" / "2.0").symlink_to("1.0")

    assert (
        fsutil.refuse_symlink_components(
            tmp_path / "software" / "Name" / "1.0", stop_at=tmp_path / "software"
        )
        is None
    )
    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/software/Name/2.0 is a symbolic link"):
        fsutil.refuse_symlink_components(
            tmp_path / "software" / "Name" / "2.0", stop_at=tmp_path / "software"
        )


def test_refuse_symlink_components_refuses_a_path_outside_stop_at(tmp_path):
    (tmp_path / "software").mkdir()

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/other/x is not under {tmp_path}/software$"):
        fsutil.refuse_symlink_components(tmp_path / "other" / "x", stop_at=tmp_path / "software")


def test_refuse_symlink_components_stops_quietly_below_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")

    assert fsutil.refuse_symlink_components(tmp_path / "file" / "child") is None


def test_refuse_symlink_components_refuses_a_prefix_it_cannot_examine(tmp_path):
    too_long = "n" * 300  # longer than NAME_MAX: lstat fails with ENAMETOOLONG

    with pytest.raises(errors.UsageError, match=r"^cannot check .* for symbolic links: File name too long$"):
        fsutil.refuse_symlink_components(tmp_path / too_long / "x")


# tree_digest and changed_paths


def _sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _sample_tree(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "lib" / "deep").mkdir(parents=True)
    (root / "lib" / "deep" / "libx.so").write_bytes(b"\x7fELF")
    (root / "PAYLOAD").write_bytes(b"old")
    (root / "current").symlink_to("bin/tool")
    return root


def test_tree_digest_records_files_links_and_directories_sorted(tmp_path):
    root = _sample_tree(tmp_path / "live")

    record = fsutil.tree_digest(root)

    assert record == {
        "PAYLOAD": _sha256(b"old"),
        "bin": "dir",
        "bin/tool": _sha256(b"#!/bin/sh\n"),
        "current": "link:bin/tool",
        "lib": "dir",
        "lib/deep": "dir",
        "lib/deep/libx.so": _sha256(b"\x7fELF"),
    }
    assert list(record) == sorted(record)


def test_tree_digest_of_an_empty_directory_is_empty(tmp_path):
    assert fsutil.tree_digest(tmp_path) == {}


def test_tree_digest_does_not_follow_a_link_out_of_the_tree(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("x")
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "escape").symlink_to(tmp_path / "outside")
    (tmp_path / "live" / "file_link").symlink_to(tmp_path / "outside" / "secret")

    assert fsutil.tree_digest(tmp_path / "live") == {
        "escape": f"link:{tmp_path}/outside",
        "file_link": f"link:{tmp_path}/outside/secret",
    }


def test_tree_digest_records_a_fifo_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe")

    assert fsutil.tree_digest(tmp_path) == {"pipe": f"other:{stat.S_IFIFO:o}"}


def test_tree_digest_refuses_a_missing_root(tmp_path):
    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/missing does not exist"):
        fsutil.tree_digest(tmp_path / "missing")


def test_tree_digest_refuses_a_root_that_is_a_symlink(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "live").symlink_to("real")

    with pytest.raises(errors.UsageError, match=f"^{tmp_path}/live is not a directory"):
        fsutil.tree_digest(tmp_path / "live")


def test_tree_digest_refuses_a_root_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")

    with pytest.raises(errors.UsageError, match="is not a directory"):
        fsutil.tree_digest(tmp_path / "file")


def test_changed_paths_reports_added_removed_and_changed_sorted():
    before = {"a": "dir", "a/kept": "sha256:1", "a/edited": "sha256:2", "gone": "sha256:3"}
    after = {"a": "dir", "a/kept": "sha256:1", "a/edited": "sha256:9", "new": "link:x"}

    assert fsutil.changed_paths(before, after) == ["a/edited", "gone", "new"]


def test_changed_paths_of_identical_records_is_empty(tmp_path):
    root = _sample_tree(tmp_path / "live")

    assert fsutil.changed_paths(fsutil.tree_digest(root), fsutil.tree_digest(root)) == []


def test_changed_paths_sees_same_size_content_changes_and_retyped_entries(tmp_path):
    root = _sample_tree(tmp_path / "live")
    before = fsutil.tree_digest(root)
    (root / "PAYLOAD").write_bytes(b"new")  # same size, same name: only the hash differs
    (root / "bin" / "tool").unlink()
    (root / "bin" / "tool").symlink_to("/bin/true")
    (root / "lib" / "deep" / "libx.so").unlink()
    (root / "added").write_bytes(b"")

    after = fsutil.tree_digest(root)

    assert fsutil.changed_paths(before, after) == ["PAYLOAD", "added", "bin/tool", "lib/deep/libx.so"]


# Removal by descriptors


def test_remove_tree_removes_a_sealed_tree_by_descriptors_and_leaves_what_its_links_name(tmp_path):
    tree = tmp_path / "software" / "TinyApp" / ".1.0.run1"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "tiny").write_text("program\n")
    (tree / "link").symlink_to("/etc/passwd")
    os.chmod(tree / "bin", 0o500)  # sealed: no write bit, as --read-only-installdir leaves it
    os.chmod(tree, 0o500)

    fsutil.remove_tree(str(tree), root=str(tmp_path / "software"))

    assert not tree.exists()
    assert (tmp_path / "software" / "TinyApp").is_dir()
    assert os.path.exists("/etc/passwd")


def test_directory_open_refuses_a_component_that_is_a_link_and_names_it(tmp_path):
    (tmp_path / "elsewhere" / "TinyApp").mkdir(parents=True)
    (tmp_path / "software").mkdir()
    (tmp_path / "software" / "TinyApp").symlink_to(tmp_path / "elsewhere" / "TinyApp")

    with pytest.raises(errors.UsageError) as raised:
        fsutil.Directory.open(tmp_path / "software" / "TinyApp", root=tmp_path / "software")

    assert str(raised.value) == (
        f"{tmp_path / 'software' / 'TinyApp'} is a symbolic link; refusing to follow it"
    )


@pytest.mark.parametrize("path", ["../etc", "TinyApp/../../etc"])
def test_directory_open_refuses_to_climb_out_of_its_root(tmp_path, path):
    (tmp_path / "software" / "TinyApp").mkdir(parents=True)

    with pytest.raises(errors.UsageError, match=r"leaves|is not under"):
        fsutil.Directory.open(f"{tmp_path / 'software'}/{path}", root=tmp_path / "software")


def test_directory_open_refuses_a_path_outside_its_root(tmp_path):
    (tmp_path / "software").mkdir()
    (tmp_path / "other").mkdir()

    with pytest.raises(errors.UsageError, match="is not under"):
        fsutil.Directory.open(tmp_path / "other", root=tmp_path / "software")


def test_directory_open_with_create_mode_makes_the_missing_components_below_the_root(tmp_path):
    (tmp_path / "state").mkdir()

    made_path = tmp_path / "state" / "runs" / "r1"
    with fsutil.Directory.open(made_path, tmp_path / "state", create_mode=0o700) as made:
        assert os.fstat(made.fd).st_ino == os.stat(tmp_path / "state" / "runs" / "r1").st_ino

    assert stat.S_IMODE(os.stat(tmp_path / "state" / "runs").st_mode) == 0o700


def test_directory_open_with_create_mode_refuses_a_link_it_finds_instead_of_making_through_it(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "state" / "runs").symlink_to(tmp_path / "victim")

    with pytest.raises(errors.UsageError, match="symbolic link"):
        fsutil.Directory.open(tmp_path / "state" / "runs" / "r1", tmp_path / "state", create_mode=0o700)

    assert os.listdir(tmp_path / "victim") == []


def test_a_directory_keeps_working_on_the_directory_it_opened_after_its_name_is_swapped(tmp_path):
    (tmp_path / "software" / "TinyApp").mkdir(parents=True)
    (tmp_path / "victim").mkdir()
    with fsutil.Directory.open(tmp_path / "software" / "TinyApp", root=tmp_path / "software") as held:
        os.rename(tmp_path / "software" / "TinyApp", tmp_path / "software" / "moved")
        (tmp_path / "software" / "TinyApp").symlink_to(tmp_path / "victim")

        with held.replace("1.0.lua") as stream:
            stream.write(b"new\n")
        held.mkdir("1.0")
        held.exchange("1.0", "1.0.lua")

    assert os.listdir(tmp_path / "victim") == []
    assert sorted(os.listdir(tmp_path / "software" / "moved")) == ["1.0", "1.0.lua"]
    assert (tmp_path / "software" / "moved" / "1.0").read_bytes() == b"new\n"


def test_directory_replace_refuses_a_link_at_the_name(tmp_path):
    (tmp_path / "victim").write_text("keep\n")
    (tmp_path / "name").symlink_to(tmp_path / "victim")

    held = fsutil.Directory.open(tmp_path)
    with held, pytest.raises(errors.UsageError, match="symbolic link"), held.replace("name") as stream:
        stream.write(b"x")

    assert (tmp_path / "victim").read_text() == "keep\n"
    assert sorted(os.listdir(tmp_path)) == ["name", "victim"]


@pytest.mark.parametrize("kind", ["fifo", "link", "directory", "socket"])
def test_directory_read_regular_refuses_what_is_not_a_regular_file_without_waiting(tmp_path, kind):
    name = tmp_path / "name"
    if kind == "fifo":
        os.mkfifo(name)
    elif kind == "link":
        name.symlink_to("/etc/passwd")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(name))
        server.close()
    else:
        name.mkdir()

    with fsutil.Directory.open(tmp_path) as held, pytest.raises(errors.UsageError) as raised:
        held.read_regular("name", "module file")

    assert str(raised.value).startswith(f"module file {tmp_path / 'name'} is ")


def test_directory_read_regular_names_the_whole_path_of_a_file_it_cannot_open(tmp_path):
    with fsutil.Directory.open(tmp_path) as held, pytest.raises(FileNotFoundError) as raised:
        held.read_regular("missing", "module file")

    assert raised.value.filename == str(tmp_path / "missing")


def test_directory_rename_moves_between_two_held_directories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f").write_text("x\n")
    with fsutil.Directory.open(tmp_path / "a") as source, fsutil.Directory.open(tmp_path / "b") as target:
        source.rename("f", target, "g")

    assert (tmp_path / "b" / "g").read_text() == "x\n"
    assert not (tmp_path / "a" / "f").exists()


def test_remove_tree_at_refuses_a_name_that_is_a_link_and_leaves_its_target(tmp_path):
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep").write_text("x\n")
    (tmp_path / "sibling").symlink_to(target)
    parent_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(errors.UsageError, match="symbolic link"):
            fsutil.remove_tree_at(parent_fd, "sibling", str(tmp_path / "sibling"))
    finally:
        os.close(parent_fd)

    assert (target / "keep").read_text() == "x\n"


def test_directory_open_trusts_a_root_behind_a_link_as_a_site_may_keep_it(tmp_path):
    (tmp_path / "real" / "TinyApp").mkdir(parents=True)
    (tmp_path / "software").symlink_to(tmp_path / "real")

    with fsutil.Directory.open(tmp_path / "software" / "TinyApp", root=tmp_path / "software") as held:
        assert os.fstat(held.fd).st_ino == os.stat(tmp_path / "real" / "TinyApp").st_ino
