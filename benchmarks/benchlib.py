"""What a benchmark is: an operation measured beside its baseline in the same run.

A benchmark file ``benchmarks/bench_<topic>.py`` defines ``CASES``, a list of ``Case`` and
``WindowCase``.

A ``Case`` times an operation. Each side is a factory: given a fresh scratch directory it
prepares what it needs and returns the zero-argument operation to time. The runner
interleaves the two sides round by round, so drift in the machine's speed hits both alike,
and reports medians and their ratio. A case with a ``setup`` has it make, once, what both
sides work on (in a scratch directory of its own); each factory then gets its result as a
second argument. A ``Comparison`` is the same with several subjects beside one baseline:
one row, and one ratio, per subject.

A ``FleetCase`` times plays over SSH on clusters of several sizes. Its ``measure(size)``
starts a cluster of that many nodes, runs the floors and then the steps once each, in order
(a first install can run only once on a cluster), checks that each did what it should, and
returns the seconds of each by name. The runner prints a row per floor and per step: its time
at each size, a step's ratio to the floor of the same cluster (the sum of the floors: what
any play to these hosts costs at the least), and the growth from the smallest size to the
largest, beside the step's goals.

Every kind of case also runs once at its smallest size (``run.py --once``; ``make test``
does, so that a change that breaks a benchmark's code path fails there): one round, one
cycle, its first size. A case's ``smallest`` names what else to change for that run (a
smaller tree to make, the cycles that reach every path of a method), as field values.

A ``WindowCase`` measures what a reader of a live path sees while a tree there is replaced
and put back ``cycles`` times. Each ``Method`` (the subject, then each baseline) gets a
fresh scratch directory, in which its ``setup`` makes the live tree and returns a
``Replacer``. A separate reader process, started before the first cycle and stopped after
the last, calls the case's ``read`` on the live path in a tight loop; each call is one read,
classified ``OK``, ``MISSING`` or ``PARTIAL``. The runner reports, per method, the count of
each and the longest window: the time from the start of the first of consecutive bad reads
to the end of the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

Operation = Callable[[], None]
# What a timing case measures of each operation: its wall time, or the CPU time (user and
# system) of the child processes it started and waited for, theirs included.
WALL = "wall"
CPU = "cpu"
# Or what the operation measured itself and returned, in ns: a part of a run that no clock
# around the whole operation can tell apart (the tool's own time beside EasyBuild's).
REPORTED = "reported"
# Given a fresh scratch directory (and, with a setup, its result): the operation to time.
Factory = Callable[..., Operation]

# The verdicts of one read of a live path.
OK = "ok"  # one whole generation of the tree
MISSING = "missing"  # the live path itself was not there
PARTIAL = "partial"  # the path was there, the tree was not whole: files missing, torn or mixed


@dataclass(frozen=True)
class Case:
    name: str
    subject: Factory
    baseline_name: str
    baseline: Factory
    rounds: int = 2000
    # Called once with its own scratch directory before the factories; its result is the
    # factories' second argument (the one tree both sides read, say).
    setup: Optional[Callable[[Path], Any]] = None
    clock: str = WALL
    # The run of ``run.py --once``, beyond one round (one cycle, the first size): field values.
    smallest: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Subject:
    name: str
    factory: Factory


@dataclass(frozen=True)
class Comparison:
    """Several subjects timed beside one baseline in the same run, which they all share.

    Every round runs each subject, then the baseline; each subject's row reports its median
    and the ratio to the baseline's median. ``name`` prefixes the subjects' names.
    """

    name: str
    subjects: Sequence[Subject]
    baseline_name: str
    baseline: Factory
    rounds: int = 3
    setup: Optional[Callable[[Path], Any]] = None
    clock: str = WALL
    # The run of ``run.py --once``, beyond one round (one cycle, the first size): field values.
    smallest: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetStep:
    name: str
    # At most this many seconds on the smallest cluster, and at most ``growth`` times that on
    # the largest (None: no goal).
    goal: Optional[float] = None
    growth: Optional[float] = None


@dataclass(frozen=True)
class FleetCase:
    name: str
    sizes: Sequence[int]
    floors: Sequence[str]
    steps: Sequence[FleetStep]
    # Given a size and the rounds of each floor: the seconds of every floor (the median of its
    # rounds) and step, by name, on a cluster of that size.
    measure: Callable[[int, int], Mapping[str, float]]
    # Printed above the table: what the sizes count, the connection settings.
    legend: str = ""
    # The run of ``run.py --once``, beyond one round (one cycle, the first size): field values.
    smallest: Mapping[str, Any] = field(default_factory=dict)
    # Given the directory of a running cluster (``run.py --cluster``), a size and the rounds:
    # the same seconds on that many of its compute nodes, the cluster left as it was found.
    measure_on: Optional[Callable[[Path, int, int], Mapping[str, float]]] = None
    # How many times each floor runs (its figure the median); ``--once``: one.
    rounds: int = 3


@dataclass(frozen=True)
class Replacer:
    """A prepared live tree and the way one method replaces it.

    ``cycle(n)`` puts generation ``n`` at ``live`` and then the previous tree back (a publish
    and its rollback, or the nearest a baseline has). ``note()``, called after the cycles,
    may name a condition the reader of the table must know (the swap method used).
    """

    live: Path
    cycle: Callable[[int], None]
    note: Callable[[], str] = str


@dataclass(frozen=True)
class Method:
    name: str
    setup: Callable[[Path], Replacer]


@dataclass(frozen=True)
class WindowCase:
    """Readers' gaps at a live path: the subject's method beside each baseline's.

    ``read(live)`` runs in the reader process and returns ``OK``, ``MISSING`` or ``PARTIAL``;
    the runner refuses the case if the first read, before any cycle, is not ``OK``.
    """

    name: str
    read: Callable[[Path], str]
    subject: Method
    baselines: Sequence[Method]
    cycles: int = 200
    # The run of ``run.py --once``, beyond one round (one cycle, the first size): field values.
    smallest: Mapping[str, Any] = field(default_factory=dict)
