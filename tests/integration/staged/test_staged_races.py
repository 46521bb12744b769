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

A last test races the removal itself (what gc and a discarded stage use) against a real
process of another uid that owns a chain of directories inside the tree and moves them
out of it, into root's world-writable sticky directory beside it, and back.

Each attempt must complete or be refused in one line, and not one byte of the victim tree
may be written, moved or deleted: every mutation is made through directory descriptors
opened from the root without following a link (``fsutil.Directory``). When the swapper
stops, the commands put the trees back exactly as they were: nothing was lost on the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import resume
from tests.integration.staged.test_staged_full_disk import crash_at, error_line, rebuild_argv, run_cli
from tests.support.deep import nest, remove_whatever_is_left
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


_INTERRUPTED = ("building", "planning", "publishing", "rolling_back")


# Where a crashed rebuild stops, for resume to walk back: after its swap and module file,
# before its journal says published.
_CRASH_POINT = "state published"


def _publish_cycle(site, runs_fd: int, swapper=None, attempt: int = 0):
    """The next command of rebuild, rollback, rebuild, ...: resume what an attempt left
    interrupted, roll back what is published, else rebuild. Every other rebuild (with a
    ``swapper``) is made while it is paused and crashed before it is published, so that
    the next attempt is a resume, which puts the old tree back under the race."""
    runs = runs_in(runs_fd)
    if any(journal["state"] in _INTERRUPTED for journal in runs.values()):
        return site.run("--json", "resume")
    published = sorted(run_id for run_id, journal in runs.items() if journal["state"] == "published")
    if published:
        return site.run("--json", "rollback", published[-1])
    if swapper is not None and attempt % 2:
        with swapper.paused():
            crash_at(site, _CRASH_POINT, rebuild_argv(site, f"crashed{attempt}"))
        return site.run("--json", "resume")
    return site.run("--json", *site.rebuild_args(APP))


