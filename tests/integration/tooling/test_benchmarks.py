"""Every benchmark of ``make bench`` runs once at its smallest size (``benchmarks/run.py
--once``), so that a change that breaks a benchmark's code path fails the suite, not the
next ``make bench``. The figures of such a run mean nothing; what is checked is that the run
ends, prints a row for every case, and that the publish window's subject still leaves no
reader a missing or partial tree (the tool's headline, which a one-cycle run shows too).

The fleet benchmark runs in the cluster gate, on the cluster the cluster tests share
(``run.py --cluster``) rather than on one of its own: it must give it back as it found it.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import checkout
from tests.integration.harness.cluster import STORAGE_GROUP

SLURM_CONF = "/etc/slurm/slurm.conf"
# What the arch_guard and build_host roles install on a node, and the benchmark's own files.
GUARD_AND_BUILD_HOST = (
    "/opt/hpcstack/arch-guard",
    "/var/lib/hpcstack/arch-guard/previous-task-prolog.json",
    "/opt/hpcstack/eb-staged-rebuild",
    "/usr/local/bin/eb-staged-rebuild",
    "/opt/apps",
    "/var/tmp/fleet-floor-0.tar",
)

BENCHMARKS = checkout.REPO / "benchmarks"
RUN = BENCHMARKS / "run.py"
FLEET = "bench_fleet"
ON_THIS_HOST = sorted(path.stem for path in BENCHMARKS.glob("bench_*.py") if path.stem != FLEET)
# The isolation benchmark's EasyBuild in bubblewrap alone retries for about 12 s per build.
RUN_TIMEOUT = 900
_CELLS = re.compile(r" {2,}")


@pytest.fixture
def bench_path(monkeypatch, package_root):
    """``import`` finds the benchmarks and this checkout's package, as ``run.py`` sets them up."""
    monkeypatch.syspath_prepend(str(package_root))
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def _cases(stem):
    """The benchmark file's cases, as ``run.py`` imports them."""
    return importlib.import_module(stem).CASES


def _row_names(case, run):
    """The first cell of each row the case prints (the window table's methods instead)."""
    if isinstance(case, run.WindowCase):
        return [method.name for method in (case.subject, *case.baselines)]
    if isinstance(case, run.FleetCase):
        return [f"{case.name}: floor: {floor}" for floor in case.floors] + [
            f"{case.name}: {step.name}" for step in case.steps
        ]
    return [name for name, _factory in run._subjects(case)]


def _assert_runs_once(stem, *options):
    done = subprocess.run(
        [sys.executable, str(RUN), "--once", *options, stem],
        cwd=checkout.REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, (
        f"{stem}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _assert_every_row(stem, stdout):
    run = importlib.import_module("run")
    cases = _cases(stem)
    assert cases, f"{stem} has no cases"
    printed = stdout.splitlines()
    for case in cases:
        for name in _row_names(run.at_smallest(case), run):
            assert any(name in line for line in printed), f"{stem}: no row for {name!r}\n{stdout}"


def _window_cells(stdout, method):
    """The cells of the window table's row of ``method``: benchmark, method, cycles, time,
    reads, missing, partial, longest window, ratio (the benchmark's cell empty after its first row)."""
    for line in stdout.splitlines():
        cells = _CELLS.split(line.strip())
        if method in line and len(cells) >= 8:
            return cells[-8:]
    raise AssertionError(f"no window row for {method!r}\n{stdout}")


@pytest.mark.parametrize("stem", ON_THIS_HOST)
def test_the_benchmark_runs_once_at_its_smallest_size_and_prints_every_row(stem, bench_path):
    stdout = _assert_runs_once(stem)
    _assert_every_row(stem, stdout)
    if stem == "bench_publish_window":
        (case,) = _cases(stem)
        method, _cycles, _time, reads, missing, partial, longest, _ratio = _window_cells(
            stdout, case.subject.name
        )
        assert int(reads) > 0, stdout
        assert (missing, partial, longest) == ("0", "0", "none"), (
            f"the exchange left a window: {method}\n{stdout}"
        )


@pytest.mark.cluster
@pytest.mark.xdist_group(STORAGE_GROUP)
def test_the_fleet_benchmark_runs_once_on_the_suite_s_cluster_prints_every_row_and_gives_it_back(
    bench_path, cluster
):
    confs = [node for node in cluster.nodes if node.spec.role != "build"]
    before = {node.name: node.read(SLURM_CONF) for node in confs}

    stdout = _assert_runs_once(FLEET, "--cluster", str(cluster.root))

    _assert_every_row(FLEET, stdout)
    (case,) = _cases(FLEET)
    (size,) = case.smallest["sizes"]
    assert f"Measured on {size} compute nodes of the running cluster in {cluster.root}." in stdout, stdout
    assert f"{size} nodes" in stdout, stdout
    # Given back: every slurm.conf as it was, nothing of either role left on a compute node.
    assert {node.name: node.read(SLURM_CONF) for node in confs} == before
    for node in cluster.by_role("compute"):
        left = node.run(["ls", "-d", *GUARD_AND_BUILD_HOST], check=False).stdout.split()
        assert left == [], (node.name, left)
