"""The tree, Slurm and demo.env that ``make demo`` leaves, made once per session.

The demo's own tests and the how-tos' share it (``DEMO_TREE`` keeps them on one xdist
worker). Its Slurm is stopped when the session ends, whatever happened.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

import checkout

DEMO_TREE = pytest.mark.xdist_group("demo_tree")
DEMO_SCRIPT = checkout.REPO / "testbed" / "demo.py"
DEMO_TIMEOUT = 600


def run_demo(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """``testbed/demo.py ARGS`` (``make demo``, ``make demo-stop``) on ``tree``."""
    env = dict(os.environ, HPCSTACK_DEMO_DIR=str(tree))
    return subprocess.run(
        [sys.executable, str(DEMO_SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )


@dataclass(frozen=True)
class DemoRun:
    tree: Path  # what make demo built: software/, modules/all/, demo.env, bin/, eessi/
    done: subprocess.CompletedProcess  # its first run

    def exported(self, name: str) -> str:
        """The value demo.env exports as ``name`` (its ``export NAME=value`` line, unquoted)."""
        (value,) = re.findall(rf"^export {name}=(.*)$", (self.tree / "demo.env").read_text(), re.M)
        return shlex.split(value)[0]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Iterator[DemoRun]:
    tree = tmp_path_factory.mktemp("demo-run") / "demo"
    try:
        yield DemoRun(tree, run_demo(tree))
    finally:
        run_demo(tree, "stop")
