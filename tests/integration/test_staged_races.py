"""Every command against a racing swapper: a directory it walks exchanged with a link to a victim.

A helper process (``tests.support.racing.Swapper``) swaps a directory of the trees and a
symbolic link to a victim tree with ``renameat2(RENAME_EXCHANGE)`` in a tight loop, while
the real commands run against the trees again and again:

* ``software/<Name>``: ``gc --grace-hours 0`` removing a hidden sibling; rebuild, rollback
  and resume, which exchange directories in it;
* ``modules/all/<Name>``: retire and its rollback, which move the module file out and back;
  rebuild, rollback and resume, which write, restore and remove module files there;
* the state root's ``runs/`` and ``retired/``: retire and rollback, which create a run with
  its journal and write it, and move the module file into and out of ``retired/``.

Each attempt must complete or be refused in one line, and not one byte of the victim tree
may be written, moved or deleted: every mutation is made through directory descriptors
opened from the root without following a link (``fsutil.Directory``). When the swapper
stops, the commands put the trees back exactly as they were: nothing was lost on the way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.racing import ATTEMPTS, Swapper, assert_completed_or_refused, runs_in
from tests.support.staged import snapshot

APP = "TinyApp/1.0"


def _plant_sibling(real_fd, name):
    """The retired sibling again, made through a descriptor of the real directory (whatever
    its name is at the moment), with one file in it."""
    if name not in os.listdir(real_fd):
        os.mkdir(name, dir_fd=real_fd)
    sibling_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=real_fd)
    try:
        fd = os.open("PAYLOAD", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=sibling_fd)
        os.write(fd, b"old tree\n")
        os.close(fd)
    finally:
        os.close(sibling_fd)


def test_gc_never_deletes_in_another_tree_while_software_name_is_swapped_for_a_link(staged_site, tmp_path):
    site = staged_site
    site.install(APP)
    done = site.run("--json", *site.rebuild_args(APP))
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    sibling_name = f".1.0.{run_id}"
    victim = tmp_path / "victim" / "TinyApp"
    (victim / sibling_name).mkdir(parents=True)
    (victim / sibling_name / "PAYLOAD").write_text("another tree\n")
    (victim / "1.0").mkdir()
    (victim / "1.0" / "bin").write_text("another tree's program\n")
    victim_before = snapshot(victim.parent)
    outcomes = {"completed": 0, "refused": 0}
    with Swapper(site.software / "TinyApp", victim, tmp_path) as real_fd:
        for _attempt in range(ATTEMPTS):
            _plant_sibling(real_fd, sibling_name)

            done = site.run("--json", "gc", "--grace-hours", "0", timeout=60)

            outcome = assert_completed_or_refused(done)
            outcomes[outcome] += 1
            if outcome == "completed":
                assert sibling_name not in os.listdir(real_fd)
            assert snapshot(victim.parent) == victim_before, f"victim changed after {outcomes}"
    print(f"gc against a racing swapper of software/TinyApp, {ATTEMPTS} attempts: {outcomes}")
    assert sum(outcomes.values()) == ATTEMPTS
    assert (site.software / "TinyApp").is_dir()
    assert not (site.software / "TinyApp").is_symlink()
    assert snapshot(victim.parent) == victim_before


def _victim(tmp_path: Path, *files: str) -> Path:
    """A tree of another owner, holding files of the names the commands write."""
    victim = tmp_path / "victim"
    for name in files:
        (victim / name).parent.mkdir(parents=True, exist_ok=True)
        (victim / name).write_text(f"another tree's {name}\n")
    return victim


def _pending_retires(runs_fd: int) -> list:
    return [
        run_id
        for run_id, journal in sorted(runs_in(runs_fd).items())
        if journal["kind"] == "retire" and journal["state"] in ("retiring", "retired")
    ]


def _retire_cycle(site, runs_fd: int):
    """The next command of retire, rollback, retire, ...: roll back a retire that is not."""
    pending = _pending_retires(runs_fd)
    if pending:
        return site.run("--json", "rollback", pending[0])
    return site.run("--json", "retire", str(site.module_file(APP)), "--reason", "racing")


@pytest.mark.parametrize("target", ["modules/all/TinyApp", "state/runs", "state/retired"])
def test_retire_and_rollback_never_touch_another_tree_while_a_directory_they_walk_is_swapped(
    staged_site, tmp_path, target
):
    site = staged_site
    site.install(APP)
    module_bytes = site.module_file(APP).read_bytes()
    # One retire and its rollback before the race: runs/ and retired/ exist, as on a used site.
    retired = site.run("--json", "retire", str(site.module_file(APP)), "--reason", "before the race")
    assert retired.returncode == 0, retired.stderr
    assert site.run("rollback", json.loads(retired.stdout)["run_id"]).returncode == 0
    directory = {
        "modules/all/TinyApp": site.modules_all / "TinyApp",
        "state/runs": site.state_root / "runs",
        "state/retired": site.state_root / "retired",
    }[target]
    victim = _victim(tmp_path, "1.0.lua", "journal.json", "retire-x/journal.json")
    victim_before = snapshot(victim)
    runs_fd = os.open(site.state_root / "runs", os.O_RDONLY | os.O_DIRECTORY)
    outcomes = {"completed": 0, "refused": 0}
    try:
        with Swapper(directory, victim, tmp_path):
            for _attempt in range(ATTEMPTS):
                outcomes[assert_completed_or_refused(_retire_cycle(site, runs_fd))] += 1
                assert snapshot(victim) == victim_before, f"victim changed after {outcomes}"
        print(f"retire and rollback against a racing swapper of {target}, {ATTEMPTS} attempts: {outcomes}")
        # Without the swapper, the runs left retired (or retiring) roll back: the module file
        # is back, byte for byte, and no run is left half done.
        pending = _pending_retires(runs_fd)
        while pending:
            done = site.run("rollback", pending[0])
            assert done.returncode == 0, done.stderr
            pending = _pending_retires(runs_fd)
        states = {journal["state"] for journal in runs_in(runs_fd).values()}
    finally:
        os.close(runs_fd)
    assert sum(outcomes.values()) == ATTEMPTS
    assert snapshot(victim) == victim_before
    assert site.module_file(APP).read_bytes() == module_bytes
    assert states == {"rolled_back"}
