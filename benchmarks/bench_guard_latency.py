"""What eessi-arch-guard adds to a task's start: the TaskProlog, four ways, in one run, and
what the cold reload and a step of 64 tasks cost against their floors.

Slurm runs the TaskProlog for every task of every step, 128 of them at once on a big node,
and the task waits for it. Each way is timed as the wall time of the guard's process (or,
for the last, of 64 processes), beside the bare interpreter it runs with, ``python3 -IS -c
pass``, the floor of any Python prolog:

- cache hit: a task of a step whose cache already holds the decision (a reload, as the
  other 63 tasks of a mismatched step read it);
- cold match: the first task of a step whose EESSI is loaded for this node: both archdetect
  runs, nothing to reload, the "no change" decision published;
- cold reload: the first task of a step that inherited EESSI for another CPU: both
  archdetect runs, then the restore helper (Lmod unloads and loads EESSI and the two user
  modules), the decision published;
- 64 concurrent: 64 tasks of one step (same job, step and node, ``SLURM_LOCALID`` 0 to 63)
  started at once in a mismatched environment, until the slowest exits.

Two more cases set the cold reload beside its floor: one bash with the same task
environment that runs EESSI's two archdetect calls, one Lmod call unloading EESSI and one
loading every module the task had (``FLOOR_SCRIPT``; goal: at most 1.2x), and the same floor
with the load in two calls, EESSI's module and then the rest, as the guard loads them so
that EESSI's SitePackage hooks apply to the modules after it (``FLOOR_WITH_HOOKS_SCRIPT``).
Another sets the 64 concurrent tasks beside one cold reload decision, as does the floor of
that figure on this machine: 64 bare interpreters started the same way (with fewer CPUs
than tasks, the interpreters queue for them). Goals: cache hit at most 1.5x the bare
interpreter, 64 concurrent tasks at most 1.5x one cold decision. The last measures CPU
time instead of wall time (user and system, of every process the tasks started): the 64
concurrent tasks against what they need at the least, one cold reload and
then 63 cache hits one after another; goal: at most 1.2x. On a node with fewer CPUs than
tasks the wall-time ratio says how the tasks queue; the CPU-time ratio says what the step's
waiting for its first task costs.

The guard runs as a node without an installation runs it, ``python3 -IS`` with the
checkout's ``module_utils`` on ``sys.path`` as the package ``hpcstack_ops``, with the real
interpreter behind this one (the venv's ``python`` is a link to it). The EESSI-like prefix
(``testbed/eessilike.py``) has two CPU targets: the one the archdetect stand-in selects for
this machine's real ``/proc/cpuinfo``, and another of the same architecture, the "login
node" of the mismatched jobs. The user's login loads ``EESSI`` and two user modules, with
the machine's real Lmod. Every cold run gets a fresh cache directory (``TMPDIR``) so it is
the step's first task. Before timing, each way is run once and checked: its output, and how
often archdetect ran (none for a hit; for 64 tasks, as often as for one cold decision).

Once per run the cache-hit path is also run under ``python3 -X importtime``: the modules it
imports beyond the bare interpreter's are printed, largest first, with a check that none of
the slow ones (``os``, ``re``, ``json``, ``argparse``, ``subprocess``, ``signal``, ``hashlib``) is
among them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import checkout
import eessilike
import stackenv
from benchlib import CPU, Comparison, Subject

ROUNDS = 15
CONCURRENT_ROUNDS = 10
TASKS = 64
GOAL = 1.5
FLOOR_GOAL = 1.2
# 64 tasks on this many CPUs: with fewer CPUs than tasks their interpreters queue for them.
CPUS = len(os.sched_getaffinity(0))
# The interpreter behind the venv's python, as a node's TaskProlog would name it.
PYTHON = os.path.realpath(sys.executable)
BARE = (PYTHON, "-IS", "-c", "pass")
# Modules the cached-decision path must not import: each costs milliseconds per task.
SLOW_MODULES = ("os", "re", "json", "argparse", "subprocess", "signal", "hashlib")
IMPORTS_SHOWN = 12
RUN_TIMEOUT = 120
RUNLOG = "EESSI_ARCHDETECT_STANDIN_RUNLOG"
ARCHDETECT_RUNS = 2  # cpupath and accelpath, for a decision without a reload
RELOADED = b"export EESSI_ARCH_GUARD_RELOADED="
# The step every task belongs to; each cold round gets its own TMPDIR, so its own cache.
STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "bench-node"}


class BenchError(Exception):
    """The guard did not do what the benchmark times."""


@dataclass
class Site:
    """The guard's package, and the task environments of a matching and a mismatched job."""

    package_root: Path
    matching: dict  # a login on this node: EESSI selected what this node selects
    mismatched: dict  # a login on the other target's node, run on this one
    scratch: Path
    _made: int = 0

    def argv(self) -> list:
        return checkout.guard_argv(PYTHON, self.package_root)

    def fresh(self, label: str) -> Path:
        """A new, empty directory; as TMPDIR, the task that uses it is its step's first."""
        self._made += 1
        directory = self.scratch / f"{label}-{self._made}"
        directory.mkdir()
        return directory

    def archdetect_runs(self, env: dict) -> tuple:
        """Run the guard once with the stand-in's run log on: its stdout, and the runs logged."""
        log = self.fresh("runlog") / "runs"
        log.touch()
        done = _run(self.argv(), dict(env, **{RUNLOG: str(log)}))
        return done.stdout, len(log.read_text().splitlines())


