"""The how-tos of docs/howto/, run as a reader runs them: every ``sh`` block, in order, in
one bash, from a directory whose ``demo`` is the tree ``make demo`` left.

A page's other blocks (``console``, ``text``, ``yaml``...) are what the reader sees or
writes, not commands: only ``sh`` runs, and every ``sh`` block does.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import checkout
from localplay import ADMIN_PATH

HOWTO = checkout.REPO / "docs" / "howto"
# A fence opens with three or more backticks and an info string; the same run of backticks
# closes it (CommonMark: a longer one does too, a shorter one does not).
_FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=fence)`*[ \t]*$", re.M | re.S)
PAGE_TIMEOUT = 900


def shell_blocks(markdown: str) -> list[str]:
    """The bodies of the page's fenced blocks whose info string is ``sh``, in order."""
    return [match["body"] for match in _FENCE.finditer(markdown) if match["info"].strip() == "sh"]


def script(markdown: str) -> str:
    """The page's commands as one bash script that stops at the first failing command."""
    blocks = shell_blocks(markdown)
    if not blocks:
        raise ValueError("the page has no sh block")
    return "set -euo pipefail\n" + "".join(blocks)


@dataclass(frozen=True)
class PageRun:
    page: str
    done: subprocess.CompletedProcess

    @property
    def output(self) -> str:
        done = self.done
        return f"{self.page}: exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"


def run_page(name: str, demo: Path, workdir: Path, home: Path) -> PageRun:
    """Run docs/howto/NAME's commands from ``workdir`` (made here, with ``demo`` -> ``demo``)
    in a login-like environment of root's: PATH, HOME, LANG, nothing of the caller's."""
    workdir.mkdir(parents=True)
    (workdir / "demo").symlink_to(demo, target_is_directory=True)
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": ADMIN_PATH, "HOME": str(home), "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root"}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script((HOWTO / name).read_text())],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
        check=False,
    )
    return PageRun(name, done)
