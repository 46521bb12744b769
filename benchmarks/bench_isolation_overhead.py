"""What build isolation costs: a real EasyBuild rebuild of one package, four ways, in one run.

Each round rebuilds ``TinyApp/1.0`` (``testbed/tinypkgs.py``; its dependency ``TinyLib/1.0``
loads from the live tree) with the real ``eb`` and Lmod, offline, four ways:

- ``eb-staged-rebuild --backend userns``: the stage mounted at the live path in a private
  mount namespace, the live trees read-only, then the swap;
- ``eb-staged-rebuild --backend bwrap``: EasyBuild's own bubblewrap mode into the run's
  generation directory, then the swap;
- ``eb --experimental --bwrap --bwrap-installpath=DIR --rebuild``: EasyBuild's bubblewrap
  mode alone (nothing is published: the install stays in DIR);
- the baseline, ``eb --rebuild`` in place: the live tree emptied and rebuilt where it is.

One package per round, so a median is the wall time per package, the tool's own work (its
start, the live-change record, the journal, the swap) included. Each way has its own live
tree, built once with plain ``eb`` before the first round, and its own EasyBuild state;
every run must succeed (the tool's must report ``published``), or the benchmark stops with
the end of its output. Goals: the userns backend within 1.5x of the plain in-place build,
the bwrap backend at most 1 s above it. EasyBuild's bubblewrap mode alone spends about 12 s
per package retrying a bind-mounted directory that is busy; the tool's bwrap backend shows the
stage through a view instead (``backends``), so EasyBuild's row shows what that removes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import checkout
import stackenv
import tinypkgs
from benchlib import Comparison, Subject

ROUNDS = 3
MODULE = f"{tinypkgs.APP}/{tinypkgs.VERSION}"
# One build of either tiny package takes seconds; EasyBuild's bwrap mode alone adds ~12 s of retries.
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Stack:
    """What every way shares: Lmod, ``eb``, the tiny packages and this checkout's code."""

    lmod: stackenv.Lmod
    eb: Path
    packages: tinypkgs.TinyPackages
    package_root: Path

    @property
    def easyconfig(self) -> str:
        return str(self.packages.easyconfig(tinypkgs.APP))


def _stack(scratch: Path) -> Stack:
    return Stack(
        lmod=stackenv.find_lmod(),
        eb=stackenv.find_eb(),
        packages=tinypkgs.write_packages(scratch / "tinypkgs"),
        package_root=checkout.link_package(scratch / "pkg"),
    )


def _run(argv: list, env: dict) -> subprocess.CompletedProcess:
    return stackenv.run_checked("isolation_overhead", argv, env, RUN_TIMEOUT)


def _live_site(scratch: Path, stack: Stack) -> tuple[Path, dict]:
    """A live tree at ``scratch/apps`` with both packages, built by plain ``eb``; its env."""
    installpath = scratch / "apps"
    env = stackenv.easybuild_env(
        stack.lmod,
        prefix=scratch / "eb-state",
        installpath=installpath,
        sources=stack.packages.sources,
        easyconfigs=stack.packages.easyconfigs,
    )
    _run([str(stack.eb), "--robot", stack.easyconfig], env)
    return installpath, env


def in_place(scratch: Path, stack: Stack):
    _installpath, env = _live_site(scratch, stack)
    argv = [str(stack.eb), "--rebuild", stack.easyconfig]
    return lambda: _run(argv, env)


def easybuild_bwrap(scratch: Path, stack: Stack):
    _installpath, env = _live_site(scratch, stack)
    rounds = iter(range(sys.maxsize))

    def rebuild():
        # A fresh directory each round, as the tool gives each run its own generation.
        bwrap_installpath = scratch / "bwrap" / str(next(rounds))
        _run(
            [
                str(stack.eb),
                "--experimental",
                "--bwrap",
                f"--bwrap-installpath={bwrap_installpath}",
                "--rebuild",
                stack.easyconfig,
            ],
            env,
        )

    return rebuild


def _tool(backend: str):
    def factory(scratch: Path, stack: Stack):
        installpath, env = _live_site(scratch, stack)
        env = dict(env, PYTHONPATH=str(stack.package_root))
        argv = [
            sys.executable,
            "-m",
            "hpcstack_ops.staged_rebuild.cli",
            "--state-root",
            str(scratch / "state"),
            "--json",
            "rebuild",
            f"--installpath={installpath}",
            f"--module={MODULE}",
            f"--backend={backend}",
            f"--eb={stack.eb}",
            "--",
            stack.easyconfig,
        ]

        def rebuild():
            result = json.loads(_run(argv, env).stdout)
            if result.get("state") != "published" or result.get("backend") != backend:
                raise RuntimeError(f"isolation_overhead: {backend} run did not publish: {result}")

        return rebuild

    return factory


def _who() -> str:
    return "root" if os.geteuid() == 0 else "unprivileged"


CASES = [
    Comparison(
        f"isolation_overhead ({_who()})",
        [
            Subject("eb-staged-rebuild --backend userns (goal <= 1.5)", _tool("userns")),
            Subject("eb-staged-rebuild --backend bwrap (goal <= in place + 1 s)", _tool("bwrap")),
            Subject("eb --experimental --bwrap (alone)", easybuild_bwrap),
        ],
        "eb --rebuild (in place)",
        in_place,
        rounds=ROUNDS,
        setup=_stack,
    )
]