def _run(argv, env) -> subprocess.CompletedProcess:
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT, check=False
    )
    if done.returncode != 0 or done.stderr:
        message = done.stderr.decode(errors="replace")[-2000:]
        raise BenchError(f"guard_latency: {argv[0]} exited {done.returncode}: {message}")
    return done


def _this_node() -> tuple:
    """This machine as a node: its variables, its target and one it cannot use."""
    node = {
        "EESSI_PROC_CPUINFO": "/proc/cpuinfo",
        "EESSI_MACHINE_TYPE": os.uname().machine,
        eessilike.GPU_VARIABLE: "",
    }
    try:
        return (node, *eessilike.node_and_elsewhere(node))
    except eessilike.EessiLikeError as err:
        raise BenchError(f"guard_latency: the archdetect stand-in failed for /proc/cpuinfo: {err}") from None


def make_site(scratch: Path) -> Site:
    """The EESSI-like prefix with this node's target and another, and a login on each."""
    lmod = stackenv.find_lmod()
    node, here, there = _this_node()
    prefix = eessilike.build_prefix(scratch / "eessi", targets=(here, there), accel={})
    login_here = eessilike.login_environment(lmod, prefix, node)
    login_there = eessilike.login_environment(lmod, prefix, prefix.node_env(there))
    selected = (login_here.get("EESSI_SOFTWARE_SUBDIR"), login_there.get("EESSI_SOFTWARE_SUBDIR"))
    if selected != (here, there):
        raise BenchError(f"guard_latency: the logins selected {selected}, not {(here, there)}")
    work = scratch / "rounds"
    work.mkdir()
    return Site(
        package_root=checkout.link_package(scratch / "pkg"),
        matching=dict(login_here, **STEP),
        mismatched=dict(login_there, **node, **STEP),
        scratch=work,
    )


def _task(env: dict, local_id: int, tmpdir) -> dict:
    return dict(env, SLURM_LOCALID=str(local_id), TMPDIR=str(tmpdir))


def _without_print(output: bytes) -> bytes:
    """Task 0's output as the step's other tasks get it: without the message for the node."""
    return b"".join(line for line in output.splitlines(True) if not line.startswith(b"print "))


def _check_match(output: bytes, runs) -> None:
    if output or runs not in (None, ARCHDETECT_RUNS):
        raise BenchError(f"guard_latency: a matching job gave {output[:200]!r} ({runs} archdetect runs)")


def _check_reload(output: bytes, runs) -> None:
    if RELOADED not in output or runs == 0:
        raise BenchError(f"guard_latency: a mismatched job was not reloaded: {output[-500:]!r}")


# --------------------------------------------------------------------------- one task


def bare_interpreter(_scratch: Path, site: Site):
    env = _task(site.mismatched, 1, site.scratch)
    return lambda: _run(list(BARE), env)


def cache_hit(_scratch: Path, site: Site):
    tmpdir = site.fresh("hit")
    first, _runs = site.archdetect_runs(_task(site.mismatched, 0, tmpdir))
    env = _task(site.mismatched, 1, tmpdir)
    expected, runs = site.archdetect_runs(env)
    _check_reload(expected, None)
    if runs != 0 or _without_print(first) != expected:
        raise BenchError(f"guard_latency: a cache hit ran archdetect {runs} times or gave other output")

    def hit():
        if _run(site.argv(), env).stdout != expected:
            raise BenchError("guard_latency: a cache hit gave other output")

    return hit


def _cold(label: str, job: str, check):
    """The step's first task in the ``job`` environment of the site, a new cache each round."""

    def factory(_scratch: Path, site: Site):
        base = getattr(site, job)
        check(*site.archdetect_runs(_task(base, 0, site.fresh(label))))

        def cold():
            check(_run(site.argv(), _task(base, 0, site.fresh(label))).stdout, None)

        return cold

    return factory


cold_match = _cold("match", "matching", _check_match)
cold_reload = _cold("reload", "mismatched", _check_reload)

