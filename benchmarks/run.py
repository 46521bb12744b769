"""`make bench`: run every benchmarks/bench_*.py and print each case beside its baseline.

    .venv/bin/python benchmarks/run.py [--once] [--cluster DIR] [NAME-SUBSTRING | bench_FILE ...]

``--once`` runs every case once at its smallest size (``benchlib``): the tables are printed
as usual, their figures mean nothing. ``make test`` runs each benchmark so
(``tests/integration/tooling/test_benchmarks.py``), so that a change that breaks one fails there.
``--cluster DIR`` has the fleet cases measure on the namespace cluster already running in
DIR (``testbed/cluster.py``), at their first size only (that many of its compute nodes),
instead of starting clusters of their own (the cluster tests lend theirs so); they leave it
as they found it.

Timing cases (``Case``, and ``Comparison`` with a row per subject) make the first table.
The ratio is subject median / baseline median from the same run: below 1 the subject is
faster. Absolute times vary between machines; the ratio is the figure to compare.

Window cases (``WindowCase``) make the second table: one row per method, the subject first,
each with the reads a separate reader process made of the live path during the cycles, how
many found it missing or the tree partial, and the longest such window. There the ratio is
the subject's longest window / the baseline's, from the same run: 0 means the subject left
no window at all. The counts of different methods are not divided into each other, because
each method runs for its own time and so gets its own number of reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools"), str(HERE.parent / "testbed")]

import checkout  # noqa: E402
from benchlib import (  # noqa: E402
    CPU,
    MISSING,
    OK,
    PARTIAL,
    REPORTED,
    WALL,
    Case,
    Comparison,
    FleetCase,
    WindowCase,
)

READER_TIMEOUT = 30
# Where window cases make their trees: the filesystem is what they measure (see _window_root).
WINDOW_DIR_ENV = "HPCSTACK_BENCH_WINDOW_DIR"
# Each method's scratch is a private mkdtemp directory inside it, not a fixed name.
TMPFS = "/dev/shm"  # noqa: S108


def _subjects(case):
    """``(row name, factory)`` of each subject of a timing case."""
    if isinstance(case, Comparison):
        return [(f"{case.name}: {subject.name}", subject.factory) for subject in case.subjects]
    return [(case.name, case.subject)]


def _children_cpu_ns() -> int:
    """User and system CPU of every child this process has waited for, in ns."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((used.ru_utime + used.ru_stime) * 1e9)


_CLOCKS = {WALL: time.perf_counter_ns, CPU: _children_cpu_ns, REPORTED: None}


def _time_rounds(case, factories):
    """The median ns of each of ``factories``' operations, interleaved round by round, on the
    case's clock (wall time, the CPU time of the children an operation waited for, or what
    the operation reported)."""
    clock = _CLOCKS[case.clock]
    with contextlib.ExitStack() as scratches:

        def scratch():
            return Path(scratches.enter_context(tempfile.TemporaryDirectory()))

        shared = () if case.setup is None else (case.setup(scratch()),)
        operations = [factory(scratch(), *shared) for factory in factories]
        samples = [[] for _operation in operations]
        for _round in range(case.rounds):
            for operation, taken in zip(operations, samples):
                if clock is None:  # REPORTED: the operation returns what it measured
                    taken.append(operation())
                    continue
                started = clock()
                operation()
                taken.append(clock() - started)
    return [statistics.median(taken) for taken in samples]


def _watch(read, live, stop, report):
    """The reader process: send the first verdict, read until ``stop``, send the tally.

    The tally is ``(counts by verdict, longest bad window in ns)``; a window runs from the
    start of the first of consecutive bad reads to the end of the last of them.
    """
    report.send(read(live))
    counts = {OK: 0, MISSING: 0, PARTIAL: 0}
    longest, bad_since = 0, None
    while not stop.is_set():
        started = time.monotonic_ns()
        verdict = read(live)
        ended = time.monotonic_ns()
        counts[verdict] += 1
        if verdict == OK:
            bad_since = None
        else:
            bad_since = started if bad_since is None else bad_since
            longest = max(longest, ended - bad_since)
    report.send((counts, longest))
    report.close()


