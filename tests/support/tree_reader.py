"""A job that uses an installed package over and over, as jobs do, and says what it saw.

    python3 tree_reader.py APP_BIN LIB_ROOT STOP_FILE REPORT

Each run opens the library's install directory once (``LIB_ROOT``, resolved afresh), lists the
tree below it through that descriptor and runs the application (``APP_BIN``, which prints the
library's greeting) with ``EBROOT...`` pointing at it, as ``module load`` would. A run is:

- ``missing``: the directory or the program was not there;
- ``partial``: it was there, but its files were not one complete tree, or the program failed
  or printed something that is no tree's greeting;
- otherwise the greeting it printed, so the report counts the runs of each tree.

``REPORT`` holds the counts so far (JSON, replaced in one rename every few runs), the order in
which the greetings were first seen and each greeting's tree; the job stops once ``STOP_FILE``
exists, after writing it a last time. Standalone, standard library only: it runs on a compute
node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def tree_of(root_fd: int) -> tuple:
    """Every file below the directory ``root_fd`` (relative names), read through it."""
    names = []
    for top, _dirs, files, top_fd in os.fwalk(".", dir_fd=root_fd):
        for name in files:
            names.append(os.path.normpath(os.path.join(top, name)))
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=top_fd)
            os.close(fd)
    return tuple(sorted(names))


def one_run(app_bin: str, lib_root: str) -> tuple:
    """("missing" | "partial" | the greeting, the tree's file list or None)."""
    try:
        root_fd = os.open(lib_root, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return "missing", None
    try:
        files = tree_of(root_fd)
        env = dict(os.environ, EBROOTTINYLIB=f"/proc/self/fd/{root_fd}")
        try:
            done = subprocess.run(
                [app_bin], env=env, pass_fds=(root_fd,), capture_output=True, text=True, check=False
            )
        except FileNotFoundError:
            return "missing", files
    except OSError:
        return "partial", None
    finally:
        os.close(root_fd)
    if done.returncode != 0 or not done.stdout.strip():
        return "partial", files
    return done.stdout.strip(), files


REPORT_EVERY = 10


def write_report(report: str, state: dict) -> None:
    with open(report + ".tmp", "w") as out:
        json.dump(state, out)
    os.replace(report + ".tmp", report)


def main(argv: list) -> int:
    app_bin, lib_root, stop_file, report = argv
    counts: dict = {}
    order: list = []
    trees: dict = {}
    state = {"counts": counts, "order": order, "trees": trees}
    while not os.path.exists(stop_file):
        seen, files = one_run(app_bin, lib_root)
        if seen not in ("missing", "partial"):
            # One complete tree per greeting: a run that saw other files saw a partial tree.
            if trees.setdefault(seen, files) != files:
                seen = "partial"
            elif seen not in order:
                order.append(seen)
        counts[seen] = counts.get(seen, 0) + 1
        if sum(counts.values()) % REPORT_EVERY == 1:
            write_report(report, state)
    write_report(report, state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
