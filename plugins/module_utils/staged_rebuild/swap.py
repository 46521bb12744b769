# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The directory swap of the publish step: the staged tree takes the live name, and back.

``exchange(stage, stable_path)`` first asks the kernel for ``renameat2(RENAME_EXCHANGE)``,
which swaps both names in one step: at no moment is the stable path missing. Where the
filesystem cannot (``EINVAL`` on FUSE and some shared filesystems, ``ENOSYS`` on an old
kernel, ``EOPNOTSUPP``) it falls back to three ordinary renames through the hold name
``<stage>.fallback-old``:

1. ``fallback-1-live-to-hold``: live -> hold (from here until step 2 the live name is missing);
2. ``fallback-2-staged-to-live``: stage -> live;
3. ``fallback-3-hold-to-staged``: hold -> stage.

Either way the stage name ends up holding the old tree, which is then the retired path.

A caught error at any step, real or injected, renames the completed steps back in reverse
order and raises the error again: the caller sees the two original names, with their
original inodes. A process that dies between fallback renames cannot do that, so the names
alone must tell what happened: ``recover_fallback`` reads which of live, stage and hold
exist and restores the original names. It is the first thing resume runs.

``on_step(step)`` is called before each operation so that the caller can journal the step
first. ``fail_before`` injects a failure before a step for the crash-matrix tests, and
``exchange_fn`` replaces ``fsutil.rename_exchange`` so that tests can take the fallback on a
filesystem that can exchange.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from functools import partial

from ..common import errors
from . import fsutil
from .faults import InjectedFailure

FALLBACK_ERRNOS = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})

STEP_EXCHANGE = "exchange"
STEP_LIVE_TO_HOLD = "fallback-1-live-to-hold"
STEP_STAGED_TO_LIVE = "fallback-2-staged-to-live"
STEP_HOLD_TO_STAGED = "fallback-3-hold-to-staged"
FALLBACK_STEPS = (STEP_LIVE_TO_HOLD, STEP_STAGED_TO_LIVE, STEP_HOLD_TO_STAGED)
# Not announced through on_step (no name moves), but a point where fail_before can inject.
STEP_SYNC = "sync"

METHOD_EXCHANGE = "exchange"
METHOD_FALLBACK = "fallback"

RECOVERED_NOTHING = "nothing"
RECOVERED_AFTER_STEP_1 = "hold-to-live"
RECOVERED_AFTER_STEP_2 = "live-to-staged,hold-to-live"


class RestoreError(errors.PublishError):
    """A failed swap could not put the original names back.

    Unlike its parent, this one means the names are NOT as they were: a transaction that
    sees it must stop reversing other work and leave the state to resume, which runs
    ``recover_fallback`` (for a hold name left behind) and then returns a swapped live path.
    """


def hold_path(staged):
    """The name that holds the live tree between fallback steps 1 and 3."""
    return os.fspath(staged).rstrip("/") + ".fallback-old"


class _Steps:
    """Announces each step to ``on_step`` and injects the failure ``fail_before`` asks for."""

    def __init__(self, on_step, fail_before):
        self.on_step = on_step
        self.fail_before = fail_before

    def before(self, step, path, announce=True):
        if announce and self.on_step is not None:
            self.on_step(step)
        fail = self.fail_before
        if fail is not None and (fail(step) if callable(fail) else fail == step):
            raise InjectedFailure(step, os.fspath(path))


@contextlib.contextmanager
def _names(staged, live, root):
    """The swap's names, each in its directory held by descriptor (``fsutil.Directory``).

    Every rename of the swap is made in those descriptors, by name: a parent swapped for a
    link after it was opened cannot take a rename into another tree. In a run the two are
    siblings, one directory opened once."""
    staged, live = os.path.abspath(staged), os.path.abspath(live)
    with contextlib.ExitStack() as stack:
        staged_dir = stack.enter_context(fsutil.Directory.open(os.path.dirname(staged), root))
        if os.path.dirname(staged) == os.path.dirname(live):
            live_dir = staged_dir
        else:
            live_dir = stack.enter_context(fsutil.Directory.open(os.path.dirname(live), root))
        yield _Names(staged_dir, live_dir, staged, live)


