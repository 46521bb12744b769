"""Publish windows: what a reader of the live install path sees while it is replaced.

A reader process opens the install at its live path in a tight loop while each method
replaces the tree there and puts the previous one back, 200 times:

* the subject, ``eb-staged-rebuild``, through the in-process API its command runs (no
  interpreter start-up per cycle). Every tenth cycle is a whole run: ``rebuild.rebuild``
  (state-root lock, journal, live-change record, a build of a new generation by
  ``tree_eb.py``, the planner, the publish), then ``rollback.rollback`` under the lock, as
  ``cmd_rollback`` does. The nine cycles between them publish that run's journal again
  with ``publish.publish`` and roll it back: the same functions, each operation journaled,
  doing to the live path all that a run does to it (the swap; the build happens elsewhere).
  Publishing a rolled-back run again is no command of the tool; it is done here because a
  build per cycle (a subprocess) would take 200 cycles past the minute ``make bench`` has,
  and a new run every ten cycles keeps the journal, rewritten whole at each step, small.
* ``in-place rebuild``, as ``eb --rebuild`` does: empty the live directory, then write the
  new generation's files into it; the "rollback" is the same for the previous generation.
* ``backup-and-replace``, as ``spack install --overwrite`` does: rename live to
  ``<live>.bak``, make a new directory at the live path and write the generation into it,
  then remove the backup; the "rollback" is the same again.

One read resolves the live path once (``open(O_DIRECTORY)``, as a process does that changes
into the install or holds it open) and reads PAYLOAD and the 30 parts relative to it:
``missing`` if the path is not there, ``partial`` if a file is missing or shorter than
written, or the files name more than one generation, ``ok`` otherwise. Resolving once is
what makes the verdict about the tree: a reader that resolved the path again for every file
would straddle any replacement, atomic or not, and see two whole generations.

All three run in the same place: tmpfs unless ``$HPCSTACK_BENCH_WINDOW_DIR`` names
another (``run._window_root`` says why). The baselines write only the small tree (32
files), so their windows are a lower bound: with a real build in place of the write, a
window lasts as long as the build. On a filesystem that can exchange directories the
subject should leave no window at all; its row names the filesystem and the swap method,
because with the three-rename fallback it cannot.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import tree_eb
from benchlib import MISSING, OK, PARTIAL, Method, Replacer, WindowCase
from hpcstack_ops.common import mountinfo
from hpcstack_ops.staged_rebuild import journal as journals
from hpcstack_ops.staged_rebuild import locking, probe, publish, rebuild, rollback
from hpcstack_ops.staged_rebuild import request as requests

NAME, VERSION = "Bench", "1.0"
EASYCONFIG = f"{NAME}-{VERSION}.eb"
CYCLES = 200
# Every REBUILD_EVERY-th cycle is a whole run, the others publish it again (see above).
REBUILD_EVERY = 10


def read_tree(live):
    """One read of the install at ``live``: ``OK``, ``MISSING`` or ``PARTIAL``."""
    try:
        directory = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return MISSING
    try:
        return _verdict(directory)
    finally:
        os.close(directory)


def _verdict(directory):
    tags = set()
    for name in tree_eb.MANIFEST:
        try:
            handle = os.open(name, os.O_RDONLY, dir_fd=directory)
        except FileNotFoundError:
            return PARTIAL
        try:
            data = os.read(handle, tree_eb.PART_SIZE + 1)
        finally:
            os.close(handle)
        tag, newline, rest = data.partition(b"\n")
        whole = len(data) == tree_eb.PART_SIZE if name != tree_eb.PAYLOAD else not rest
        if not (newline and whole):
            return PARTIAL
        tags.add(tag)
    return OK if len(tags) == 1 else PARTIAL


def _eb_command(scratch):
    """An executable ``eb`` that runs tree_eb.py with this interpreter (the engine needs a file)."""
    eb = scratch / "eb"
    script = Path(tree_eb.__file__).resolve()
    eb.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "$@"\n')
    eb.chmod(0o755)
    return eb


def _quiet(_line):
    pass


def _roll_back(journal, trees, state_root):
    if journal.state is not journals.RunState.PUBLISHED:
        raise RuntimeError(f"run {journal.run_id} is {journal.state} after its publish")
    with locking.StateLock(state_root, 0):
        rollback.rollback(journal, trees)
    if journal.state is not journals.RunState.ROLLED_BACK:
        raise RuntimeError(f"run {journal.run_id} is {journal.state} after its rollback")


def staged_rebuild(scratch):
    """The subject: a live install built by tree_eb.py, and the engine's cycle (see above)."""
    apps, state_root = scratch / "apps", str(scratch / "state")
    eb = _eb_command(scratch)
    subprocess.run(
        [str(eb), f"--installpath={apps}", EASYCONFIG],
        env=dict(os.environ, FAKE_EB_PAYLOAD="old"),
        capture_output=True,
        check=True,
    )
    software = apps / "software"
    # The options the command line would give, resolved as it resolves them: each whole run
    # is a new request, with a run id of its own.
    options = {
        "installpath": str(apps),
        "modules": [f"{NAME}/{VERSION}"],
        "backend": "installpath",  # the stand-in eb knows no sandbox
        "eb": str(eb),
    }
    trees = requests.live_trees(options, os.environ)

    latest = []  # the journal of the latest whole run, which the cycles between publish again

    def cycle(n):
        if n % REBUILD_EVERY == 0:
            env = dict(os.environ, FAKE_EB_PAYLOAD=f"gen-{n}")
            request = requests.resolve(options, os.environ, [EASYCONFIG])
            run_id = rebuild.rebuild(request, state_root, _quiet, env)["run_id"]
            latest[:] = [journals.find(state_root, run_id)]
        else:
            with locking.StateLock(state_root, 0):
                publish.publish(latest[0], trees)
        _roll_back(latest[0], trees, state_root)

    exchange, errno_name = probe.exchange_works(str(software))

    def note():
        method = "rename_exchange" if exchange else f"three-rename fallback: exchange gave {errno_name}"
        return f"{mountinfo.filesystem_of(str(software))}, {method}"

    return Replacer(software / NAME / VERSION, cycle, note)


def in_place(live, tag):
    """``eb --rebuild``: the live directory stays; its contents go, then the new ones come."""
    for entry in os.scandir(live):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    tree_eb.write_install(str(live), tag, NAME, VERSION)


def backup_and_replace(live, tag):
    """``spack install --overwrite``: live moves aside, a new tree is built at the path."""
    backup = live.with_name(live.name + ".bak")
    os.rename(live, backup)
    os.mkdir(live)
    tree_eb.write_install(str(live), tag, NAME, VERSION)
    shutil.rmtree(backup)


def _baseline(replace):
    """A baseline's setup: the "old" tree, and a cycle that ``replace``s it and back again."""

    def setup(scratch):
        live = scratch / "software" / NAME / VERSION
        tree_eb.write_install(str(live), "old", NAME, VERSION)

        def cycle(n):
            replace(live, f"gen-{n}")
            replace(live, "old")

        return Replacer(live, cycle)

    return setup


CASES = [
    WindowCase(
        "publish window: publish + rollback",
        read_tree,
        Method("eb-staged-rebuild", staged_rebuild),
        (
            Method("in-place rebuild (eb --rebuild)", _baseline(in_place)),
            Method("backup-and-replace (spack --overwrite)", _baseline(backup_and_replace)),
        ),
        cycles=CYCLES,
        # A whole run, the publishes of its journal again, and the next whole run.
        smallest={"cycles": REBUILD_EVERY + 1},
    )
]
