"""The directory swap: exchange, the three-rename fallback, its restoring undo, and recovery.

Every test builds a live tree ("old") and a staged tree ("new"), each with a PAYLOAD file,
and compares inodes and bytes: a swap must move the trees themselves, and a failed swap must
leave each name on its original inode.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil, swap
from tests.support.injected import directory_fsync_fails_with
from tests.support.trees import make_tree as _tree
from tests.support.trees import tree_state as _state


@pytest.fixture
def pair(tmp_path):
    """A live tree and its staged replacement, siblings as in software/<Name>/."""
    live = _tree(tmp_path / "1.0", "old")
    staged = _tree(tmp_path / ".1.0.run1", "new")
    return staged, live


def _unsupported(err):
    """An ``exchange_fn`` that fails like a kernel or filesystem without RENAME_EXCHANGE."""

    def refuse(staged, live):
        raise OSError(err, os.strerror(err), staged, None, live)

    return refuse


def _hold(staged):
    return staged.parent / (staged.name + ".fallback-old")


def _assert_swapped(staged, live, before):
    assert _state(live) == before[staged]
    assert _state(staged) == before[live]
    assert _state(_hold(staged)) is None


def _assert_original(staged, live, before):
    assert _state(live) == before[live]
    assert _state(staged) == before[staged]
    assert _state(_hold(staged)) is None


# hold_path


def test_hold_path_is_the_staged_name_with_a_fallback_suffix(tmp_path):
    assert swap.hold_path(tmp_path / ".1.0.run1") == f"{tmp_path}/.1.0.run1.fallback-old"


def test_hold_path_ignores_a_trailing_slash():
    assert swap.hold_path("/sw/Name/.1.0.run1/") == "/sw/Name/.1.0.run1.fallback-old"


def test_fallback_errnos_are_the_three_the_design_names():
    named = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}

    assert named == swap.FALLBACK_ERRNOS


# exchange: the renameat2 path


def test_exchange_gives_live_the_new_inode_and_the_new_bytes(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    method = swap.exchange(staged, live)

    assert method == "exchange"
    _assert_swapped(staged, live, before)
    assert _state(live) != before[live]


def test_exchange_announces_the_exchange_step_before_it_runs(pair):
    staged, live = pair
    seen = []

    def journal(step):
        # The step is announced while the names are still the original ones.
        seen.append((step, _state(live)[1]))

    swap.exchange(staged, live, on_step=journal)

    assert seen == [("exchange", "old")]


def test_exchange_accepts_string_paths(pair):
    staged, live = pair

    assert swap.exchange(str(staged), str(live)) == "exchange"
    assert (live / "PAYLOAD").read_text() == "new"


def test_an_injected_failure_before_the_exchange_moves_nothing(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    calls = []

    with pytest.raises(swap.InjectedFailure) as raised:
        swap.exchange(staged, live, fail_before="exchange", exchange_fn=lambda *paths: calls.append(paths))

    assert raised.value.errno == errno.EIO
    assert raised.value.step == "exchange"
    assert calls == []
    _assert_original(staged, live, before)


def test_a_non_fallback_errno_across_filesystems_moves_nothing(tmp_path):
    # /dev/shm is a tmpfs; renameat2 across mounts fails with EXDEV, which no fallback fixes.
    live = _tree(tmp_path / "1.0", "old")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other_fs:
        staged = _tree(Path(other_fs) / "stage", "new")
        before = {staged: _state(staged), live: _state(live)}
        seen = []

        with pytest.raises(OSError) as raised:
            swap.exchange(staged, live, on_step=seen.append)

        assert raised.value.errno == errno.EXDEV
        assert seen == ["exchange"]
        _assert_original(staged, live, before)


@pytest.mark.parametrize("err", [errno.EPERM, errno.EIO, errno.EXDEV])
def test_an_exchange_errno_outside_the_fallback_set_is_raised_as_is(pair, err):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    seen = []

    with pytest.raises(OSError) as raised:
        swap.exchange(staged, live, on_step=seen.append, exchange_fn=_unsupported(err))

    assert raised.value.errno == err
    assert seen == ["exchange"]
    _assert_original(staged, live, before)


def test_exchange_with_a_missing_stage_raises_enoent_and_moves_nothing(tmp_path):
    live = _tree(tmp_path / "1.0", "old")
    before = _state(live)

    with pytest.raises(FileNotFoundError):
        swap.exchange(tmp_path / "missing", live)

    assert _state(live) == before
    assert not (tmp_path / "missing").exists()


def test_an_injected_sync_failure_after_an_exchange_swaps_back(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    seen = []

    with pytest.raises(swap.InjectedFailure) as raised:
        swap.exchange(staged, live, on_step=seen.append, fail_before="sync")

    assert raised.value.step == "sync"
    assert seen == ["exchange"]
    _assert_original(staged, live, before)


def test_a_sync_failure_whose_swap_back_fails_raises_restore_error(pair):
    staged, live = pair
    calls = []

    def exchange_once(a, b):
        # The second call is the swap back; refuse it as a filesystem that just went away would.
        calls.append((a, b))
        if len(calls) > 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO), a, None, b)
        fsutil.rename_exchange(a, b)

    with pytest.raises(swap.RestoreError) as raised:
        swap.exchange(staged, live, fail_before="sync", exchange_fn=exchange_once)

    assert isinstance(raised.value, errors.PublishError)
    assert raised.value.__cause__.step == "sync"
    assert "could not be undone" in str(raised.value)
    assert (live / "PAYLOAD").read_text() == "new"


# exchange: the three-rename fallback


@pytest.mark.parametrize("err", sorted(swap.FALLBACK_ERRNOS), ids=errno.errorcode.get)
def test_a_fallback_errno_takes_the_three_renames_and_swaps(pair, err):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    seen = []

    method = swap.exchange(staged, live, on_step=seen.append, exchange_fn=_unsupported(err))

    assert method == "fallback"
    assert seen == ["exchange", *swap.FALLBACK_STEPS]
    _assert_swapped(staged, live, before)


def test_the_fallback_ends_in_the_state_the_exchange_reaches(tmp_path):
    ends = {}
    for how, exchange_fn in (("exchange", None), ("fallback", _unsupported(errno.ENOSYS))):
        root = tmp_path / how
        root.mkdir()
        staged, live = _tree(root / "stage", "new"), _tree(root / "live", "old")
        before = {staged: _state(staged), live: _state(live)}
        assert swap.exchange(staged, live, exchange_fn=exchange_fn) == how
        ends[how] = (
            _state(live) == before[staged],
            _state(staged) == before[live],
            sorted(os.listdir(root)),
        )

    assert ends["exchange"] == ends["fallback"] == (True, True, ["live", "stage"])


def test_the_fallback_steps_are_announced_before_each_rename(pair):
    staged, live = pair
    names = []

    def journal(step):
        names.append((step, sorted(path.name for path in staged.parent.iterdir())))

    swap.exchange(staged, live, on_step=journal, exchange_fn=_unsupported(errno.EOPNOTSUPP))

    assert names == [
        ("exchange", [".1.0.run1", "1.0"]),
        ("fallback-1-live-to-hold", [".1.0.run1", "1.0"]),
        ("fallback-2-staged-to-live", [".1.0.run1", ".1.0.run1.fallback-old"]),
        ("fallback-3-hold-to-staged", [".1.0.run1.fallback-old", "1.0"]),
    ]


@pytest.mark.parametrize("step", swap.FALLBACK_STEPS)
def test_an_injected_failure_before_each_fallback_step_restores_both_names(pair, step):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    with pytest.raises(swap.InjectedFailure) as raised:
        swap.exchange(staged, live, fail_before=step, exchange_fn=_unsupported(errno.ENOSYS))

    assert raised.value.step == step
    assert raised.value.errno == errno.EIO
    _assert_original(staged, live, before)


@pytest.mark.parametrize("step", swap.FALLBACK_STEPS)
def test_a_callable_fail_before_injects_at_the_step_it_selects(pair, step):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    asked = []

    def fail_here(name):
        asked.append(name)
        return name == step

    with pytest.raises(swap.InjectedFailure):
        swap.exchange(staged, live, fail_before=fail_here, exchange_fn=_unsupported(errno.EINVAL))

    assert asked[-1] == step
    _assert_original(staged, live, before)


def test_an_exception_raised_by_a_callable_fail_before_is_the_steps_failure(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    def fail_here(name):
        if name == "fallback-3-hold-to-staged":
            raise PermissionError(errno.EACCES, "refused by the test")
        return False

    with pytest.raises(PermissionError, match="refused by the test"):
        swap.exchange(staged, live, fail_before=fail_here, exchange_fn=_unsupported(errno.ENOSYS))

    _assert_original(staged, live, before)


@pytest.mark.parametrize("step", swap.FALLBACK_STEPS)
def test_a_failing_journal_write_before_a_fallback_step_restores_both_names(pair, step):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    def journal(name):
        if name == step:
            raise errors.JournalError("cannot write journal")

    with pytest.raises(errors.JournalError, match="cannot write journal"):
        swap.exchange(staged, live, on_step=journal, exchange_fn=_unsupported(errno.ENOSYS))

    _assert_original(staged, live, before)


def test_a_real_failure_at_step_1_moves_nothing_and_reraises(tmp_path):
    staged = _tree(tmp_path / "stage", "new")
    before = _state(staged)

    with pytest.raises(FileNotFoundError) as raised:
        swap.exchange(staged, tmp_path / "missing-live", exchange_fn=_unsupported(errno.ENOSYS))

    assert raised.value.filename == str(tmp_path / "missing-live")
    assert _state(staged) == before
    assert sorted(os.listdir(tmp_path)) == ["stage"]


def test_a_real_failure_at_step_2_puts_live_back_and_reraises(tmp_path):
    live = _tree(tmp_path / "1.0", "old")
    before = _state(live)
    seen = []

    with pytest.raises(FileNotFoundError) as raised:
        swap.exchange(
            tmp_path / "missing-stage", live, on_step=seen.append, exchange_fn=_unsupported(errno.ENOSYS)
        )

    assert raised.value.filename == str(tmp_path / "missing-stage")
    assert seen == ["exchange", "fallback-1-live-to-hold", "fallback-2-staged-to-live"]
    assert _state(live) == before
    assert sorted(os.listdir(tmp_path)) == ["1.0"]


def test_a_real_failure_at_step_2_from_a_vanished_stage_puts_live_back(pair):
    staged, live = pair
    before_live = _state(live)

    def journal(step):
        if step == "fallback-2-staged-to-live":
            staged.rename(staged.parent / "moved-away")

    with pytest.raises(FileNotFoundError):
        swap.exchange(staged, live, on_step=journal, exchange_fn=_unsupported(errno.ENOSYS))

    assert _state(live) == before_live
    assert not _hold(staged).exists()
    assert (staged.parent / "moved-away" / "PAYLOAD").read_text() == "new"


def test_the_fallback_refuses_to_start_over_an_existing_hold(pair):
    # An empty directory at the hold name would be silently replaced by step 1's rename.
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    _hold(staged).mkdir()

    with pytest.raises(errors.PublishError, match=r"fallback-old exists from an interrupted swap"):
        swap.exchange(staged, live, exchange_fn=_unsupported(errno.ENOSYS))

    assert _state(live) == before[live]
    assert _state(staged) == before[staged]
    assert os.listdir(_hold(staged)) == []


def test_a_failed_undo_raises_restore_error_and_recovery_refuses_the_mixed_state(pair):
    staged, live = pair

    def intrude(step):
        # Before step 3 someone puts a non-empty directory at the staged name: step 3
        # (hold -> staged) fails with ENOTEMPTY, and so does undoing step 2 (live -> staged).
        if step == "fallback-3-hold-to-staged":
            _tree(staged, "intruder")

    with pytest.raises(swap.RestoreError, match="could not be undone") as raised:
        swap.exchange(staged, live, on_step=intrude, exchange_fn=_unsupported(errno.ENOSYS))

    assert raised.value.__cause__.errno in (errno.ENOTEMPTY, errno.EEXIST)
    assert raised.value.__cause__.__context__.errno in (errno.ENOTEMPTY, errno.EEXIST)
    assert (live / "PAYLOAD").read_text() == "new"
    assert (_hold(staged) / "PAYLOAD").read_text() == "old"
    with pytest.raises(errors.PublishError, match="cannot explain the swap state"):
        swap.recover_fallback(staged, live)
    assert (staged / "PAYLOAD").read_text() == "intruder"


def test_an_injected_sync_failure_after_the_fallback_swaps_back(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    seen = []

    with pytest.raises(swap.InjectedFailure):
        swap.exchange(
            staged, live, on_step=seen.append, fail_before="sync", exchange_fn=_unsupported(errno.ENOSYS)
        )

    assert seen == ["exchange", *swap.FALLBACK_STEPS]
    _assert_original(staged, live, before)


# a filesystem that does not sync directories


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
def test_a_finished_swap_stands_where_the_filesystem_cannot_sync_directories(pair, monkeypatch, fallback):
    """Injected EINVAL: the filesystems that answer it for real (procfs, sysfs; see test_fsutil)
    cannot hold the directories of a swap, and every one that can here (tmpfs, ext4, overlay,
    bindfs) flushes directories."""
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    directory_fsync_fails_with(monkeypatch, errno.EINVAL)
    exchange_fn = _unsupported(errno.EINVAL) if fallback else None

    method = swap.exchange(staged, live, exchange_fn=exchange_fn)

    assert method == ("fallback" if fallback else "exchange")
    assert _state(live) == before[staged]
    assert _state(staged) == before[live]
    assert _state(_hold(staged)) is None


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
def test_a_directory_fsync_that_fails_with_eio_still_swaps_back(pair, monkeypatch, fallback):
    """Injected EIO: a failing disk cannot be produced here."""
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    directory_fsync_fails_with(monkeypatch, errno.EIO)
    exchange_fn = _unsupported(errno.EINVAL) if fallback else None

    with pytest.raises(OSError) as raised:
        swap.exchange(staged, live, exchange_fn=exchange_fn)

    assert raised.value.errno == errno.EIO
    _assert_original(staged, live, before)


# recover_fallback


def _renames(staged, live):
    hold = _hold(staged)
    return [(live, hold), (staged, live), (hold, staged)]


@pytest.mark.parametrize(
    ("done", "expected"),
    [(1, "hold-to-live"), (2, "live-to-staged,hold-to-live")],
)
def test_recover_fallback_after_a_crash_restores_the_original_names(pair, done, expected):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    for source, target in _renames(staged, live)[:done]:
        source.rename(target)

    assert swap.recover_fallback(staged, live) == expected

    _assert_original(staged, live, before)


@pytest.mark.parametrize("done", [1, 2])
def test_recover_fallback_is_idempotent(pair, done):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    for source, target in _renames(staged, live)[:done]:
        source.rename(target)
    swap.recover_fallback(staged, live)

    assert swap.recover_fallback(staged, live) == "nothing"

    _assert_original(staged, live, before)


def test_recover_fallback_before_any_rename_does_nothing(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    assert swap.recover_fallback(staged, live) == "nothing"

    _assert_original(staged, live, before)


def test_recover_fallback_after_a_completed_swap_does_nothing(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    for source, target in _renames(staged, live):
        source.rename(target)

    assert swap.recover_fallback(staged, live) == "nothing"

    _assert_swapped(staged, live, before)


def test_recover_fallback_after_the_retired_tree_was_collected_does_nothing(pair):
    staged, live = pair
    swap.exchange(staged, live)
    (staged / "PAYLOAD").unlink()
    staged.rmdir()

    assert swap.recover_fallback(staged, live) == "nothing"
    assert (live / "PAYLOAD").read_text() == "new"


def test_recover_fallback_finishes_a_recovery_that_itself_was_interrupted(pair):
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}
    live.rename(_hold(staged))
    staged.rename(live)
    live.rename(staged)  # the first of the two recovery renames, then a crash

    assert swap.recover_fallback(staged, live) == "hold-to-live"

    _assert_original(staged, live, before)


@pytest.mark.parametrize("step", swap.FALLBACK_STEPS)
def test_a_process_killed_before_a_fallback_step_is_repaired_by_recover_fallback(pair, step):
    # A real crash: the child dies inside on_step, so no in-process undo can run.
    staged, live = pair
    before = {staged: _state(staged), live: _state(live)}

    def die_at(name):
        if name == step:
            os._exit(9)

    pid = os.fork()
    if pid == 0:
        try:
            swap.exchange(staged, live, on_step=die_at, exchange_fn=_unsupported(errno.ENOSYS))
        finally:
            os._exit(1)
    _pid, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 9
    swap.recover_fallback(staged, live)
    _assert_original(staged, live, before)
    assert swap.recover_fallback(staged, live) == "nothing"


def test_recover_fallback_refuses_when_no_name_exists(tmp_path):
    with pytest.raises(errors.PublishError, match=r"^cannot explain the swap state of .*: live missing"):
        swap.recover_fallback(tmp_path / "stage", tmp_path / "live")


def test_recover_fallback_refuses_a_hold_alone_and_moves_nothing(pair):
    staged, live = pair
    live.rename(_hold(staged))
    staged.rename(staged.parent / "elsewhere")

    with pytest.raises(errors.PublishError, match=r"hold .* exists"):
        swap.recover_fallback(staged, live)

    assert (_hold(staged) / "PAYLOAD").read_text() == "old"
    assert not live.exists()


def test_recover_fallback_refuses_a_missing_live_without_a_hold(pair):
    staged, live = pair
    live.rename(live.parent / "elsewhere")

    with pytest.raises(errors.PublishError, match="live missing"):
        swap.recover_fallback(staged, live)

    assert (staged / "PAYLOAD").read_text() == "new"


def test_recover_fallback_refuses_all_three_names_at_once(pair):
    staged, live = pair
    _tree(_hold(staged), "third")

    with pytest.raises(errors.PublishError, match="cannot explain"):
        swap.recover_fallback(staged, live)

    assert [(path / "PAYLOAD").read_text() for path in (live, staged, _hold(staged))] == [
        "old",
        "new",
        "third",
    ]


def test_recover_fallback_refuses_a_hold_that_is_a_symlink(pair):
    staged, live = pair
    live.rename(staged.parent / "real")
    _hold(staged).symlink_to("real")

    with pytest.raises(
        errors.PublishError, match=r"fallback-old is not a directory \(or is a symbolic link\)"
    ):
        swap.recover_fallback(staged, live)

    assert not live.exists()
    assert os.readlink(_hold(staged)) == "real"


def test_recover_fallback_refuses_a_live_name_that_is_a_file(pair):
    staged, live = pair
    (live / "PAYLOAD").unlink()
    live.rmdir()
    live.write_text("not a tree")

    with pytest.raises(errors.PublishError, match="is not a directory"):
        swap.recover_fallback(staged, live)

    assert live.read_text() == "not a tree"