def exchange(staged, live, on_step=None, fail_before=None, exchange_fn=None, *, root=None):
    """Swap the names ``staged`` and ``live``; return ``"exchange"`` or ``"fallback"``.

    On return, ``live`` names the tree that was staged, ``staged`` names the old live tree,
    and both renames are durable (the parent directories were fsynced). On an error nothing
    has moved, or everything that moved was moved back, and the error is raised:

    * ``exchange_fn`` (default ``fsutil.rename_exchange``) failing with an errno outside
      ``FALLBACK_ERRNOS`` (``EXDEV``, ``ENOENT``, ...) is raised as is;
    * a fallback step failing, or ``on_step`` raising (a journal write), undoes the completed
      fallback renames in reverse and raises the original error;
    * a failed fsync after the swap swaps back before raising (a filesystem that does not
      sync directories at all is not a failure: see ``fsutil.fsync_dir``);
    * if moving back fails too, ``RestoreError`` is raised, its cause the failed move back
      and that one's context the original error.

    The fallback refuses to start (``PublishError``) when the hold name already exists: it
    is a previous crash's state for ``recover_fallback``, and a rename onto an empty
    directory there would silently replace it.

    ``on_step(step)`` runs before each of ``STEP_EXCHANGE`` and the three ``FALLBACK_STEPS``
    (not before the fsync, which moves no name).

    ``fail_before`` is the failure-injection hook of the tests: None, a step name (one of the
    four above or ``STEP_SYNC``), or a callable taking each step name, whose true result
    injects at that step and whose exception is used as that step's failure. The injected
    error is ``InjectedFailure`` (an ``OSError``, ``EIO``), raised after ``on_step``: it
    stands for the operation failing after the caller journaled it, and takes the same
    path as a real failure. ``exchange_fn(staged, live)`` replaces ``fsutil.rename_exchange``
    so that a test can make it fail with a fallback errno on a filesystem that can exchange.
    """
    staged, live = os.fspath(staged), os.fspath(live)
    steps = _Steps(on_step, fail_before)
    with _names(staged, live, root) as names:
        swap_names = names.exchange if exchange_fn is None else partial(exchange_fn, staged, live)
        steps.before(STEP_EXCHANGE, staged)
        try:
            swap_names()
        except OSError as err:
            if err.errno not in FALLBACK_ERRNOS:
                raise
            _fallback(names, steps)
            return METHOD_FALLBACK
        _durable(names, steps, swap_names)
    return METHOD_EXCHANGE


class _Names:
    """The names ``live``, ``staged`` and ``hold`` (beside ``staged``), each as (directory,
    name), and their full paths for messages."""

    def __init__(self, staged_dir, live_dir, staged, live):
        self.staged_path, self.live_path = staged, live
        self.at = {
            "staged": (staged_dir, os.path.basename(staged)),
            "live": (live_dir, os.path.basename(live)),
            "hold": (staged_dir, os.path.basename(hold_path(staged))),
        }

    def path(self, key):
        directory, name = self.at[key]
        return directory.join(name)

    def exists(self, key):
        """``True`` for a real directory, ``False`` for nothing there; refuse anything else."""
        directory, name = self.at[key]
        info = directory.lstat(name)
        if info is None:
            return False
        if not stat.S_ISDIR(info.st_mode):
            raise errors.PublishError(
                f"{directory.join(name)} is not a directory (or is a symbolic link); refusing to recover it"
            )
        return True

    def rename(self, source, target):
        (source_dir, source_name), (target_dir, target_name) = self.at[source], self.at[target]
        try:
            source_dir.rename(source_name, target_dir, target_name)
        except OSError as err:
            raise OSError(err.errno, err.strerror, self.path(source), None, self.path(target)) from None

    def exchange(self):
        (staged_dir, staged_name), (live_dir, live_name) = self.at["staged"], self.at["live"]
        staged_dir.exchange(staged_name, live_name, live_dir)

    def sync(self):
        for directory in {id(d): d for d, _name in self.at.values()}.values():
            directory.sync()


