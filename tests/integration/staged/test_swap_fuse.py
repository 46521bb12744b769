"""The directory swap on a real FUSE mount, where RENAME_EXCHANGE fails with EINVAL.

Here nothing stands in for the kernel: the exchange is refused by the filesystem itself, and
the three-rename fallback and its undo run through FUSE's ordinary renames.
"""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import fsutil, swap
from tests.support.trees import make_tree as _tree
from tests.support.trees import tree_state as _state


@pytest.fixture
def fuse_pair(fuse_dir):
    (fuse_dir / "Name").mkdir()
    live = _tree(fuse_dir / "Name" / "1.0", "old")
    staged = _tree(fuse_dir / "Name" / ".1.0.run1", "new")
    return staged, live


def test_the_mount_refuses_rename_exchange_with_einval(fuse_pair):
    # The premise of the tests below: without it they would not exercise the real fallback.
    staged, live = fuse_pair

    with pytest.raises(OSError) as raised:
        fsutil.rename_exchange(staged, live)

    assert raised.value.errno == errno.EINVAL


def test_exchange_on_fuse_falls_back_and_swaps_inodes_and_bytes(fuse_pair):
    staged, live = fuse_pair
    before = {staged: _state(staged), live: _state(live)}
    seen = []

    method = swap.exchange(staged, live, on_step=seen.append)

    assert method == "fallback"
    assert seen == ["exchange", *swap.FALLBACK_STEPS]
    assert _state(live) == before[staged]
    assert _state(staged) == before[live]
    assert not os.path.lexists(swap.hold_path(staged))


@pytest.mark.parametrize("step", [*swap.FALLBACK_STEPS, "sync"])
def test_an_injected_failure_on_fuse_restores_both_names(fuse_pair, step):
    staged, live = fuse_pair
    before = {staged: _state(staged), live: _state(live)}

    with pytest.raises(swap.InjectedFailure) as raised:
        swap.exchange(staged, live, fail_before=step)

    assert raised.value.step == step
    assert _state(live) == before[live]
    assert _state(staged) == before[staged]
    assert sorted(os.listdir(live.parent)) == [".1.0.run1", "1.0"]


def test_a_real_failure_at_step_2_on_fuse_puts_live_back(fuse_dir):
    live = _tree(fuse_dir / "1.0", "old")
    before = _state(live)

    with pytest.raises(FileNotFoundError):
        swap.exchange(fuse_dir / "missing-stage", live)

    assert _state(live) == before
    assert sorted(os.listdir(fuse_dir)) == ["1.0"]


@pytest.mark.parametrize("done", [1, 2])
def test_recover_fallback_on_fuse_restores_the_original_names(fuse_pair, done):
    staged, live = fuse_pair
    before = {staged: _state(staged), live: _state(live)}
    hold = live.parent / (staged.name + ".fallback-old")
    for source, target in [(live, hold), (staged, live)][:done]:
        source.rename(target)

    assert swap.recover_fallback(staged, live) != "nothing"

    assert _state(live) == before[live]
    assert _state(staged) == before[staged]
    assert swap.recover_fallback(staged, live) == "nothing"


def _directory_fsync_errno(path):
    """The errno of a plain ``fsync`` of the directory ``path``, or None when it flushed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        return err.errno
    finally:
        os.close(fd)
    return None


def test_the_mount_flushes_directories_rather_than_refusing_with_einval(fuse_dir):
    # Measured, not assumed: bindfs answers a directory fsync, so fsync_dir's EINVAL rule is
    # exercised for real on procfs and sysfs (test_fsutil) and injected for a swap (test_swap).
    assert _directory_fsync_errno(fuse_dir) is None
    assert fsutil.fsync_dir(fuse_dir) is None


def test_a_durable_replace_on_fuse_replaces_the_file_and_leaves_no_temp_file(fuse_dir):
    (fuse_dir / "journal.json").write_text("old\n")

    with fsutil.durable_replace(fuse_dir / "journal.json", text=True) as stream:
        stream.write("new\n")

    assert (fuse_dir / "journal.json").read_text() == "new\n"
    assert os.listdir(fuse_dir) == ["journal.json"]
