"""Run the quality gates of `make test` in order and print one summary line per gate.

    .venv/bin/python tools/gates.py                 # every gate
    .venv/bin/python tools/gates.py ruff-check pytest   # only these
    .venv/bin/python tools/gates.py pytest -- -k smoke  # arguments after -- go to pytest
    .venv/bin/python tools/gates.py --check            # make check: the fast gates and unit

Every gate but ``unit`` runs by default; ``unit`` (the unit tests alone, which ``pytest``
runs too) is the inner loop's, with the fast gates: ``--check`` selects them (``CHECK``).

Every gate runs even when an earlier one failed, so one run shows every problem; the exit
status is 1 when any gate failed. The summary ends with pytest's ten slowest tests, the ten
test files that cost the most CPU seconds (summed over the pytest gates: the two cores are
the limit of a run, see tests/support/cputime.py) and the run's wall time, so a change that
slows the suite shows in every run.

The pytest gate runs one and a half workers per core (three on two cores): a worker spends
about a third of its time waiting on the processes its tests start (Slurm, EasyBuild,
ansible-playbook, a sandbox's retries), and with one worker per core that time left the cores
idle (measured on two cores: 0.71 of them busy with two workers, 0.83 with three). The unit
tests never wait: that gate, and other-cpu's few tests, keep one worker per core.

cluster runs the tests of the namespace cluster (marked ``cluster``) last, in a pytest of
its own, once pytest has ended. They wait on SSH, Slurm and the shared filesystems' daemons
for about a quarter of the time of both cores (measured: 360 CPU seconds in 231 s, 150 CPU
seconds of the cores idle), but beside pytest, which keeps both cores busy, they only
stretch its run and theirs (measured: the whole suite 54 s slower). Three gates run beside
them, one after the other, in that idle time, and nothing of the namespace cluster, whose
nodes have their own network, mount and PID namespaces: other-cpu (some 25 CPU seconds),
whose tests use the single-node Slurm and rollout fixtures of pytest's suite, which run one
at a time and so wait for pytest's end; then the two static gates that take half a minute of
one core each (ansible-sanity, on the built collection alone: see tools/ansible-sanity.sh;
ansible-lint), on idle time alone (tools/idle.py), since nothing in them waits on a clock.
Their output is kept and printed, in gate order, once cluster's has been. A third worker for
the cluster's tests, with a third group, did not help (235 s against 228 s): their waits
leave less idle time than the CPU a third cluster costs. Their two workers take one group of
test files each (``--dist loadgroup``; the groups are in
tests/integration/harness/cluster.py, chosen so that both take about as long) and each makes
a cluster of its own, which its group's tests share: the guard's, the harness's and the
rebuilds as Slurm jobs on one, the shared filesystems', the rebuilds' and the fleet
benchmark's on the other (the benchmark borrows that cluster rather than start one). pytest
leaves them out.

Measured on one machine, from a fresh clone: with the static gates beside pytest, pytest
took 559 to 589 s, the cluster gate 231 s, the whole run 14 min 15 s, and the cores were
idle a quarter of the cluster gate's time; with them beside the cluster gate on idle time,
pytest took 512 and 527 s, the cluster gate 233 and 242 s (its guests done before it: 199
and 216 s), the whole run 12 min 51 s and 13 min 16 s in two runs. The unit tests stay in
pytest's run: on idle time beside the cluster gate they made the whole run 13 min 11 s, and
a test starved there of its core for a second fails on its clock (Hypothesis's health check,
a child's deadline): one did.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

import checkout

REPO = checkout.REPO
sys.path.insert(0, str(REPO))
from tests.support import cputime  # noqa: E402

PYTHON = sys.executable
PYTEST = [PYTHON, "-m", "pytest", "-p", "xdist", "-n", "auto", "--dist", "loadgroup"]
# The whole suite's workers: one and a half per core (see the module's docstring).
SUITE_WORKERS = max(2, len(os.sched_getaffinity(0)) * 3 // 2)
SUITE_PYTEST = [PYTHON, "-m", "pytest", "-p", "xdist", "-n", str(SUITE_WORKERS), "--dist", "loadgroup"]
# Two workers, a group of test files each (tests/integration/harness/cluster.py): a group's
# tests share the cluster its worker made.
CLUSTER_PYTEST = [PYTHON, "-m", "pytest", "-p", "xdist", "-n", "2", "--dist", "loadgroup"]
SLOWEST = 10
# `make check`: the gates that take seconds, and the unit tests (a minute of two cores).
CHECK = ("shellcheck", "ruff-check", "ruff-format", "compile", "types", "changelog", "unit")
# The gates run beside another gate, in a thread, when both are selected (see the module's
# docstring): the gate they run beside, and theirs.
ALONGSIDE = {"cluster": ("other-cpu", "ansible-sanity", "ansible-lint")}
# Run only when named (or by --check): what the default gates check already.
ON_REQUEST = ("unit",)
# The tests that run on this machine's CPU unsimulated and choose "another target" from what
# archdetect says of it (marked ``host_cpu``): run a second time with the CPU simulated as
# another vendor's.
HOST_CPU = "host_cpu"


def _marked(marker: str) -> list[str]:
    """pytest's arguments that run the tests marked ``marker``: the marker, and the test files
    that write ``mark.<marker>``, so that pytest collects those alone. Collecting every file
    to keep 8 tests would cost each worker the collection-time work of the whole suite (the
    fault matrices count their write points then): seconds of CPU, for nothing."""
    tests = [name for name in checkout.tracked_files() if re.fullmatch(r"tests/(.*/)?test_[^/]*\.py", name)]
    files = [name for name in tests if f"mark.{marker}" in (REPO / name).read_text()]
    return ["-m", f"{marker} and not cluster", *files]


@dataclass(frozen=True)
class Gate:
    name: str
    argv: list[str]
    what: str
    # Beside another gate (ALONGSIDE), run on the time its tests leave the cores idle
    # (tools/idle.py), so that they lengthen its run as little as the kernel allows.
    idle: bool = False

    def beside(self) -> Gate:
        """The gate as it runs beside another."""
        if not self.idle:
            return self
        return Gate(self.name, [PYTHON, str(REPO / "tools" / "idle.py"), "--", *self.argv], self.what)


def _shell_scripts() -> list[str]:
    scripts = []
    for name in checkout.tracked_files():
        if name.endswith(".sh"):
            scripts.append(name)
        elif "." not in Path(name).name:
            with open(REPO / name, "rb") as handle:
                if handle.readline().startswith((b"#!/bin/sh", b"#!/bin/bash", b"#!/usr/bin/env bash")):
                    scripts.append(name)
    return scripts


def gates(pytest_args: list[str], reports: Path) -> list[Gate]:
    """The gates in order; each pytest gate writes its test files' CPU seconds into ``reports``."""

    def cpu(name: str) -> str:
        return f"--cpu-report={reports / name}.json"

    return [
        Gate("shellcheck", ["shellcheck", *_shell_scripts()], "shell scripts"),
        Gate("ruff-check", [PYTHON, "-m", "ruff", "check", "."], "lint"),
        Gate("ruff-format", [PYTHON, "-m", "ruff", "format", "--check", "."], "formatting"),
        Gate("compile", [PYTHON, "tools/compile_check.py"], "plugins/ on Python 3.8-3.13"),
        Gate("types", [PYTHON, "-m", "mypy"], "mypy on plugins/module_utils, for Python 3.8"),
        Gate("changelog", [str(Path(PYTHON).parent / "antsibull-changelog"), "lint"], "changelog fragments"),
        # Beside the cluster gate, on idle time: neither has a deadline a slow start could miss.
        Gate("ansible-sanity", ["bash", "tools/ansible-sanity.sh"], "ansible-test sanity", idle=True),
        Gate(
            "ansible-lint", ["bash", "tools/ansible-lint.sh"], "ansible-lint, production profile", idle=True
        ),
        Gate(
            "unit",
            [*PYTEST, f"--durations={SLOWEST}", cpu("unit"), "tests/unit", *pytest_args],
            "the unit tests",
        ),
        Gate(
            "pytest",
            [*SUITE_PYTEST, "-m", "not cluster", f"--durations={SLOWEST}", cpu("pytest"), *pytest_args],
            "unit and integration tests",
        ),
        Gate(
            "other-cpu",
            [PYTHON, "testbed/simulate_cpu.py", "--", *PYTEST, cpu("other-cpu"), *_marked(HOST_CPU)],
            "the host-dependent tests again, this machine's CPU simulated as another vendor's",
        ),
        Gate(
            "cluster",
            [*CLUSTER_PYTEST, "-m", "cluster", f"--durations={SLOWEST}", cpu("cluster"), *pytest_args],
            "the fleet tests, on a namespace cluster of several hosts (testbed/cluster.py)",
        ),
    ]


