"""What a benchmark is: an operation timed beside its baseline in the same run.

A benchmark file ``benchmarks/bench_<topic>.py`` defines ``CASES``, a list of ``Case``.
Each side is a factory: given a fresh scratch directory it prepares what it needs and
returns the zero-argument operation to time. The runner interleaves the two sides round by
round, so drift in the machine's speed hits both alike, and reports medians and their ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

Operation = Callable[[], None]


@dataclass(frozen=True)
class Case:
    name: str
    subject: Callable[[Path], Operation]
    baseline_name: str
    baseline: Callable[[Path], Operation]
    rounds: int = 2000