# The least any reload can cost: EESSI's two archdetect calls, then one Lmod call that unloads
# EESSI and one that loads every module the task had, in one bash with the task's environment.
FLOOR_SCRIPT = r"""
archdetect=$EESSI_PREFIX/init/eessi_archdetect.sh
bash "$archdetect" -a cpupath > /dev/null
bash "$archdetect" accelpath > /dev/null
eval "$("$LMOD_CMD" bash unload EESSI 2>/dev/null)"
eval "$("$LMOD_CMD" bash load "$@" 2>/dev/null)"
printf '%s' "$EESSI_SOFTWARE_SUBDIR"
"""
# The same with the load in two calls, EESSI's module and then the rest, as the guard loads
# them: Lmod reads the SitePackage EESSI's module names (LMOD_PACKAGE_PATH) when a call
# starts, so only then do EESSI's load hooks apply to the modules after it.
FLOOR_WITH_HOOKS_SCRIPT = r"""
archdetect=$EESSI_PREFIX/init/eessi_archdetect.sh
bash "$archdetect" -a cpupath > /dev/null
bash "$archdetect" accelpath > /dev/null
eval "$("$LMOD_CMD" bash unload EESSI 2>/dev/null)"
eval "$("$LMOD_CMD" bash load "$1" 2>/dev/null)"
eval "$("$LMOD_CMD" bash load "${@:2}" 2>/dev/null)"
printf '%s' "$EESSI_SOFTWARE_SUBDIR"
"""


def _floor(script: str):
    """One bash running ``script`` in the mismatched task's environment (EESSI's module first
    in LOADEDMODULES), checked to land on the target the guard's reload lands on."""

    def factory(_scratch: Path, site: Site):
        modules = site.mismatched["LOADEDMODULES"].split(":")
        if not modules[0].startswith("EESSI/"):
            raise BenchError(f"guard_latency: the login loaded {modules[0]} before EESSI")
        argv = ["bash", "--noprofile", "--norc", "-c", script, "floor", *modules]
        env = _task(site.mismatched, 0, site.scratch)
        expected = site.matching["EESSI_SOFTWARE_SUBDIR"].encode()

        def floor():
            landed = _run(argv, env).stdout
            if landed != expected:
                raise BenchError(f"guard_latency: the floor's reload landed on {landed!r}, not {expected!r}")

        return floor

    return factory


reload_floor = _floor(FLOOR_SCRIPT)
reload_floor_with_hooks = _floor(FLOOR_WITH_HOOKS_SCRIPT)


# --------------------------------------------------------------------------- 64 tasks


def _start(argv, env: dict, tmpdir: Path, extra: dict) -> tuple:
    """Start ``TASKS`` processes of one step at once, stdout to files; returns both lists."""
    outputs, tasks = [], []
    try:
        for local_id in range(TASKS):
            out = open(tmpdir / f"task-{local_id}.out", "w+b")  # noqa: SIM115 (closed by _finish)
            outputs.append(out)
            task_env = dict(_task(env, local_id, tmpdir), **extra)
            tasks.append(subprocess.Popen(argv, env=task_env, stdin=subprocess.DEVNULL, stdout=out))
    except BaseException:
        _end(tasks, outputs)
        raise
    return tasks, outputs


def _end(tasks, outputs) -> list:
    """Kill what still runs, close the outputs; what each task wrote."""
    for task in tasks:
        if task.poll() is None:
            task.kill()
            task.wait()
    texts = []
    for out in outputs:
        out.seek(0)
        texts.append(out.read())
        out.close()
    return texts


def _finish(tasks, outputs) -> list:
    """Wait for every task; what each wrote. A task that fails ends the benchmark."""
    try:
        for task in tasks:
            if task.wait(RUN_TIMEOUT) != 0:
                raise BenchError(f"guard_latency: a task of the step exited {task.returncode}")
    finally:
        texts = _end(tasks, outputs)
    return texts


def _check_step(texts: list, expected: bytes) -> None:
    if _without_print(texts[0]) != expected or any(text != expected for text in texts[1:]):
        raise BenchError(f"guard_latency: the {TASKS} tasks of one step gave different outputs")


def concurrent_step(_scratch: Path, site: Site):
    alone, one = site.archdetect_runs(_task(site.mismatched, 0, site.fresh("one")))
    log = site.fresh("runlog") / "runs"
    log.touch()
    texts = _finish(*_start(site.argv(), site.mismatched, site.fresh("step"), {RUNLOG: str(log)}))
    expected = texts[1]
    _check_reload(expected, None)
    _check_step(texts, expected)
    if _without_print(alone) != expected:
        raise BenchError(f"guard_latency: the {TASKS} tasks of one step decided otherwise than one task")
    runs = len(log.read_text().splitlines())
    if runs != one:
        raise BenchError(
            f"guard_latency: {TASKS} tasks of one step ran archdetect {runs} times, one task {one}"
        )

    def step_of_tasks():
        _check_step(_finish(*_start(site.argv(), site.mismatched, site.fresh("step"), {})), expected)

    return step_of_tasks