_SECTION = re.compile(r"^=+ (.*?) =+$")


def _run(gate: Gate, out: Optional[IO[str]] = None) -> tuple[int, str, float, list[str]]:
    """Run the gate, its output to ``out`` (default: streamed to stdout); return its exit
    status, last output line, duration and the lines of pytest's "slowest durations"
    section, if it printed one."""
    out = sys.stdout if out is None else out
    out.write(f"\n==> {gate.name}: {gate.what}\n")
    out.flush()
    started = time.monotonic()
    last = ""
    slowest: list[str] = []
    in_slowest = False
    with subprocess.Popen(
        gate.argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if line.strip():
                last = line.strip()
            section = _SECTION.match(line.strip())
            if section:
                in_slowest = section.group(1).startswith("slowest")
            elif in_slowest and line.strip():
                slowest.append(line.rstrip())
    return proc.returncode, last, time.monotonic() - started, slowest


class _Background:
    """Gates run one after another in a thread, their output kept until it is asked for."""

    def __init__(self, selected: list[Gate]) -> None:
        self.gates = [gate.beside() for gate in selected]
        self.outputs = {gate.name: io.StringIO() for gate in selected}
        self.results: dict[str, tuple[int, str, float, list[str]]] = {}
        self.thread = threading.Thread(target=self._run_all, daemon=True)

    def _run_all(self) -> None:
        for gate in self.gates:
            self.results[gate.name] = _run(gate, self.outputs[gate.name])

    def result(self, gate: Gate) -> tuple[int, str, float, list[str]]:
        self.thread.join()
        sys.stdout.write(self.outputs[gate.name].getvalue())
        sys.stdout.flush()
        return self.results[gate.name]


def _cpu_by_file(reports: Path) -> tuple[dict[str, float], dict[str, int], set[str]]:
    """The CPU seconds and test counts of each test file, summed over the pytest gates' reports."""
    seconds: dict[str, float] = {}
    tests: dict[str, int] = {}
    clocks: set[str] = set()
    for report in sorted(reports.glob("*.json")):
        loaded = json.loads(report.read_text())
        clocks.update(loaded["clock"])
        for name, (used, count) in loaded["files"].items():
            seconds[name] = seconds.get(name, 0.0) + used
            tests[name] = tests.get(name, 0) + count
    return seconds, tests, clocks


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main(argv: list[str]) -> int:
    # The Makefile passes when `make test` started, so that the bootstrap counts too.
    started = float(os.environ.get("HPCSTACK_MAKE_STARTED") or time.time())
    reports = Path(tempfile.mkdtemp(prefix="hpcstack-gates-"))
    try:
        return _main(argv, reports, started)
    finally:
        shutil.rmtree(reports, ignore_errors=True)


def _main(argv: list[str], reports: Path, started: float) -> int:
    pytest_args: list[str] = []
    if "--" in argv:
        pytest_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    if "--check" in argv:
        argv = [name for name in argv if name != "--check"] + list(CHECK)
    selected = gates(pytest_args, reports)
    unknown = sorted(set(argv) - {gate.name for gate in selected})
    if unknown:
        sys.stderr.write(
            f"gates: unknown gate {', '.join(unknown)}; known: {' '.join(g.name for g in selected)}\n"
        )
        return 2
    if argv:
        selected = [gate for gate in selected if gate.name in argv]
    else:
        selected = [gate for gate in selected if gate.name not in ON_REQUEST]

    names = {gate.name for gate in selected}
    backgrounds = {}
    for host, guests in ALONGSIDE.items():
        # In the order ALONGSIDE names them: one after the other.
        beside = [gate for name in guests for gate in selected if gate.name == name]
        if host in names and beside:
            backgrounds[host] = _Background(beside)
    hosted = {gate.name for background in backgrounds.values() for gate in background.gates}
    results = []
    for gate in selected:
        if gate.name in hosted:
            continue
        background = backgrounds.get(gate.name)
        if background:
            background.thread.start()
        results.append((gate, *_run(gate)))
        if background:
            results.extend((other, *background.result(other)) for other in background.gates)
    order = {gate.name: index for index, gate in enumerate(selected)}
    results.sort(key=lambda result: order[result[0].name])
    return _summary(results, reports, started)


def _summary(results, reports: Path, started: float) -> int:
    """Print a line per gate, the slowest tests, the costliest test files and the wall time;
    return the exit status of the run."""
    print("\n==> summary")
    for gate, status, last, seconds, _slowest in results:
        verdict = "passed" if status == 0 else f"FAILED (exit {status})"
        print(f"  {gate.name:<15} {verdict:<16} {seconds:6.1f} s  {last[:90]}")
    slowest = [line for *_rest, lines in results for line in lines]
    if slowest:
        print(f"\n==> the {SLOWEST} slowest tests")
        for line in slowest:
            print(f"  {line}")
    seconds, tests, clocks = _cpu_by_file(reports)
    if seconds:
        print(f"\n==> the {SLOWEST} test files with the most CPU seconds")
        for line in cputime.table(seconds, tests, SLOWEST, clocks):
            print(f"  {line}")
    took = _minutes(time.time() - started)
    run = os.environ.get("HPCSTACK_MAKE_TARGET", "gates")
    failed = [gate.name for gate, status, _last, _seconds, _slowest in results if status != 0]
    if failed:
        print(f"{run}: {len(failed)} of {len(results)} gates failed: {', '.join(failed)}; {took}")
        return 1
    print(f"{run}: all {len(results)} gates passed in {took}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
