"""`make bench`: run every benchmarks/bench_*.py and print each case beside its baseline.

    .venv/bin/python benchmarks/run.py [NAME-SUBSTRING ...]

The ratio is subject median / baseline median from the same run: below 1 the subject is
faster. Absolute times vary between machines; the ratio is the figure to compare.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools")]

import checkout  # noqa: E402


def _time_rounds(case):
    with tempfile.TemporaryDirectory() as subject_dir, tempfile.TemporaryDirectory() as baseline_dir:
        subject = case.subject(Path(subject_dir))
        baseline = case.baseline(Path(baseline_dir))
        subject_ns, baseline_ns = [], []
        for _round in range(case.rounds):
            for operation, samples in ((subject, subject_ns), (baseline, baseline_ns)):
                started = time.perf_counter_ns()
                operation()
                samples.append(time.perf_counter_ns() - started)
    return statistics.median(subject_ns), statistics.median(baseline_ns)


def _format_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="hpcstack-bench-") as tmp:
        sys.path.insert(0, str(checkout.link_package(Path(tmp))))
        cases = []
        for path in sorted(HERE.glob("bench_*.py")):
            cases.extend(importlib.import_module(path.stem).CASES)
        cases = [case for case in cases if not argv or any(word in case.name for word in argv)]
        rows = [("benchmark", "median", "baseline", "median", "ratio")]
        for case in cases:
            subject, baseline = _time_rounds(case)
            rows.append(
                (
                    case.name,
                    _format_ns(subject),
                    case.baseline_name,
                    _format_ns(baseline),
                    f"{subject / baseline:.2f}",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0 if cases else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