def _window_root():
    """``$HPCSTACK_BENCH_WINDOW_DIR``, else tmpfs (/dev/shm) if writable, else the temp dir.

    What a reader sees does not depend on fsync, which only makes a change durable, but the
    subject fsyncs its journal dozens of times a cycle: on tmpfs 200 cycles fit the time
    budget of ``make bench``. Point the variable at the filesystem of a real software root
    to measure that one (whether it can exchange directories is printed in the table).
    """
    chosen = os.environ.get(WINDOW_DIR_ENV)
    if chosen:
        return chosen
    if os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK | os.X_OK):
        return TMPFS
    return None


def _measure_window(case, method):
    """Run ``method``'s cycles under a reader; return ``(counts, longest_ns, elapsed_ns, note)``."""
    # fork: the reader needs the case's read function, not a re-import of this runner.
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="hpcstack-window-", dir=_window_root()) as scratch:
        replacer = method.setup(Path(scratch))
        stop = context.Event()
        results, report = context.Pipe(duplex=False)
        reader = context.Process(target=_watch, args=(case.read, replacer.live, stop, report), daemon=True)
        reader.start()
        report.close()  # so that a dead reader reads as EOFError, not a hang
        try:
            first = results.recv()
            if first != OK:
                raise RuntimeError(
                    f"{case.name}: before any cycle, {method.name} left {replacer.live} {first}"
                )
            started = time.perf_counter_ns()
            for cycle in range(case.cycles):
                replacer.cycle(cycle)
            elapsed = time.perf_counter_ns() - started
            stop.set()
            counts, longest = results.recv()
        finally:
            stop.set()
            reader.join(READER_TIMEOUT)
            if reader.is_alive():
                reader.kill()
                reader.join()
            results.close()
        return counts, longest, elapsed, replacer.note()


def _format_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def _timing_rows(cases):
    rows = [("benchmark", "median", "baseline", "median", "ratio")]
    for case in cases:
        subjects = _subjects(case)
        *medians, baseline = _time_rounds(case, [factory for _name, factory in subjects] + [case.baseline])
        for (name, _factory), subject in zip(subjects, medians):
            rows.append(
                (
                    name,
                    _format_ns(subject),
                    case.baseline_name,
                    _format_ns(baseline),
                    f"{subject / baseline:.2f}",
                )
            )
    return rows


def _window_rows(cases):
    rows = [
        ("benchmark", "method", "cycles", "time", "reads", "missing", "partial", "longest window", "ratio")
    ]
    for case in cases:
        subject_longest = None
        for index, method in enumerate((case.subject, *case.baselines)):
            counts, longest, elapsed, note = _measure_window(case, method)
            if subject_longest is None:
                subject_longest, ratio = longest, "subject"
            else:
                ratio = f"{subject_longest / longest:.2f}" if longest else "n/a (no window)"
            rows.append(
                (
                    case.name if index == 0 else "",
                    f"{method.name} ({note})" if note else method.name,
                    str(case.cycles),
                    _format_ns(elapsed),
                    str(sum(counts.values())),
                    str(counts[MISSING]),
                    str(counts[PARTIAL]),
                    _format_ns(longest) if longest else "none",
                    ratio,
                )
            )
    return rows


def _fleet_rows(case):
    """One row per floor and step of a fleet case: its seconds at each size (a step's also as
    a ratio to that size's floor), its growth from the smallest size to the largest (a step's
    also over the floor's growth: 1 where hosts are worked on as much in parallel as the
    floor's, more where a play adds serial work), and its goals, met or missed."""
    figures = {size: case.measure(size, case.rounds) for size in case.sizes}
    smallest, largest = case.sizes[0], case.sizes[-1]
    header = ["benchmark"]
    for size in case.sizes:
        header += [f"{size} nodes", "x floor"]
    rows = [(*header, f"{largest}/{smallest}", "/ floor's", "goal")]
    floor = {size: sum(figures[size][name] for name in case.floors) for size in case.sizes}
    floor_growth = floor[largest] / floor[smallest]
    lines = [(name, None) for name in case.floors] + [(step.name, step) for step in case.steps]
    for name, step in lines:
        cells = [f"{case.name}: {name}" if step else f"{case.name}: floor: {name}"]
        for size in case.sizes:
            seconds = figures[size][name]
            cells += [f"{seconds:.1f} s", f"{seconds / floor[size]:.2f}" if step else ""]
        growth = figures[largest][name] / figures[smallest][name]
        cells += [f"{growth:.2f}", f"{growth / floor_growth:.2f}" if step else ""]
        cells.append(_fleet_goal(step, figures[smallest][name], growth) if step else "")
        rows.append(tuple(cells))
    return rows


