"""CPU seconds per test and per test file: where the suite's cost goes.

The two cores are the limit of a run, so a test's cost is the CPU it makes the machine
spend, not its wall time (a test that waits on Slurm for 20 s costs little; one that builds
a thousand journals costs much). A test's figure is the CPU used, from the start of its
set-up to the end of its teardown, by the process that runs it and everything that process
starts, including daemons (Slurm, munge, a namespace cluster's nodes) and the jobs they
run, which ``getrusage`` never sees (they are not waited for by the test's process).

That is a cgroup's count: the process that runs the tests (each xdist worker, or pytest
itself) moves into a cgroup of its own, a child of the one it is in, on the cgroup v2
hierarchy, and everything it starts stays in it. Where no cgroup can be made (no cgroup v2
mounted, not root), the clock is ``getrusage`` of the process and its waited-for children,
and the report says so. A session fixture's set-up is counted to the first test that uses
it, its teardown to the last test of the process.

Options: ``--cpu-files=N`` prints the N test files with the most CPU seconds at the end;
``--cpu-report=PATH`` writes every file's and every test's figure as JSON (``tools/gates.py`` adds up those of
its pytest gates).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest

PROPERTY = "cpu_seconds"


def _cgroup2_mount() -> Optional[Path]:
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            # mount ID, parent, major:minor, root, mount point, options, optional..., -, type
            if fields[fields.index("-") + 1] == "cgroup2":
                return Path(fields[4])
    return None


def _own_cgroup2() -> Optional[str]:
    with open("/proc/self/cgroup") as groups:
        for line in groups:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


class CgroupClock:
    """The CPU of a cgroup made for this process, which it and its descendants live in."""

    name = "cgroup"

    def __init__(self) -> None:
        mount, own = _cgroup2_mount(), _own_cgroup2()
        if mount is None or own is None:
            raise OSError("no cgroup v2 hierarchy")
        self.parent = mount / own.lstrip("/")
        self.path = self.parent / f"hpcstack-tests-{os.getpid()}"
        self.path.mkdir()
        try:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
            self.read()
        except OSError:
            self.path.rmdir()
            raise

    def read(self) -> float:
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"{self.path}/cpu.stat has no usage_usec")

    def close(self) -> None:
        # Back to the cgroup it came from, with whatever is left in this one, so that the
        # cgroup can go: an empty cgroup is removed by rmdir.
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.parent / "cgroup.procs").write_text(pid)
            self.path.rmdir()


class RusageClock:
    """This process's CPU and that of its children once they have been waited for."""

    name = "getrusage: daemons and unwaited children not counted"

    def read(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def close(self) -> None:
        pass


def _clock():
    try:
        return CgroupClock()
    except OSError:
        return RusageClock()


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class CpuTime:
    """The plugin: measures where tests run, adds up where reports arrive (xdist's controller)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.clock = None
        self.started: dict[str, float] = {}
        self.files: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)
        self.clock_names: set[str] = set()
        self.by_test: dict[str, float] = {}

    # -- where the tests run
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.clock is None:
            self.clock = _clock()
        self.started[nodeid] = self.clock.read()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.started:
            used = self.clock.read() - self.started.pop(item.nodeid)
            outcome.get_result().user_properties.append((PROPERTY, (used, self.clock.name)))

    def pytest_unconfigure(self) -> None:
        if self.clock is not None:
            self.clock.close()

    # -- where the reports arrive
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == PROPERTY:
                used, clock_name = value
                self.files[file_of(report.nodeid)] += used
                self.tests[file_of(report.nodeid)] += 1
                self.by_test[report.nodeid] = used
                self.clock_names.add(clock_name)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        path = self.config.getoption("cpu_report")
        if path:
            Path(path).write_text(
                json.dumps(
                    {
                        "clock": sorted(self.clock_names),
                        "files": {name: [self.files[name], self.tests[name]] for name in self.files},
                        "tests": self.by_test,
                    }
                )
            )
        count = self.config.getoption("cpu_files")
        if count and self.files:
            terminalreporter.write_sep("=", f"the {count} test files with the most CPU seconds")
            for line in table(self.files, self.tests, count, self.clock_names):
                terminalreporter.write_line(line)


def table(files: dict[str, float], tests: dict[str, int], count: int, clock_names) -> list[str]:
    """The ``count`` costliest files, one line each, and a line with the total."""
    ranked = sorted(files, key=files.__getitem__, reverse=True)
    lines = [f"{files[name]:8.1f} s  {tests[name]:5d} tests  {name}" for name in ranked[:count]]
    lines.append(
        f"{sum(files.values()):8.1f} s  {sum(tests.values()):5d} tests  in all {len(files)} files"
        f" (CPU of the tests' processes and what they start; clock: {', '.join(sorted(clock_names))})"
    )
    return lines


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cputime", "CPU seconds per test file")
    group.addoption("--cpu-files", type=int, default=0, metavar="N", help="print the N costliest test files")
    group.addoption(
        "--cpu-report", default=None, metavar="PATH", help="write every file's CPU seconds as JSON"
    )
