"""gc against a racing swapper: ``software/<Name>`` exchanged with a link to another tree.

A helper process swaps the live ``software/TinyApp`` directory and a symbolic link to a
victim tree with ``renameat2(RENAME_EXCHANGE)`` in a tight loop, while ``gc --grace-hours 0``
removes the run's hidden sibling ``.1.0.<run-id>``, again and again. The victim tree holds a
directory of that same name. Each attempt must either remove the real sibling or be refused
in one line, and not one byte of the victim tree may be written, moved or deleted: gc opens
``software/TinyApp`` by descriptor without following a link and removes by descriptors below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.staged import snapshot

APP = "TinyApp/1.0"
# 50 in `make test`; `make stress` sets 1,000.
ATTEMPTS = int(os.environ.get("HPCSTACK_RACE_ATTEMPTS", "50"))

# The swapper: exchange the two names until the stop file appears (glibc's renameat2).
_SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b, stop = (os.fsencode(arg) for arg in sys.argv[1:4])
while not os.path.exists(stop):
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
"""


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
    live_name = site.software / "TinyApp"
    link_name = site.software / ".TinyApp-swap"
    link_name.symlink_to(victim)
    real_fd = os.open(live_name, os.O_RDONLY | os.O_DIRECTORY)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(live_name), str(link_name), str(stop)])
    outcomes = {"removed": 0, "refused": 0}
    try:
        for _attempt in range(ATTEMPTS):
            _plant_sibling(real_fd, sibling_name)

            done = site.run("--json", "gc", "--grace-hours", "0", timeout=60)

            if done.returncode == 0:
                outcomes["removed"] += 1
                assert sibling_name not in os.listdir(real_fd)
            else:
                assert done.returncode == 2, done.stderr
                (line,) = done.stderr.splitlines()
                assert line.startswith("eb-staged-rebuild: "), line
                outcomes["refused"] += 1
            assert "Traceback" not in done.stderr
            assert snapshot(victim.parent) == victim_before, f"victim changed after {outcomes}"
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if live_name.is_symlink():  # the swapper stopped with the link at the live name
            os.rename(live_name, tmp_path / "parked")
            os.rename(link_name, live_name)
        os.close(real_fd)
    print(f"gc against a racing swapper, {ATTEMPTS} attempts: {outcomes}")  # make stress shows it
    assert sum(outcomes.values()) == ATTEMPTS
    assert not live_name.is_symlink()
    assert live_name.is_dir()
    assert snapshot(victim.parent) == victim_before