def sequential_step(_scratch: Path, site: Site):
    """The CPU a step's tasks need at the least: one cold decision, then the other 63 tasks
    one after another, each a cache hit."""

    def step_one_by_one():
        tmpdir = site.fresh("one-by-one")
        first = _run(site.argv(), _task(site.mismatched, 0, tmpdir)).stdout
        _check_reload(first, None)
        for local_id in range(1, TASKS):
            if _run(site.argv(), _task(site.mismatched, local_id, tmpdir)).stdout != _without_print(first):
                raise BenchError("guard_latency: a cache hit after the step's first task gave other output")

    return step_one_by_one


def concurrent_bare(_scratch: Path, site: Site):
    """The floor of any Python prolog: ``TASKS`` bare interpreters started the same way."""
    return lambda: _finish(*_start(list(BARE), site.mismatched, site.fresh("bare"), {}))


# --------------------------------------------------------------------------- import cost


def _imports(argv, env) -> dict:
    """Module -> (self µs, cumulative µs) from ``python -X importtime``."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"guard_latency: {argv[0]} -X importtime exited {done.returncode}")
    found = {}
    for line in done.stderr.decode(errors="replace").splitlines():
        if not line.startswith("import time:") or "|" not in line or "[us]" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|")
        found[name.strip()] = (int(own), int(cumulative))
    return found


def report_imports(site: Site) -> None:
    """Print what the cache-hit path imports beyond the bare interpreter, largest first."""
    tmpdir = site.fresh("imports")
    _run(site.argv(), _task(site.mismatched, 0, tmpdir))
    env = _task(site.mismatched, 1, tmpdir)
    if site.archdetect_runs(env)[1] != 0:
        raise BenchError("guard_latency: the task whose imports are measured is no cache hit")
    guard, bare = _imports(site.argv(), env), _imports(list(BARE), env)
    extra = {name: times for name, times in guard.items() if name not in bare}
    total = sum(own for own, _cumulative in extra.values())
    print(
        f"guard_latency: python3 -X importtime of a cache hit: {len(extra)} modules beyond the bare "
        f"interpreter's {len(bare)}, {total / 1000:.2f} ms of their own import time; largest:"
    )
    for name, (own, cumulative) in sorted(extra.items(), key=lambda item: -item[1][0])[:IMPORTS_SHOWN]:
        print(f"  {own / 1000:7.2f} ms  (cumulative {cumulative / 1000:7.2f} ms)  {name}")
    slow = [name for name in SLOW_MODULES if any(module.split(".")[0] == name for module in guard)]
    verdict = "imports " + ", ".join(slow) if slow else "imports none of them"
    print(f"guard_latency: of {', '.join(SLOW_MODULES)} the cache-hit path {verdict}")
    print()


def make_site_and_report(scratch: Path) -> Site:
    site = make_site(scratch)
    report_imports(site)
    return site


_BARE_NAME = f"{PYTHON} -IS -c pass"

CASES = [
    Comparison(
        "guard_latency",
        [
            Subject(f"cache hit of a reload (goal <= {GOAL})", cache_hit),
            Subject("cold match decision", cold_match),
            Subject("cold reload decision", cold_reload),
            Subject(f"{TASKS} concurrent tasks of one step", concurrent_step),
        ],
        _BARE_NAME,
        bare_interpreter,
        rounds=ROUNDS,
        setup=make_site_and_report,
    ),
    Comparison(
        "guard_latency",
        [Subject(f"cold reload decision (goal <= {FLOOR_GOAL})", cold_reload)],
        "the floor: archdetect twice, one Lmod unload and one load",
        reload_floor,
        rounds=ROUNDS,
        setup=make_site,
    ),
    Comparison(
        "guard_latency",
        [Subject("cold reload decision", cold_reload)],
        "the floor with EESSI's hooks: the load in two calls",
        reload_floor_with_hooks,
        rounds=ROUNDS,
        setup=make_site,
    ),
    Comparison(
        f"guard_latency ({CPUS} CPUs)",
        [
            Subject(f"{TASKS} concurrent tasks of one step (goal <= {GOAL})", concurrent_step),
            Subject(f"{TASKS} concurrent bare interpreters", concurrent_bare),
        ],
        "one cold reload decision",
        cold_reload,
        rounds=CONCURRENT_ROUNDS,
        setup=make_site,
    ),
    Comparison(
        "guard_latency (CPU time)",
        [Subject(f"{TASKS} concurrent tasks of one step (goal <= {FLOOR_GOAL})", concurrent_step)],
        f"one cold reload, then {TASKS - 1} cache hits one by one",
        sequential_step,
        rounds=CONCURRENT_ROUNDS,
        setup=make_site,
        clock=CPU,
    ),
]