def _fleet_goal(step, seconds, growth):
    """``<= 30 s, <= 1.5x: met`` (or ``missed``), or "" for a step without goals."""
    parts, met = [], True
    if step.goal is not None:
        parts.append(f"<= {step.goal:g} s")
        met = met and seconds <= step.goal
    if step.growth is not None:
        parts.append(f"<= {step.growth:g}x")
        met = met and growth <= step.growth
    return f"{', '.join(parts)}: {'met' if met else 'missed'}" if parts else ""


def _print_table(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


WINDOW_HEADER = """\
Reader-visible windows: a separate process reads the live path in a loop during the cycles.
missing: the path was not there; partial: the tree there was not one whole generation;
longest window: from the start of the first to the end of the last of consecutive bad reads;
ratio: the subject's longest window / the baseline's, same run (0.00: the subject left none)."""


def at_smallest(case):
    """``case`` as ``--once`` runs it: one round, one cycle, or its first size with one round
    of each floor, and what its ``smallest`` changes beyond that."""
    if isinstance(case, FleetCase):
        once = {"sizes": tuple(case.sizes[:1]), "rounds": 1}
    elif isinstance(case, WindowCase):
        once = {"cycles": 1}
    else:
        once = {"rounds": 1}
    return dataclasses.replace(case, **{**once, **case.smallest})


def on_cluster(case, root: Path):
    """The fleet ``case`` measured on the running cluster in ``root``, at its first size."""
    size = case.sizes[0]
    legend = f"{case.legend}\nMeasured on {size} compute nodes of the running cluster in {root}."
    return dataclasses.replace(
        case,
        sizes=(size,),
        measure=lambda size, rounds: case.measure_on(root, size, rounds),
        legend=legend,
    )


def main(argv: list[str]) -> int:
    once = "--once" in argv
    words = [word for word in argv if word != "--once"]
    borrowed = None
    if "--cluster" in words:
        at = words.index("--cluster")
        borrowed = Path(words[at + 1])
        del words[at : at + 2]
    with tempfile.TemporaryDirectory(prefix="hpcstack-bench-") as tmp:
        sys.path.insert(0, str(checkout.link_package(Path(tmp))))
        cases = []
        for path in sorted(HERE.glob("bench_*.py")):
            chosen = importlib.import_module(path.stem).CASES
            if words and path.stem not in words:
                chosen = [case for case in chosen if any(word in case.name for word in words)]
            cases.extend(at_smallest(case) if once else case for case in chosen)
        timing = [case for case in cases if isinstance(case, (Case, Comparison))]
        windows = [case for case in cases if isinstance(case, WindowCase)]
        fleets = [case for case in cases if isinstance(case, FleetCase)]
        if borrowed is not None:
            fleets = [on_cluster(case, borrowed) for case in fleets]
        # Each table printed as soon as it is measured: the fleet's takes minutes.
        tables = [(timing, "", _timing_rows), (windows, WINDOW_HEADER, _window_rows)]
        tables += [([fleet], fleet.legend, lambda cases: _fleet_rows(cases[0])) for fleet in fleets]
        printed = False
        for chosen, legend, rows in tables:
            if not chosen:
                continue
            table = rows(chosen)
            if printed:
                print()
            if legend:
                print(legend)
            _print_table(table)
            sys.stdout.flush()
            printed = True
    return 0 if cases else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