def _durable(names, steps, undo):
    """fsync the parents after a completed swap; if that fails, ``undo`` it and raise.

    The swap is only as good as its durability: the journal written next says it happened."""
    try:
        steps.before(STEP_SYNC, names.live_path, announce=False)
        names.sync()
    except BaseException as err:
        try:
            undo()
        except OSError as undo_err:
            raise _restore_error(names, undo_err) from err
        raise


def _fallback(names, steps):
    if names.exists("hold"):
        raise errors.PublishError(
            f"{names.path('hold')} exists from an interrupted swap of {names.live_path}; "
            "resume must recover it first"
        )
    plan = (
        (STEP_LIVE_TO_HOLD, "live", "hold"),
        (STEP_STAGED_TO_LIVE, "staged", "live"),
        (STEP_HOLD_TO_STAGED, "hold", "staged"),
    )
    done = []
    try:
        for step, source, target in plan:
            steps.before(step, names.path(source))
            names.rename(source, target)
            done.append((source, target))
    except BaseException:
        # BaseException: an interrupt (a signal turned into an exception) must not leave the
        # live name missing either.
        _undo(names, done)
        raise
    _durable(names, steps, lambda: _undo(names, done))


def _undo(names, done):
    """Rename the completed steps back, last first; ``RestoreError`` if one cannot be."""
    for source, target in reversed(done):
        try:
            names.rename(target, source)
        except OSError as err:
            raise _restore_error(names, err) from err


def _restore_error(names, err):
    return RestoreError(
        f"swap of {names.staged_path} and {names.live_path} failed and could not be undone"
        f" ({err.strerror}: {err.filename}); resume recovers the names"
    )


def recover_fallback(staged, live, *, root=None):
    """Put back the names an interrupted fallback swap left; return what was done.

    The names tell the state, because each fallback step is one rename and the hold name
    exists only between steps 1 and 3 (or during their undo):

    * no hold: nothing to recover (before the swap, after it, or after a clean undo);
      returns ``"nothing"``. ``live`` must exist, since no step leaves it missing without the
      hold;
    * hold and staged, no live (after step 1): hold -> live; returns ``"hold-to-live"``;
    * hold and live, no staged (after step 2): live -> staged, then hold -> live; returns
      ``"live-to-staged,hold-to-live"``. A crash between the two leaves the previous case,
      so running this again finishes the job.

    Afterwards the original names hold their original trees and the hold name is gone, so a
    second call returns ``"nothing"``. Any other combination (all three, the hold alone, no
    live and no hold, a name that is not a real directory) was not made by ``exchange`` and is
    refused with ``PublishError`` before anything moves.
    """
    staged, live = os.fspath(staged), os.fspath(live)
    hold = hold_path(staged)
    with _names(staged, live, root) as names:
        have_hold, have_staged, have_live = names.exists("hold"), names.exists("staged"), names.exists("live")
        if not have_hold and have_live:
            return RECOVERED_NOTHING
        if have_hold and have_staged and not have_live:
            names.rename("hold", "live")
            names.sync()
            return RECOVERED_AFTER_STEP_1
        if have_hold and have_live and not have_staged:
            names.rename("live", "staged")
            names.rename("hold", "live")
            names.sync()
            return RECOVERED_AFTER_STEP_2
    raise errors.PublishError(
        f"cannot explain the swap state of {live}: live {_word(have_live)}, staged {staged}"
        f" {_word(have_staged)}, hold {hold} {_word(have_hold)}; repair by hand"
    )


def _word(exists):
    return "exists" if exists else "missing"