@pytest.mark.parametrize("target", ["software/TinyApp", "modules/all/TinyApp"])
def test_rebuild_rollback_and_resume_never_touch_another_tree_while_a_directory_they_walk_is_swapped(
    staged_site, tmp_path, target
):
    site = staged_site
    site.install(APP)
    live_before = snapshot(site.live(APP))
    module_bytes = site.module_file(APP).read_bytes()
    # A rebuild and its rollback before the race: runs/ exists, and the way back is known good.
    first = site.run("--json", *site.rebuild_args(APP))
    assert first.returncode == 0, first.stderr
    assert site.run("rollback", json.loads(first.stdout)["run_id"]).returncode == 0
    directory = {
        "software/TinyApp": site.software / "TinyApp",
        "modules/all/TinyApp": site.modules_all / "TinyApp",
    }[target]
    victim = _victim(tmp_path, "1.0.lua", "1.0/PAYLOAD", "1.0/bin/tiny", ".1.0.run1/PAYLOAD")
    victim_before = snapshot(victim)
    runs_fd = os.open(site.state_root / "runs", os.O_RDONLY | os.O_DIRECTORY)
    outcomes = {"completed": 0, "refused": 0}
    # Half of ATTEMPTS: a rebuild takes about a second; gc (software/<Name>) and retire
    # (modules/all/<Name>) give these two targets their full count above.
    attempts = max(ATTEMPTS // 2, 1)
    try:
        swapper = Swapper(directory, victim, tmp_path)
        with swapper:
            for attempt in range(attempts):
                done = _publish_cycle(site, runs_fd, swapper, attempt)
                outcomes[assert_completed_or_refused(done)] += 1
                assert snapshot(victim) == victim_before, f"victim changed after {outcomes}"
        print(
            f"rebuild, rollback and resume against a racing swapper of {target}, {attempts} attempts:",
            outcomes,
        )
        # Without the swapper, every run ends resumed or rolled back: the live tree and its
        # module file are the ones installed before the race, byte for byte.
        for _settle in range(attempts + 2):
            runs = runs_in(runs_fd)
            if not any(journal["state"] in (*_INTERRUPTED, "published") for journal in runs.values()):
                break
            done = _publish_cycle(site, runs_fd)
            assert done.returncode == 0, done.stderr
        states = {journal["state"] for journal in runs_in(runs_fd).values()}
    finally:
        os.close(runs_fd)
    assert sum(outcomes.values()) == attempts
    assert snapshot(victim) == victim_before
    assert states <= {"rolled_back", "failed"}
    assert snapshot(site.live(APP)) == live_before
    assert site.module_file(APP).read_bytes() == module_bytes


@pytest.mark.parametrize("target", ["software/TinyApp", "modules/all/TinyApp"])
def test_resume_refuses_when_a_directory_it_reads_turns_into_a_link_after_its_checks(
    staged_site, tmp_path, target, monkeypatch
):
    """The moment the racing swapper catches now and then, made exact: the directory is
    swapped for a link to a victim tree after resume has loaded and checked the journals,
    just before it reads the disk to put the old tree back (an injected swap, since that
    moment cannot be timed from outside). Resume must not read "not swapped" or "not the
    new module file" through the link and end the run failed with the new tree still live:
    it refuses in one line, and once the directory is back, the next resume puts the old
    tree back."""
    site = staged_site
    site.install(APP)
    live_before = snapshot(site.live(APP))
    module_bytes = site.module_file(APP).read_bytes()
    crash_at(site, _CRASH_POINT, rebuild_argv(site, "crashed"))
    directory = {
        "software/TinyApp": site.software / "TinyApp",
        "modules/all/TinyApp": site.modules_all / "TinyApp",
    }[target]
    victim = _victim(tmp_path, "1.0.lua", "1.0/PAYLOAD")
    victim_before = snapshot(victim)
    parked = directory.with_name(".parked")
    real_return_to_old = resume.return_to_old

    def swap_then_return_to_old(journal, trees):
        os.rename(directory, parked)
        directory.symlink_to(victim)
        return real_return_to_old(journal, trees)

    monkeypatch.setattr(resume, "return_to_old", swap_then_return_to_old)

    refused = run_cli(site, ["--json", "resume"])

    assert refused.code == 2, (refused.code, refused.stdout, refused.stderr)
    assert f"{directory} is a symbolic link" in error_line(refused)
    assert snapshot(victim) == victim_before
    journal = json.loads((site.state_root / "runs" / "crashed" / "journal.json").read_text())
    assert journal["state"] == "publishing"
    monkeypatch.undo()
    directory.unlink()
    os.rename(parked, directory)
    done = site.run("--json", "resume")
    assert done.returncode == 0, done.stderr
    assert snapshot(site.live(APP)) == live_before
    assert site.module_file(APP).read_bytes() == module_bytes


# The attacker of the removal: another uid that owns a chain of directories inside the tree
# being removed (``pub/d/d/...``, as a user who can write into an install may have made). In
# a tight loop it climbs to a random level of its chain and either moves that level, with
# what is below it, into root's world-writable sticky directory beside the tree and back, or
# exchanges it with a link to root's files there and back; until the stop file appears, when
# it writes how many moves it made. Between trees it waits for the next.
_MOVER = r"""
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
tree, outside, stop, report, depth = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
out_fd = os.open(outside, flags)
moves = exchanges = 0
while not os.path.exists(stop):
    try:
        fd = os.open(os.path.join(tree, "pub"), flags)
    except OSError:
        time.sleep(0.001)
        continue
    try:
        for _level in range(random.randrange(depth)):
            child = os.open("d", flags, dir_fd=fd)
            os.close(fd)
            fd = child
        away = "moved-%d" % (moves + exchanges)
        if random.random() < 0.5:
            os.rename("d", away, src_dir_fd=fd, dst_dir_fd=out_fd)
            moves += 1
            os.rename(away, "d", src_dir_fd=out_fd, dst_dir_fd=fd)
        else:
            os.symlink(os.path.join(outside, "victim-dir"), "s", dir_fd=fd)
            if libc.renameat2(fd, b"d", fd, b"s", 2) == 0:
                exchanges += 1
                libc.renameat2(fd, b"d", fd, b"s", 2)
            os.unlink("s", dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
with open(report, "w") as out:
    out.write("%d %d\n" % (moves, exchanges))
"""

# The removals, as gc makes them, under a descriptor limit far below the chain's depth: one
# process (argv: limit, software root) that removes each tree named on its stdin and answers
# ``completed`` or ``refused: <its one line>``.
_REMOVER = r"""
import resource, sys
from hpcstack_ops.common import errors
from hpcstack_ops.staged_rebuild import fsutil
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
for line in sys.stdin:
    try:
        fsutil.remove_tree(line.rstrip("\n"), root=sys.argv[2])
    except (errors.HpcstackError, OSError) as err:
        print("refused: " + str(err).replace("\n", " "), flush=True)
    else:
        print("completed", flush=True)
"""
# Deeper than a removal under this descriptor limit may hold open.
_CHAIN = 120
_LIMIT = 32


def _tree_of(software, attacker):
    """A retired tree of root's with the attacker's chain in it, made under another name and
    renamed into place whole, so that the attacker never sees it half made."""
    building = software / "TinyApp" / ".building"
    building.mkdir()
    (building / "PAYLOAD").write_text("old tree\n")
    (building / "pub").mkdir()
    os.chown(building / "pub", attacker.uid, attacker.gid)
    # Beside each level, an empty directory of the name root's directory has beside the tree:
    # a walk that climbed out of a moved level would find that name pending there.
    nest(building / "pub", _CHAIN, beside=["victim-dir"], uid=attacker.uid, gid=attacker.gid)
    tree = software / "TinyApp" / ".1.0.race"
    building.rename(tree)
    return tree


def test_removal_never_leaves_its_tree_while_another_user_moves_directories_of_it(
    deep_scratch, attacker_user, package_root
):
    software = deep_scratch / "software"
    (software / "TinyApp").mkdir(parents=True)
    outside = deep_scratch / "outside"
    (outside / "victim-dir" / "sub").mkdir(parents=True)
    (outside / "victim-dir" / "sub" / "keep").write_text("root's\n")
    (outside / "victim-file").write_text("root's too\n")
    outside.chmod(0o1777)  # anyone may put a directory here; only root may take root's away
    victims_before = snapshot(outside / "victim-dir"), (outside / "victim-file").read_bytes()
    scratch = deep_scratch / "attacker"
    scratch.mkdir()
    os.chown(scratch, attacker_user.uid, attacker_user.gid)
    tree_path = software / "TinyApp" / ".1.0.race"
    mover = subprocess.Popen(
        attacker_user.command(
            [
                sys.executable,
                "-c",
                _MOVER,
                str(tree_path),
                str(outside),
                str(scratch / "stop"),
                str(scratch / "report"),
                str(_CHAIN),
            ]
        ),
        env=attacker_user.env(),
    )
    remover = subprocess.Popen(
        [sys.executable, "-c", _REMOVER, str(_LIMIT), str(software)],
        env=dict(os.environ, PYTHONPATH=str(package_root)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    outcomes = {"completed": 0, "refused": 0}
    refusals = set()
    # A fifth of ATTEMPTS: each attempt builds a tree of some 400 entries first.
    attempts = max(ATTEMPTS // 5, 10)

    def remove(tree):
        remover.stdin.write(f"{tree}\n")
        remover.stdin.flush()
        answer = remover.stdout.readline()
        assert answer == "completed\n" or answer.startswith("refused: "), answer or remover.wait()
        return answer

    try:
        for _attempt in range(attempts):
            tree = _tree_of(software, attacker_user)

            answer = remove(tree)

            outcomes[answer.split(":")[0].strip()] += 1
            if answer != "completed\n":
                refusals.add(answer.strip().replace(str(deep_scratch), "<scratch>")[:120])
            assert (snapshot(outside / "victim-dir"), (outside / "victim-file").read_bytes()) == (
                victims_before
            ), f"root's files beside the tree changed after {outcomes}"
            if os.path.lexists(tree):  # what a refused removal left: out of the attacker's way
                tree.rename(deep_scratch / f"left-{_attempt}")
        (scratch / "stop").touch()
        mover.wait(timeout=60)
        # With the mover gone the same chain, deeper than the limit, is removed whole: whether a
        # raced attempt completes is the scheduler's choice, this one is not.
        quiet_tree = _tree_of(software, attacker_user)
        quiet_answer = remove(quiet_tree)
    finally:
        remover.stdin.close()
        remover.wait(timeout=60)
        remover.stdout.close()
        (scratch / "stop").touch()
        mover.wait(timeout=60)
    # What the attacker moved out and did not get back in: the tree's, not root's.
    for leftover in outside.glob("moved-*"):
        remove_whatever_is_left(leftover)
    moves, exchanges = map(int, (scratch / "report").read_text().split())
    print(
        f"removal of a {_CHAIN}-deep chain under RLIMIT_NOFILE {_LIMIT} against another user moving "
        f"its directories, {attempts} attempts: {outcomes}; {moves} moves and {exchanges} exchanges; "
        f"refusals: {sorted(refusals)}"
    )
    assert mover.returncode == 0
    assert sum(outcomes.values()) == attempts
    assert (quiet_answer, os.path.lexists(quiet_tree)) == ("completed\n", False)
    assert moves + exchanges > 0
    assert sorted(os.listdir(outside)) == ["victim-dir", "victim-file"]
