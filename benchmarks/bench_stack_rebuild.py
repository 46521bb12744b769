"""What a stack rebuild costs beyond EasyBuild: a library and 20 dependants, one run.

The live tree is ``testbed/chainpkgs.py``'s chain, built once with plain ``eb --rpath``: the
library ``ValLib/1.0`` and 20 dependants (ValA, ValB, ValC on ValA, ValD01 ... ValD17), tiny
C packages built with the real EasyBuild and Lmod, offline. Each round runs
``eb-staged-rebuild rebuild --module ValLib/1.0 --with-dependants --backend userns`` with
ValLib's new easyconfig (every dependant rebuilt from its own easyconfig copy), checks that
it published all 21, and rolls it back (not timed) so that every round starts from the same
tree.

The figure is the tool's own time in that run: discovery and the plan, the request, the
probes, the journal, the swaps and module files, and its own start, measured as the run's
wall time minus the wall time of EasyBuild's build. The ``eb`` the run is given is a
wrapper that records when the real one started and ended, around each call; only the call
that builds (the longest) is subtracted, so EasyBuild's quick calls the tool makes before it
(``--version``, ``--show-config``) count as the tool's. Both sides of the row come from the
same run: the own time, and the whole run's wall time beside it; the ratio is the tool's
share. Goal: at most 5 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import chainpkgs
import checkout
import stackenv
from benchlib import REPORTED, Case

DEPENDANTS = 20
SMALLEST = 2
ROUNDS = 3
RUN_TIMEOUT = 900
_TIMED_EB = """#!/bin/sh
# Runs the real eb and records "<start ns> <end ns>" of this call, for the benchmark.
start=$(date +%s%N)
{eb} "$@"
status=$?
echo "$start $(date +%s%N)" >> {record}
exit $status
"""


@dataclass(frozen=True)
class Chain:
    """The live tree of the chain, the rebuild's easyconfigs, and the tool's command."""

    installpath: Path
    env: dict
    argv: list
    record: Path
    modules: tuple


def _run(argv: list, env: dict) -> subprocess.CompletedProcess:
    return stackenv.run_checked("stack_rebuild", argv, env, RUN_TIMEOUT)


def _chain(scratch: Path, dependants: int) -> Chain:
    """Build the live tree of ValLib and ``dependants`` in ``scratch``; the tool's command."""
    eb = stackenv.find_eb()
    old = chainpkgs.write_packages(scratch / "gen1", value=1, dependants=dependants)
    new = chainpkgs.write_packages(scratch / "gen2", value=2, dependants=dependants)
    installpath = scratch / "apps"
    env = stackenv.easybuild_env(
        stackenv.find_lmod(),
        prefix=scratch / "eb-state",
        installpath=installpath,
        sources=old.sources,
        easyconfigs=old.easyconfigs,
    )
    names = (chainpkgs.LIB, *old.dependants)
    _run([str(eb), "--robot", *chainpkgs.EB_ARGS, *(str(old.easyconfig(name)) for name in names)], env)
    record = scratch / "eb-calls"
    timed_eb = scratch / "timed-eb"
    timed_eb.write_text(_TIMED_EB.format(eb=eb, record=record))
    timed_eb.chmod(0o755)
    argv = [
        sys.executable,
        "-m",
        "hpcstack_ops.staged_rebuild.cli",
        "--state-root",
        str(scratch / "state"),
        "--json",
        "rebuild",
        f"--installpath={installpath}",
        f"--eb={timed_eb}",
        f"--module={chainpkgs.LIB}/{chainpkgs.VERSION}",
        "--with-dependants",
        "--backend=userns",
        "--",
        *chainpkgs.EB_ARGS,
        str(new.easyconfig(chainpkgs.LIB)),
    ]
    package_root = checkout.link_package(scratch / "pkg")
    env = dict(env, PYTHONPATH=str(package_root), EASYBUILD_SOURCEPATH=str(new.sources))
    return Chain(installpath, env, argv, record, old.members)


def _rebuild_once(chain: Chain) -> tuple:
    """One chain rebuild, rolled back afterwards: ``(own ns, whole run ns)``."""
    chain.record.unlink(missing_ok=True)
    started = time.monotonic_ns()
    done = _run(chain.argv, chain.env)
    whole = time.monotonic_ns() - started
    result = json.loads(done.stdout)
    published = [entry["module"] for entry in result["modules"]]
    if result.get("state") != "published" or sorted(published) != sorted(chain.modules):
        raise RuntimeError(f"stack_rebuild: the run did not publish the chain {chain.modules}: {result}")
    calls = [tuple(map(int, line.split())) for line in chain.record.read_text().splitlines()]
    build = max(end - start for start, end in calls)
    _run([*chain.argv[:5], "--json", "rollback", result["run_id"]], chain.env)
    return whole - build, whole


def _measure(scratch: Path, dependants: int):
    """The subject's operation: a chain rebuild; it reports its own time and keeps the
    whole run's for the baseline's operation, which runs right after it in the same round."""
    chain = _chain(scratch, dependants)
    kept: list = []

    def own() -> int:
        own_ns, whole_ns = _rebuild_once(chain)
        kept.append(whole_ns)
        return own_ns

    return own, kept


def _case(dependants: int) -> dict:
    """The fields of the case at ``dependants``: its name and its sides."""
    runs: dict = {}

    def subject(scratch: Path):
        own, runs["whole"] = _measure(scratch, dependants)
        return own

    def baseline(_scratch: Path):
        return runs["whole"].pop

    return {
        "name": f"stack_rebuild: ValLib + {dependants} dependants, the tool's own time (goal <= 0.05)",
        "subject": subject,
        "baseline": baseline,
    }


CASES = [
    Case(
        baseline_name="the whole run (same run)",
        rounds=ROUNDS,
        clock=REPORTED,
        smallest=_case(SMALLEST),
        **_case(DEPENDANTS),
    )
]
