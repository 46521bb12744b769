"""The state-root lock with real processes, real files and the kernel's real lock calls.

Contenders run as separate interpreters (``sys.executable -c CHILD``): flock and POSIX locks
are per process, so only another process can show that a lock excludes. The children do
not get the conftest's import path by themselves; ``_child_env`` passes it on PYTHONPATH.
A child reports on stdout, one line per event, and waits for a line on stdin before it
lets go of what it holds, so the tests order events by messages instead of by sleeping.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import locking

CHILD = r"""
import fcntl, os, sys, time
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import locking

def report(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

def held(path, take):
    fd = os.open(path, os.O_RDWR)
    try:
        take(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return "held"
    finally:
        os.close(fd)
    return "free"

mode, args = sys.argv[1], sys.argv[2:]
if mode == "hold":  # take the StateLock, keep it until stdin has a line
    with locking.StateLock(args[0], 0):
        report("locked %d" % os.getpid())
        if args[1:] == ["close-sidecar"]:  # what the registry exists to prevent
            os.close(os.open(os.path.join(args[0], ".lock.posix"), os.O_RDONLY))
            report("closed a second descriptor of the sidecar")
        sys.stdin.readline()
    report("released")
elif mode == "try":  # StateLock with a timeout: acquired or refused, then exit
    report("trying")
    try:
        with locking.StateLock(args[0], float(args[1])):
            report("acquired")
    except errors.LockError as err:
        report("refused " + str(err))
elif mode in ("flock", "lockf"):  # ONE kind of lock on one file, kept until stdin has a line
    fd = os.open(args[0], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        (fcntl.flock if mode == "flock" else fcntl.lockf)(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        report("refused")
    else:
        report("locked")
        sys.stdin.readline()
    os.close(fd)
elif mode == "probe":  # is each half free for another process right now?
    root = args[0]
    report("flock=%s posix=%s" % (
        held(os.path.join(root, ".lock"), fcntl.flock),
        held(os.path.join(root, ".lock.posix"), fcntl.lockf),
    ))
elif mode == "where":  # which file the child imported
    report(os.path.realpath(locking.__file__))
elif mode == "hammer":  # unprotected read-modify-write of a counter, under the lock
    root, counter, rounds = args[0], args[1], int(args[2])
    for _round in range(rounds):
        with locking.StateLock(root, 120):
            with open(counter) as stream:
                value = int(stream.read())
            time.sleep(0.001)  # widen the window a missing exclusion would show up in
            with open(counter, "w") as stream:
                stream.write(str(value + 1))
    report("done")
"""


def _child_env():
    # .../<root>/ansible_collections/hpcstack/ops/plugins/module_utils/staged_rebuild/locking.py
    root = Path(locking.__file__).parents[6]
    paths = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


@contextlib.contextmanager
def child(*args):
    """A CHILD process; ``proc.stdout.readline()`` reads its reports. Released on exit."""
    command = [sys.executable, "-c", CHILD, *map(str, args)]
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_child_env(),
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.communicate("release\n", timeout=60)


def line(proc):
    return proc.stdout.readline().strip()


def run_child(*args):
    """Run a CHILD mode to its end; returns its output lines."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, args)],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def probe(root):
    return run_child("probe", root)[0]


def release(proc):
    out, _err = proc.communicate("release\n", timeout=60)
    return out.splitlines()


@pytest.fixture
def root(tmp_path):
    state_root = tmp_path / "state"
    state_root.mkdir()
    return state_root


# The child's environment


def test_children_import_the_module_under_review():
    assert run_child("where") == [os.path.realpath(locking.__file__)]


# Taking and releasing


def test_an_uncontended_lock_is_taken_and_records_this_process_as_holder(root):
    with locking.StateLock(root, 0) as lock:
        assert lock.held
        assert (root / ".lock").read_text() == f"{os.getpid()} {os.uname().nodename}\n"
        assert locking.recorded_holder(root) == {"pid": os.getpid(), "host": os.uname().nodename}
        assert probe(root) == "flock=held posix=held"
    assert not lock.held


def test_both_lock_files_are_created_mode_0600(root):
    with locking.StateLock(root, 0):
        pass
    assert (root / ".lock").stat().st_mode & 0o777 == 0o600
    assert (root / ".lock.posix").stat().st_mode & 0o777 == 0o600


def test_after_exit_both_locks_are_free_for_another_process(root):
    with locking.StateLock(root, 0):
        assert probe(root) == "flock=held posix=held"
    assert probe(root) == "flock=free posix=free"
    assert run_child("try", root, 0) == ["trying", "acquired"]


def test_release_clears_the_holder_record(root):
    with locking.StateLock(root, 0):
        assert locking.recorded_holder(root) is not None
    assert (root / ".lock").read_bytes() == b""
    assert locking.recorded_holder(root) is None


@pytest.mark.parametrize("content", ["", "garbage\n", "12x host\n", "1 two words\n"])
def test_recorded_holder_is_none_without_a_well_formed_record(root, content):
    (root / ".lock").write_text(content)
    assert locking.recorded_holder(root) is None


def test_recorded_holder_is_none_for_a_missing_lock_file_a_fifo_or_a_symlink(root, tmp_path):
    assert locking.recorded_holder(root) is None
    os.mkfifo(root / ".lock")  # must not block waiting for a writer
    assert locking.recorded_holder(root) is None
    (root / ".lock").unlink()
    (tmp_path / "elsewhere").write_text("1 node\n")
    (root / ".lock").symlink_to(tmp_path / "elsewhere")
    assert locking.recorded_holder(root) is None


def test_neither_file_is_unlinked_across_acquire_release_cycles(root):
    with locking.StateLock(root, 0):
        inodes = ((root / ".lock").stat().st_ino, (root / ".lock.posix").stat().st_ino)
    for _attempt in range(3):
        with locking.StateLock(root, 0):
            assert ((root / ".lock").stat().st_ino, (root / ".lock.posix").stat().st_ino) == inodes
        assert ((root / ".lock").stat().st_ino, (root / ".lock.posix").stat().st_ino) == inodes
    run_child("try", root, 0)
    assert ((root / ".lock").stat().st_ino, (root / ".lock.posix").stat().st_ino) == inodes


def test_release_when_not_held_does_nothing(root):
    lock = locking.StateLock(root, 0)
    lock.release()
    assert not lock.held
    assert not (root / ".lock").exists()


def test_two_state_roots_are_two_independent_locks(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with locking.StateLock(first, 0) as one, locking.StateLock(second, 0) as two:
        assert one.held
        assert two.held
        assert probe(first) == "flock=held posix=held"
        assert probe(second) == "flock=held posix=held"


# Another process holds the lock


def test_a_second_process_is_refused_at_once_and_told_the_holder_pid(root):
    with child("hold", root) as holder:
        pid = int(line(holder).split()[1])
        with pytest.raises(errors.LockError) as refused:
            locking.StateLock(root, 0).acquire()
    message = str(refused.value)
    assert f"state root {root} is locked by another eb-staged-rebuild run on this node" in message
    assert f"flock on {root}/.lock" in message
    assert f"recorded holder pid {pid} on {os.uname().nodename}" in message
    assert "(waited 0 s; --lock-timeout sets the wait)" in message
    assert "\n" not in message


def test_a_refused_process_holds_nothing_afterwards(root):
    with child("hold", root) as holder:
        line(holder)
        with pytest.raises(errors.LockError):
            locking.StateLock(root, 0).acquire()
        release(holder)
    assert probe(root) == "flock=free posix=free"


def test_a_waiting_process_gets_the_lock_once_the_holder_releases(root):
    with child("hold", root) as holder:
        assert line(holder).startswith("locked")
        with child("try", root, 30) as waiter:
            assert line(waiter) == "trying"
            time.sleep(0.5)
            assert waiter.poll() is None  # still waiting: the holder has not let go
            assert release(holder) == ["released"]
            assert release(waiter) == ["acquired"]


def test_a_wait_that_runs_out_is_refused_and_names_the_timeout(root):
    with child("hold", root) as holder:
        line(holder)
        assert run_child("try", root, 0.3)[1].endswith("(waited 0.3 s; --lock-timeout sets the wait)")


# The two halves: flock on this node, the POSIX lock across nodes


def test_the_sidecar_lock_is_a_posix_record_lock(root):
    # A process on another node takes only the POSIX half; on one kernel that is a process
    # that calls lockf alone. It must be refused while StateLock is held...
    with locking.StateLock(root, 0):
        assert run_child("lockf", root / ".lock.posix") == ["refused"]
    # ...and only because of StateLock.
    assert run_child("lockf", root / ".lock.posix") == ["locked"]


def test_a_posix_only_holder_refuses_the_state_lock_and_is_named_as_such(root):
    (root / ".lock").write_text("4242 othernode\n")
    with child("lockf", root / ".lock.posix") as other_node:
        assert line(other_node) == "locked"
        with pytest.raises(errors.LockError) as refused:
            locking.StateLock(root, 0).acquire()
    message = str(refused.value)
    assert f"through the POSIX lock on {root}/.lock.posix (another node?)" in message
    assert "recorded holder pid 4242 on othernode" in message
    assert "on this node" not in message


def test_a_posix_refusal_releases_the_flock_before_raising(root):
    with child("lockf", root / ".lock.posix") as other_node:
        line(other_node)
        with pytest.raises(errors.LockError, match="through the POSIX lock"):
            locking.StateLock(root, 0).acquire()
        assert probe(root) == "flock=free posix=held"


def test_a_waiter_holding_the_flock_gets_the_posix_half_once_it_is_released(root):
    with child("lockf", root / ".lock.posix") as other_node:
        line(other_node)
        assert run_child("try", root, 0.3)[1].startswith("refused")
        with child("try", root, 30) as waiter:
            assert line(waiter) == "trying"
            time.sleep(0.3)
            assert waiter.poll() is None
            release(other_node)
            assert release(waiter) == ["acquired"]


def test_a_flock_only_publisher_refuses_the_state_lock(root):
    # The 0.2.0 publisher takes the flock on .lock and nothing else, and writes no holder.
    with child("flock", root / ".lock") as old_publisher:
        assert line(old_publisher) == "locked"
        with pytest.raises(errors.LockError) as refused:
            locking.StateLock(root, 0).acquire()
    assert "on this node (flock on" in str(refused.value)
    assert "holder not recorded" in str(refused.value)


def test_a_state_lock_holder_refuses_a_flock_only_publisher(root):
    with locking.StateLock(root, 0):
        assert run_child("flock", root / ".lock") == ["refused"]


# One process, one lock


def test_a_second_state_lock_in_the_same_process_raises_instead_of_waiting(root):
    with locking.StateLock(root, 0):
        # A 30 s timeout: a lock that waited on its own flock would say "another run".
        with pytest.raises(errors.LockError) as refused:
            locking.StateLock(root, 30).acquire()
        assert str(refused.value) == (
            f"state root {root} is already locked by this process (pid {os.getpid()}); "
            "the lock is not re-entrant"
        )


def test_a_refused_second_state_lock_leaves_the_first_intact(root):
    with locking.StateLock(root, 0) as first:
        with pytest.raises(errors.LockError):
            locking.StateLock(root, 0).acquire()
        assert first.held
        assert probe(root) == "flock=held posix=held"
        assert (root / ".lock").read_text().startswith(f"{os.getpid()} ")


def test_another_spelling_of_the_state_root_is_the_same_lock(root, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    with locking.StateLock(root, 0):
        with pytest.raises(errors.LockError, match="already locked by this process"):
            locking.StateLock(alias, 0).acquire()
        with pytest.raises(errors.LockError, match="already locked by this process"):
            locking.StateLock(f"{root}/../state/.", 0).acquire()
        assert probe(root) == "flock=held posix=held"


def test_acquiring_the_same_object_twice_raises(root):
    lock = locking.StateLock(root, 0)
    with lock:
        with pytest.raises(errors.LockError, match="not re-entrant"):
            lock.acquire()
        assert lock.held


# The hazard: a second descriptor of the sidecar


def test_closing_a_second_descriptor_of_the_sidecar_would_drop_the_posix_lock(root):
    # Why the registry exists: a holder that opens and closes the sidecar once more loses the
    # record lock (while keeping the flock), and another node could then take it.
    with child("hold", root, "close-sidecar") as holder:
        assert line(holder).startswith("locked")
        assert line(holder) == "closed a second descriptor of the sidecar"
        assert probe(root) == "flock=held posix=free"


def test_refuse_held_sidecar_refuses_the_sidecar_by_any_name(root, tmp_path):
    with locking.StateLock(root, 0):
        os.link(root / ".lock.posix", tmp_path / "hard")
        (tmp_path / "soft").symlink_to(root / ".lock.posix")
        for name in (root / ".lock.posix", tmp_path / "hard", tmp_path / "soft"):
            with pytest.raises(errors.LockError) as refused:
                locking.refuse_held_sidecar(name)
            assert str(refused.value) == (
                f"{name} is the lock sidecar {root}/.lock.posix held by this process; "
                "closing a second descriptor of it would drop the lock"
            )
        assert probe(root) == "flock=held posix=held"
        os.unlink(tmp_path / "hard")


def test_refuse_held_sidecar_lets_other_files_pass(root):
    (root / "journal.json").write_text("{}")
    with locking.StateLock(root, 0):
        for name in (root / ".lock", root / "journal.json", root / "missing", root):
            locking.refuse_held_sidecar(name)
        assert probe(root) == "flock=held posix=held"


def test_refuse_held_sidecar_lets_the_sidecar_pass_once_released(root):
    with locking.StateLock(root, 0):
        pass
    locking.refuse_held_sidecar(root / ".lock.posix")
    assert probe(root) == "flock=free posix=free"


# Symbolic links and odd files at the lock names


@pytest.mark.parametrize("name", [".lock", ".lock.posix"])
def test_a_symlink_at_a_lock_name_is_refused_and_nothing_is_created_through_it(root, tmp_path, name):
    target = tmp_path / "target"
    (root / name).symlink_to(target)
    with pytest.raises(errors.UsageError) as refused:
        locking.StateLock(root, 0).acquire()
    assert str(refused.value) == f"lock file {root}/{name} is a symbolic link; refusing to follow it"
    assert not target.exists()
    assert (root / name).is_symlink()


def test_a_symlink_at_the_sidecar_leaves_the_flock_free(root, tmp_path):
    (root / ".lock.posix").symlink_to(tmp_path / "target")
    with pytest.raises(errors.UsageError):
        locking.StateLock(root, 0).acquire()
    assert run_child("flock", root / ".lock") == ["locked"]
    (root / ".lock.posix").unlink()
    with locking.StateLock(root, 0) as lock:
        assert lock.held


def test_a_symlink_to_an_existing_file_is_refused_and_the_file_is_untouched(root, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (root / ".lock").symlink_to(target)
    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        locking.StateLock(root, 0).acquire()
    assert target.read_text() == "keep me\n"


def test_a_hard_linked_lock_file_is_refused_and_its_other_name_is_untouched(root, tmp_path):
    other = tmp_path / "other"
    other.write_text("keep me\n")
    os.link(other, root / ".lock")
    with pytest.raises(errors.UsageError) as refused:
        locking.StateLock(root, 0).acquire()
    assert str(refused.value) == f"lock file {root}/.lock has 2 hard links; a lock file must have one name"
    assert other.read_text() == "keep me\n"
    assert not (root / ".lock.posix").exists()


def test_a_fifo_at_the_sidecar_is_refused_as_not_a_regular_file(root):
    os.mkfifo(root / ".lock.posix")
    with pytest.raises(errors.UsageError, match=r"\.lock\.posix is not a regular file"):
        locking.StateLock(root, 0).acquire()
    assert run_child("flock", root / ".lock") == ["locked"]


def test_a_directory_at_the_lock_name_is_a_lock_error_naming_it(root):
    (root / ".lock").mkdir()
    with pytest.raises(errors.LockError) as refused:
        locking.StateLock(root, 0).acquire()
    assert str(refused.value) == f"cannot open lock file {root}/.lock: Is a directory"


def test_a_missing_state_root_is_a_usage_error_and_nothing_is_created(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(errors.UsageError) as refused:
        locking.StateLock(missing, 0).acquire()
    assert str(refused.value) == f"state root {missing} does not exist"
    assert not missing.exists()


# Children


def test_an_exec_child_does_not_inherit_the_lock_descriptors(root):
    # close_fds=False: only O_CLOEXEC keeps the descriptors out of this child.
    with locking.StateLock(root, 0), subprocess.Popen(["sleep", "5"], close_fds=False) as sleeper:
        try:
            fd_dir = Path(f"/proc/{sleeper.pid}/fd")
            # Wait until the child has exec'd: before that it is a copy of this process.
            while os.readlink(f"/proc/{sleeper.pid}/exe") == os.readlink("/proc/self/exe"):
                time.sleep(0.01)
            opened = {os.readlink(fd) for fd in fd_dir.iterdir()}
            assert str(root / ".lock") not in opened
            assert str(root / ".lock.posix") not in opened
        finally:
            sleeper.kill()


def test_a_child_started_while_locked_does_not_keep_the_lock_alive(root):
    with locking.StateLock(root, 0):
        sleeper = subprocess.Popen(["sleep", "5"], close_fds=False)
    try:
        assert sleeper.poll() is None
        assert probe(root) == "flock=free posix=free"
        assert run_child("try", root, 0) == ["trying", "acquired"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_forked_child_closes_its_copies_and_leaves_the_parent_locked(root):
    lock_path, sidecar_path = str(root / ".lock"), str(root / ".lock.posix")
    with locking.StateLock(root, 0) as lock:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                fds = os.listdir("/proc/self/fd")
                opened = {
                    os.readlink(f"/proc/self/fd/{fd}") for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")
                }
                lock.release()  # must not unlock the parent's flock
                code = 0 if not lock.held and not {lock_path, sidecar_path} & opened else 3
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock.held
        assert probe(root) == "flock=held posix=held"
    assert probe(root) == "flock=free posix=free"


def test_a_forked_child_can_wait_for_the_lock_like_any_other_process(root):
    with locking.StateLock(root, 0):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                try:
                    locking.StateLock(root, 0).acquire()
                except errors.LockError as err:
                    code = 0 if "another eb-staged-rebuild run on this node" in str(err) else 4
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert probe(root) == "flock=held posix=held"


# Mutual exclusion under load


def test_eight_processes_incrementing_a_counter_under_the_lock_lose_no_update(root, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    rounds = 25
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(child("hammer", root, counter, rounds)) for _worker in range(8)]
        outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert outputs == ["done\n"] * 8
    assert counter.read_text() == str(8 * rounds)
    assert probe(root) == "flock=free posix=free"
