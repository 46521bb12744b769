"""The step cache: its file name, its record format, and what it believes of a file it finds.

The cache lives in a directory other users can write to, so most tests here put something
there that a task must not believe (a symlink, a file of another uid, a wrong mode, a hard
link, a directory, a FIFO) and check that the cache refuses it without writing through it.
Real files and real flocks throughout; a file of another uid is chowned to the test user.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import threading
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard.decision import (
    FAIL,
    RELOAD,
    Decision,
    skip,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline

RELOADED = Decision(
    RELOAD,
    "reloaded x86_64/intel/haswell->x86_64/amd/zen3",
    [
        ("EESSI_SOFTWARE_SUBDIR", "x86_64/amd/zen3"),
        ("OLD_ONLY", None),
        ("EESSI_ARCH_GUARD_RELOADED", "x86_64/intel/haswell->x86_64/amd/zen3"),
    ],
    "eessi-arch-guard: reloaded EESSI for x86_64/amd/zen3 (job environment was x86_64/intel/haswell)",
)
FORGED = Decision(RELOAD, "forged", [("LD_PRELOAD", "/tmp/evil.so")], "forged")


def sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def job_env(tmp_path, **extra) -> dict:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": "node001",
        "TMPDIR": str(tmp_path),
        "EESSI_SOFTWARE_SUBDIR": "x86_64/intel/haswell",
        "MODULEPATH": "/cvmfs/modules/all",
        "PATH": "/usr/bin:/bin",
    }
    env.update(extra)
    return env


def snapshot(path) -> tuple:
    """What an attack must leave as it was: the bytes, mode, owner and link count."""
    info = os.lstat(path)
    with open(path, "rb") as handle:
        data = handle.read()
    return data, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, info.st_nlink


def write_file(path, data: bytes, mode: int = 0o600) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


@pytest.fixture
def step_cache(tmp_path) -> cache.StepCache:
    return cache.StepCache(str(tmp_path / ".eessi-arch-guard.0.node001.4242.0.prolog.0123456789abcdef"))


@pytest.fixture
def other_users_file(tmp_path, unprivileged_user):
    """A valid-looking decision, mode 0600, owned by the test user (another uid than ours)."""
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    path = tmp_path / "victim"
    write_file(path, cache.encode(FORGED))
    os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    return path


# ------------------------------------------------------------------ file-name parts


@pytest.mark.parametrize("value", ["node001", "4242", "0", "batch", "a.b_c-D", "x" * 64, ".."])
def test_plain_short_component_is_used_as_it_is(value):
    assert cache.component(value) == value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 65, id="65-chars"),
        pytest.param("../../etc/passwd", id="slash"),
        pytest.param("node 1", id="space"),
        pytest.param("nœud", id="non-ascii"),
        pytest.param("a\nb", id="newline"),
    ],
)
def test_other_component_becomes_a_16_char_sha256_prefix(value):
    assert cache.component(value) == sha16(value.encode())


def test_component_that_is_not_utf8_is_hashed_as_its_bytes():
    assert cache.component(os.fsdecode(b"node\xff")) == sha16(b"node\xff")


def test_digest_names_are_the_references_list():
    assert cache.DIGEST_NAMES == (
        "EESSI_SOFTWARE_SUBDIR",
        "EESSI_ACCEL_SUBDIR",
        "LOADEDMODULES",
        "MODULEPATH",
        "EESSI_INIT_PREFIX",
        "EESSI_PROC_CPUINFO",
        "PATH",
    )


def test_digest_is_the_sha256_prefix_of_the_values_joined_by_nul():
    env = {name: f"value of {name}" for name in cache.DIGEST_NAMES}
    expected = sha16(b"\0".join(f"value of {name}".encode() for name in cache.DIGEST_NAMES))
    assert cache.digest(env) == expected


def test_digest_counts_an_unset_name_as_empty():
    assert cache.digest({"PATH": "/bin"}) == sha16(b"\0" * 6 + b"/bin")


@pytest.mark.parametrize("name", cache.DIGEST_NAMES)
def test_digest_changes_with_each_of_its_names(name):
    env = {other: "same" for other in cache.DIGEST_NAMES}
    assert cache.digest(env) != cache.digest(dict(env, **{name: "different"}))


@pytest.mark.parametrize("name", ["EESSI_ARCH_GUARD", "SLURM_LOCALID", "HOME", "EESSI_ARCH_GUARD_VERBOSE"])
def test_digest_ignores_names_outside_its_list(name):
    env = {other: "same" for other in cache.DIGEST_NAMES}
    assert cache.digest(env) == cache.digest(dict(env, **{name: "anything"}))


def test_digest_keeps_values_apart_that_a_plain_join_would_merge():
    # NUL cannot occur in an environment value, so no two inputs give the same joined bytes.
    assert cache.digest({"EESSI_SOFTWARE_SUBDIR": "a", "EESSI_ACCEL_SUBDIR": "b"}) != cache.digest(
        {"EESSI_SOFTWARE_SUBDIR": "ab"}
    )


def test_digest_of_values_that_are_not_utf8_uses_their_bytes():
    env = {"PATH": os.fsdecode(b"/opt/\xff/bin")}
    assert cache.digest(env) == sha16(b"\0" * 6 + b"/opt/\xff/bin")


# ----------------------------------------------------------------------- path_for


def test_path_names_uid_node_job_step_mode_and_digest(tmp_path):
    env = job_env(tmp_path)
    expected = f".eessi-arch-guard.{os.getuid()}.node001.4242.0.prolog.{cache.digest(env)}"
    assert cache.path_for(env, "prolog") == str(tmp_path / expected)


@pytest.mark.parametrize("job", [None, ""], ids=["unset", "empty"])
def test_no_path_without_slurm_job_id(tmp_path, job):
    env = job_env(tmp_path)
    if job is None:
        del env["SLURM_JOB_ID"]
    else:
        env["SLURM_JOB_ID"] = job
    assert cache.path_for(env, "prolog") is None


def test_mode_is_part_of_the_name(tmp_path):
    env = job_env(tmp_path)
    prolog, shell = cache.path_for(env, "prolog"), cache.path_for(env, "shell")
    assert prolog != shell
    assert ".4242.0.shell." in os.path.basename(shell)


def test_step_without_slurm_step_id_is_batch(tmp_path):
    env = job_env(tmp_path)
    del env["SLURM_STEP_ID"]
    assert f".node001.4242.batch.prolog.{cache.digest(env)}" in cache.path_for(env, "prolog")


def test_node_without_slurmd_nodename_is_the_hosts_name(tmp_path):
    env = job_env(tmp_path)
    del env["SLURMD_NODENAME"]
    assert f".{cache.component(os.uname().nodename)}.4242.0.prolog." in cache.path_for(env, "prolog")


def test_hostile_node_job_and_step_stay_inside_one_file_name(tmp_path):
    env = job_env(tmp_path, SLURMD_NODENAME="../../etc", SLURM_JOB_ID="/etc/passwd", SLURM_STEP_ID="0\n1")
    path = cache.path_for(env, "prolog")
    assert os.path.dirname(path) == str(tmp_path)
    parts = os.path.basename(path).split(".")
    assert parts[3:6] == [sha16(b"../../etc"), sha16(b"/etc/passwd"), sha16(b"0\n1")]


def test_path_is_in_tmpdir_when_it_is_an_absolute_directory(tmp_path):
    assert os.path.dirname(cache.path_for(job_env(tmp_path), "prolog")) == str(tmp_path)


@pytest.mark.parametrize(
    "tmpdir",
    [
        pytest.param(None, id="unset"),
        pytest.param("relative/dir", id="relative"),
        pytest.param("", id="empty"),
    ],
)
def test_path_is_in_tmp_when_tmpdir_is_unset_or_not_absolute(tmp_path, tmpdir):
    env = job_env(tmp_path)
    if tmpdir is None:
        del env["TMPDIR"]
    else:
        env["TMPDIR"] = tmpdir
    assert os.path.dirname(cache.path_for(env, "prolog")) == "/tmp"


def test_path_is_in_tmp_when_tmpdir_does_not_exist(tmp_path):
    env = job_env(tmp_path, TMPDIR=str(tmp_path / "missing"))
    assert os.path.dirname(cache.path_for(env, "prolog")) == "/tmp"


def test_eessi_arch_guard_does_not_change_the_path(tmp_path):
    env = job_env(tmp_path)
    assert cache.path_for(env, "prolog") == cache.path_for(dict(env, EESSI_ARCH_GUARD="1"), "prolog")


# ------------------------------------------------------------------ encode, decode


@pytest.mark.parametrize(
    "decision",
    [
        pytest.param(RELOADED, id="reload"),
        pytest.param(skip("target already matches this node"), id="skip-without-changes"),
        pytest.param(
            Decision(FAIL, "why", [("EESSI_ARCH_GUARD_FAILED", "x86_64/amd/zen3->no-software-dir")], "msg"),
            id="failure",
        ),
        pytest.param(Decision(RELOAD, "d", [("EMPTY", ""), ("GONE", None)], ""), id="empty-value-and-unset"),
        pytest.param(Decision(RELOAD, "d", [("DASH", "-"), ("EQUALS", "=x=")], "m"), id="markers-as-values"),
        pytest.param(Decision(RELOAD, "d", [("BANNER", "one\ntwo\r\n")], "m"), id="newlines-for-shell"),
        pytest.param(
            Decision(RELOAD, "d", [(os.fsdecode(b"N\xffAME"), os.fsdecode(b"v\xfe\x80"))], "m"),
            id="not-utf8",
        ),
        pytest.param(Decision(RELOAD, "détail", [("LANG", "ça")], "message ünïcode"), id="unicode"),
    ],
)
def test_encoded_decision_decodes_to_the_same_decision(decision):
    assert cache.decode(cache.encode(decision), "/x") == decision


def test_unset_and_empty_value_stay_distinct():
    decoded = cache.decode(cache.encode(Decision(RELOAD, "d", [("A", ""), ("B", None)])), "/x")
    assert decoded.changes == (("A", ""), ("B", None))


def test_nul_in_a_text_field_cannot_split_the_record():
    decoded = cache.decode(cache.encode(Decision(RELOAD, "a\0b", [], "c\0d")), "/x")
    assert (decoded.detail, decoded.message) == ("a?b", "c?d")


def test_encoding_starts_with_the_format_and_ends_with_nul():
    data = cache.encode(RELOADED)
    assert data.startswith(cache.FORMAT + b"\0")
    assert data.endswith(b"\0")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(cache.encode(RELOADED).replace(b"decision 1", b"decision 2", 1), id="other-version"),
        pytest.param(cache.encode(RELOADED)[:-1], id="without-final-nul"),
        pytest.param(cache.encode(RELOADED)[:-10], id="truncated"),
        pytest.param(cache.FORMAT + b"\0skip\0detail\0", id="too-few-fields"),
        pytest.param(cache.encode(skip("d")) + b"ORPHAN\0", id="name-without-value"),
        pytest.param(b'{"action": "reload", "changes": []}', id="json"),
        pytest.param(b"\0" * 8, id="nuls"),
    ],
)
def test_decode_refuses_what_is_not_a_decision_of_this_version(data):
    with pytest.raises(cache.Untrusted, match="/some/cache is not a decision of this version"):
        cache.decode(data, "/some/cache")


# ------------------------------------------------------------------- read, publish


def test_read_without_a_file_is_none(step_cache):
    assert step_cache.read() is None


def test_published_decision_is_read_back(step_cache):
    step_cache.publish(RELOADED)
    assert step_cache.read() == RELOADED


def test_published_file_is_ours_mode_0600_with_one_link_and_no_temporary_left(step_cache, tmp_path):
    step_cache.publish(RELOADED)
    info = os.lstat(step_cache.path)
    assert stat.S_ISREG(info.st_mode)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_nlink) == (0o600, os.getuid(), 1)
    assert os.listdir(tmp_path) == [os.path.basename(step_cache.path)]


@pytest.mark.parametrize("umask", [0o077, 0o022, 0o277, 0o000])
def test_published_file_is_mode_0600_whatever_the_umask(step_cache, umask):
    old = os.umask(umask)
    try:
        step_cache.publish(RELOADED)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(step_cache.path).st_mode) == 0o600
    assert step_cache.read() == RELOADED


def test_publish_replaces_a_previous_result_whole(step_cache):
    step_cache.publish(skip("first"))
    step_cache.publish(RELOADED)
    assert step_cache.read() == RELOADED


def test_publish_replaces_a_symlink_at_the_cache_path_without_writing_through_it(
    step_cache, other_users_file
):
    before = snapshot(other_users_file)
    os.symlink(other_users_file, step_cache.path)
    step_cache.publish(RELOADED)
    assert snapshot(other_users_file) == before
    assert not os.path.islink(step_cache.path)
    assert step_cache.read() == RELOADED


def test_publish_is_not_stopped_by_a_symlink_at_the_old_predictable_temporary_name(
    step_cache, other_users_file
):
    # Until the temporary name was random it was <cache>.<pid>.new: planted, it failed every publish.
    before = snapshot(other_users_file)
    planted = f"{step_cache.path}.{os.getpid()}.new"
    os.symlink(other_users_file, planted)
    step_cache.publish(RELOADED)
    assert step_cache.read() == RELOADED
    assert snapshot(other_users_file) == before
    assert os.readlink(planted) == str(other_users_file)
    assert sorted(os.listdir(os.path.dirname(step_cache.path))) == sorted(
        [os.path.basename(step_cache.path), os.path.basename(planted), other_users_file.name]
    )


def test_publish_temporary_names_differ_each_time(step_cache, monkeypatch):
    """Records the names publish opens: a random name leaves no trace once renamed.

    ``posix.open`` is wrapped (not replaced) to see the names; the files are real.
    """
    seen = []
    real_open = cache.posix.open

    def recording_open(path, *args):
        seen.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(cache.posix, "open", recording_open)
    for _publish in range(3):
        step_cache.publish(RELOADED)
    assert len(set(seen)) == 3
    prefix = step_cache.path + "."
    for name in seen:
        assert name.startswith(prefix)
        assert name.endswith(".new")
        assert len(name[len(prefix) : -len(".new")]) == 16
        int(name[len(prefix) : -len(".new")], 16)


def test_publish_retries_under_a_new_name_when_the_name_is_taken(step_cache, other_users_file, monkeypatch):
    """Random names cannot be planted by a test, so ``posix.urandom`` gives a known sequence
    (the first two names taken by planted links, the third free); the files are real."""
    values = iter([b"\x01" * 8, b"\x02" * 8, b"\x03" * 8])
    monkeypatch.setattr(cache.posix, "urandom", lambda size: next(values))
    before = snapshot(other_users_file)
    for byte in ("01", "02"):
        os.symlink(other_users_file, f"{step_cache.path}.{byte * 8}.new")
    step_cache.publish(RELOADED)
    assert step_cache.read() == RELOADED
    assert snapshot(other_users_file) == before
    assert not os.path.lexists(f"{step_cache.path}.{'03' * 8}.new")


def test_publish_gives_up_after_its_tries_without_writing_through_a_link(
    step_cache, other_users_file, monkeypatch
):
    """``posix.urandom`` always gives one value (random names cannot be planted), and a
    link stands at that name: each try finds it taken."""
    monkeypatch.setattr(cache.posix, "urandom", lambda size: b"\xab" * size)
    before = snapshot(other_users_file)
    os.symlink(other_users_file, f"{step_cache.path}.{'ab' * 8}.new")
    with pytest.raises(FileExistsError, match=f"in {cache.PUBLISH_TRIES} tries"):
        step_cache.publish(RELOADED)
    assert snapshot(other_users_file) == before
    assert not os.path.lexists(step_cache.path)


def test_read_refuses_a_symlink_to_a_file_it_would_otherwise_believe(step_cache, tmp_path):
    believable = tmp_path / "ours"
    write_file(believable, cache.encode(FORGED))
    os.symlink(believable, step_cache.path)
    with pytest.raises(cache.Untrusted, match="cannot be opened"):
        step_cache.read()


def test_read_refuses_a_symlink_to_another_users_file_and_leaves_it_alone(step_cache, other_users_file):
    before = snapshot(other_users_file)
    os.symlink(other_users_file, step_cache.path)
    with pytest.raises(cache.Untrusted):
        step_cache.read()
    assert snapshot(other_users_file) == before


def test_read_refuses_a_file_of_another_uid(step_cache, other_users_file, unprivileged_user):
    os.rename(other_users_file, step_cache.path)
    before = snapshot(step_cache.path)
    with pytest.raises(cache.Untrusted, match=f"belongs to uid {unprivileged_user.uid}"):
        step_cache.read()
    assert snapshot(step_cache.path) == before


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700, 0o4600])
def test_read_refuses_a_file_of_ours_with_another_mode(step_cache, mode):
    write_file(step_cache.path, cache.encode(FORGED), mode)
    with pytest.raises(cache.Untrusted, match=f"has mode {mode:04o}, not 0600"):
        step_cache.read()
    assert stat.S_IMODE(os.lstat(step_cache.path).st_mode) == mode


def test_read_refuses_a_hard_link(step_cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_file(elsewhere, cache.encode(FORGED))
    os.link(elsewhere, step_cache.path)
    with pytest.raises(cache.Untrusted, match="has 2 links"):
        step_cache.read()
    assert snapshot(elsewhere)[:2] == (cache.encode(FORGED), 0o600)


def test_read_refuses_a_directory(step_cache):
    os.mkdir(step_cache.path, 0o700)
    with pytest.raises(cache.Untrusted, match="is not a regular file"):
        step_cache.read()


def test_read_refuses_a_file_of_ours_that_is_not_a_decision(step_cache):
    write_file(step_cache.path, b"export LD_PRELOAD=/tmp/evil.so\n")
    with pytest.raises(cache.Untrusted, match="is not a decision of this version"):
        step_cache.read()


def test_read_refuses_a_fifo_without_waiting_for_a_writer(step_cache, unprivileged_user):
    # Anyone can mkfifo in /tmp, and the file name is predictable. A reader that blocks in
    # open() has no deadline: the task would never start.
    os.mkfifo(step_cache.path, 0o600)
    os.chown(step_cache.path, unprivileged_user.uid, unprivileged_user.gid)
    outcome = []

    def read():
        try:
            outcome.append(step_cache.read())
        except cache.Untrusted as err:
            outcome.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    blocked = reader.is_alive()
    if blocked:  # let the thread go: a writer opening the FIFO ends the reader's open()
        os.close(os.open(step_cache.path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not blocked, "read() blocked in open() on a FIFO at the cache path"
    assert isinstance(outcome[0], cache.Untrusted)


# ------------------------------------------------------------------------ the lock


def test_lock_creates_a_lock_file_of_ours_mode_0600_beside_the_cache(step_cache):
    step_cache.lock(Deadline(30))
    try:
        info = os.lstat(step_cache.path + ".lock")
        assert stat.S_ISREG(info.st_mode)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.getuid())
    finally:
        step_cache.unlock()


def test_lock_is_an_exclusive_flock_released_by_unlock(step_cache):
    step_cache.lock(Deadline(30))
    probe = os.open(step_cache.lock_path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl_flock_nb(probe)
        step_cache.unlock()
        fcntl_flock_nb(probe)
    finally:
        os.close(probe)


def fcntl_flock_nb(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_lock_held_elsewhere_times_out_at_the_deadline(step_cache):
    holder = os.open(step_cache.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl_flock_nb(holder)
        open_fds = len(os.listdir("/proc/self/fd"))
        started = time.monotonic()
        with pytest.raises(cache.LockTimeout, match=f"{step_cache.lock_path} still held after 0.5 s"):
            step_cache.lock(Deadline(0.5))
        waited = time.monotonic() - started
        # It waited for the deadline, not for ever; the failed lock left no descriptor open.
        assert 0.5 <= waited < 30
        assert len(os.listdir("/proc/self/fd")) == open_fds
    finally:
        os.close(holder)


def test_lock_waits_for_the_holder_to_let_go(step_cache):
    holder = os.open(step_cache.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl_flock_nb(holder)
    releaser = threading.Timer(0.3, os.close, (holder,))
    releaser.start()
    try:
        step_cache.lock(Deadline(30))
        # The lock is now this task's: another descriptor cannot take it.
        probe = os.open(step_cache.lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl_flock_nb(probe)
        finally:
            os.close(probe)
            step_cache.unlock()
    finally:
        releaser.join()


def test_lock_refuses_a_symlink_to_another_users_file(step_cache, other_users_file):
    before = snapshot(other_users_file)
    os.symlink(other_users_file, step_cache.lock_path)
    with pytest.raises(cache.Untrusted, match="cannot be opened"):
        step_cache.lock(Deadline(30))
    assert snapshot(other_users_file) == before


def test_lock_creates_nothing_through_a_dangling_symlink(step_cache, tmp_path):
    target = tmp_path / "would-be-created"
    os.symlink(target, step_cache.lock_path)
    with pytest.raises(cache.Untrusted):
        step_cache.lock(Deadline(30))
    assert not target.exists()


def test_lock_refuses_a_lock_file_of_another_uid(step_cache, other_users_file, unprivileged_user):
    os.rename(other_users_file, step_cache.lock_path)
    before = snapshot(step_cache.lock_path)
    with pytest.raises(cache.Untrusted, match=f"belongs to uid {unprivileged_user.uid}"):
        step_cache.lock(Deadline(30))
    assert snapshot(step_cache.lock_path) == before


def test_lock_refuses_a_lock_file_of_ours_with_mode_0644(step_cache):
    write_file(step_cache.lock_path, b"", 0o644)
    with pytest.raises(cache.Untrusted, match="has mode 0644, not 0600"):
        step_cache.lock(Deadline(30))


def test_lock_refuses_a_hard_linked_lock_file(step_cache, tmp_path):
    write_file(tmp_path / "elsewhere", b"")
    os.link(tmp_path / "elsewhere", step_cache.lock_path)
    with pytest.raises(cache.Untrusted, match="has 2 links"):
        step_cache.lock(Deadline(30))


def test_lock_refuses_a_directory(step_cache):
    os.mkdir(step_cache.lock_path, 0o700)
    with pytest.raises(cache.Untrusted, match="cannot be opened"):
        step_cache.lock(Deadline(30))


def test_refused_lock_leaves_no_descriptor_open(step_cache):
    write_file(step_cache.lock_path, b"", 0o644)
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(cache.Untrusted):
        step_cache.lock(Deadline(30))
    assert len(os.listdir("/proc/self/fd")) == open_fds


def test_untrusted_messages_name_the_path(step_cache):
    os.symlink("/nonexistent", step_cache.path)
    with pytest.raises(cache.Untrusted, match=step_cache.path):
        step_cache.read()
