"""One decision per job step, the deadline and SIGTERM, with the real guard, bash and Lmod.

Tasks are the guard run as Slurm runs it for each task of a step: a ``python -IS`` process
with ``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURMD_NODENAME`` and ``SLURM_LOCALID`` set and
``TMPDIR`` a directory of the test, where the step's cache and lock go. The job comes from a
haswell login node and runs on a zen3 node (simulated by archdetect's variables), so a
decision is a real reload through Lmod. The archdetect stand-in appends a line to
``EESSI_ARCHDETECT_STANDIN_RUNLOG`` per run: that counts the decisions computed.

One computed reload runs archdetect four times: twice by the guard (``-a cpupath`` and
``accelpath``) and twice by the EESSI module that the restore helper loads again. A
decision without reload (the job already matches the node) runs it twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard.decision import RELOAD, Decision
from ansible_collections.hpcstack.ops.plugins.module_utils.common.proc import POST_KILL_WAIT_SECONDS
from tests.integration.harness.guard import GuardRun, as_bytes, as_str
from tests.support import slurm_taskprolog

HASWELL = ("x86_64/intel/haswell", None)
ZEN3 = ("x86_64/amd/zen3", None)
TASKS = 64
RELOAD_RUNS = 4  # the guard's two archdetect runs and the EESSI module's two in the helper
MATCH_RUNS = 2  # the guard's two archdetect runs
RELOADED = b"export EESSI_ARCH_GUARD_RELOADED=x86_64/intel/haswell->x86_64/amd/zen3\n"
MESSAGE = (
    b"print eessi-arch-guard: reloaded EESSI for x86_64/amd/zen3 (job environment was x86_64/intel/haswell)\n"
)
TIMEOUT = b"export EESSI_ARCH_GUARD_FAILED=x86_64/intel/haswell->timeout\n"
TERMINATED = b"export EESSI_ARCH_GUARD_FAILED=x86_64/intel/haswell->terminated\n"
DEADLINE = 2
# The deadline, then at most three waits of POST_KILL_WAIT_SECONDS, then room for a busy CI.
WORST_CASE = DEADLINE + 3 * POST_KILL_WAIT_SECONDS + 10
# What an attacker would like a task to apply.
FORGED = Decision(
    RELOAD,
    "forged",
    [("EESSI_SOFTWARE_SUBDIR", "x86_64/intel/haswell"), ("LD_PRELOAD", "/tmp/evil.so")],
    "forged",
)


class Step:
    """The tasks of one job step on one node, with the test's scratch dir and run log."""

    def __init__(self, guard_site, tmp_path: Path, login=HASWELL, compute=ZEN3, **extra: str) -> None:
        self.site = guard_site
        self.tmp = tmp_path
        self.scratch = tmp_path / "scratch"
        self.scratch.mkdir(exist_ok=True)
        self.runlog = tmp_path / "runlog"
        self.env = guard_site.job_env(
            login,
            compute,
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURMD_NODENAME="node001",
            SLURM_LOCALID="0",
            TMPDIR=str(self.scratch),
            EESSI_ARCHDETECT_STANDIN_RUNLOG=str(self.runlog),
            **extra,
        )

    def runs(self) -> int:
        """How often archdetect ran so far."""
        return len(self.runlog.read_text().splitlines()) if self.runlog.exists() else 0

    def start(self, env=None, *args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(
            self.site.guard_argv(*args),
            env=self.env if env is None else env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )

    def run(self, env=None, *args: str, timeout: float = 60) -> GuardRun:
        return finish(self.start(env, *args), timeout)

    def cache_path(self, env=None, mode: str = "prolog") -> str:
        """Where the guard keeps this step's decision (computed as the guard does)."""
        return cache.path_for(self.env if env is None else env, mode)

    def scratch_names(self) -> set:
        return set(os.listdir(self.scratch))


def finish(child: subprocess.Popen, timeout: float = 60) -> GuardRun:
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    return GuardRun(child.returncode, stdout or b"", stderr)


def directives(stdout: bytes) -> bytes:
    """The export and unset lines: what every task of a step must get alike."""
    return b"".join(line for line in stdout.splitlines(keepends=True) if not line.startswith(b"print "))


def prints(stdout: bytes) -> list:
    return [line for line in stdout.splitlines(keepends=True) if line.startswith(b"print ")]


def assert_reloaded_for_zen3(guard_site, env: dict, stdout: bytes) -> None:
    """Applied as slurmd applies it, ``stdout`` gives the task a fresh load on zen3."""
    task = as_str(slurm_taskprolog.parse(stdout, as_bytes(env)).env)
    fresh = guard_site.login(ZEN3)
    for name in ("EESSI_SOFTWARE_SUBDIR", "MODULEPATH", "PATH", "LOADEDMODULES"):
        assert task.get(name) == fresh.get(name), name
    assert task["EESSI_ARCH_GUARD_RELOADED"] == "x86_64/intel/haswell->x86_64/amd/zen3"
    assert "LD_PRELOAD" not in task


@pytest.fixture(scope="module")
def reference_reload(guard_site) -> bytes:
    """The prolog output of a reload computed without any cache (no SLURM_JOB_ID)."""
    run = guard_site.run(guard_site.job_env(HASWELL, ZEN3, SLURM_LOCALID="0"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.endswith(RELOADED + MESSAGE)
    return run.stdout


# ------------------------------------------------------------------- one per step


def test_64_tasks_of_one_step_started_at_once_compute_one_decision(guard_site, tmp_path, reference_reload):
    step = Step(guard_site, tmp_path)
    outputs = [tmp_path / f"task-{local_id}.out" for local_id in range(TASKS)]
    children = []
    for local_id, output in enumerate(outputs):
        with output.open("wb") as sink:
            children.append(step.start(dict(step.env, SLURM_LOCALID=str(local_id)), stdout=sink))
    runs = [finish(child) for child in children]

    assert [run.returncode for run in runs] == [0] * TASKS
    assert [run.stderr for run in runs] == [b""] * TASKS
    assert step.runs() == RELOAD_RUNS
    stdouts = [output.read_bytes() for output in outputs]
    assert stdouts[0] == reference_reload
    assert [directives(stdout) for stdout in stdouts] == [directives(reference_reload)] * TASKS
    assert prints(stdouts[0]) == [MESSAGE]
    assert [prints(stdout) for stdout in stdouts[1:]] == [[]] * (TASKS - 1)
    cache_name = os.path.basename(step.cache_path())
    assert step.scratch_names() == {cache_name, cache_name + ".lock"}


def test_64_tasks_of_a_step_that_already_matches_run_archdetect_twice_in_all(guard_site, tmp_path):
    step = Step(guard_site, tmp_path, login=ZEN3)
    children = [step.start(dict(step.env, SLURM_LOCALID=str(local_id))) for local_id in range(TASKS)]
    runs = [finish(child) for child in children]

    assert {(run.returncode, run.stdout, run.stderr) for run in runs} == {(0, b"", b"")}
    assert step.runs() == MATCH_RUNS


def test_each_step_node_job_mode_and_digest_input_computes_its_own_decision(guard_site, tmp_path):
    step = Step(guard_site, tmp_path, login=ZEN3)  # a match: two archdetect runs per decision
    batch = dict(step.env)
    del batch["SLURM_STEP_ID"]
    variants = [
        ("step 0", step.env, "prolog"),
        ("step 1", dict(step.env, SLURM_STEP_ID="1"), "prolog"),
        ("the batch step", batch, "prolog"),
        ("another job", dict(step.env, SLURM_JOB_ID="4243"), "prolog"),
        ("another node", dict(step.env, SLURMD_NODENAME="node002"), "prolog"),
        ("shell mode", step.env, "shell"),
        ("another MODULEPATH", dict(step.env, MODULEPATH=step.env["MODULEPATH"] + ":/nonexistent"), "prolog"),
        ("another PATH", dict(step.env, PATH=step.env["PATH"] + ":/nonexistent"), "prolog"),
    ]

    for name, env, mode in variants:
        before = step.runs()
        run = step.run(env, *(["--shell"] if mode == "shell" else []))
        assert (run.returncode, run.stdout, run.stderr) == (0, b"", b""), name
        assert step.runs() == before + MATCH_RUNS, name

    # Each result is kept under its own name: asked again, none computes.
    for name, env, mode in variants:
        step.run(env, *(["--shell"] if mode == "shell" else []))
        assert step.runs() == MATCH_RUNS * len(variants), name
    paths = {os.path.basename(step.cache_path(env, mode)) for _name, env, mode in variants}
    assert len(paths) == len(variants)
    assert step.scratch_names() == paths | {path + ".lock" for path in paths}


def test_tasks_that_differ_only_by_eessi_arch_guard_share_one_result(guard_site, tmp_path, reference_reload):
    step = Step(guard_site, tmp_path)
    runs = [step.run(dict(step.env, EESSI_ARCH_GUARD=value)) for value in ("1", "on", "yes")]
    runs.append(step.run())

    assert step.runs() == RELOAD_RUNS
    assert [(run.returncode, run.stdout, run.stderr) for run in runs] == [(0, reference_reload, b"")] * 4


def test_task_without_slurm_job_id_computes_every_time_and_writes_no_cache(
    guard_site, tmp_path, reference_reload
):
    step = Step(guard_site, tmp_path)
    env = dict(step.env)
    del env["SLURM_JOB_ID"]

    first, second = step.run(env), step.run(env)

    assert (first.returncode, first.stdout, first.stderr) == (0, reference_reload, b"")
    assert (second.returncode, second.stdout, second.stderr) == (0, reference_reload, b"")
    assert step.runs() == 2 * RELOAD_RUNS
    assert step.scratch_names() == set()


# --------------------------------------------------------------------- attacks


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def forged_file(path: Path, owner=None, mode: int = 0o600) -> Path:
    path.write_bytes(cache.encode(FORGED))
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    return path


def snapshot(path: Path) -> tuple:
    info = os.lstat(path)
    return path.read_bytes(), info.st_mode, info.st_uid, info.st_gid, info.st_nlink, info.st_mtime_ns


def symlink_at_cache(step: Step, user) -> tuple:
    victim = forged_file(step.tmp / "victim", owner=user)
    os.symlink(victim, step.cache_path())
    return victim, {os.path.basename(step.cache_path()), os.path.basename(step.cache_path()) + ".lock"}


def symlink_at_lock(step: Step, user) -> tuple:
    victim = forged_file(step.tmp / "victim", owner=user)
    os.symlink(victim, step.cache_path() + ".lock")
    return victim, {os.path.basename(step.cache_path()) + ".lock"}


def file_of_another_uid(step: Step, user) -> tuple:
    victim = forged_file(Path(step.cache_path()), owner=user)
    return victim, {victim.name, victim.name + ".lock"}


def file_with_mode_0644(step: Step, user) -> tuple:
    victim = forged_file(Path(step.cache_path()), mode=0o644)
    return victim, {victim.name, victim.name + ".lock"}


def hard_link(step: Step, user) -> tuple:
    victim = forged_file(step.tmp / "victim")
    os.link(victim, step.cache_path())
    return victim, {os.path.basename(step.cache_path()), os.path.basename(step.cache_path()) + ".lock"}


@pytest.mark.parametrize(
    "attack",
    [symlink_at_cache, symlink_at_lock, file_of_another_uid, file_with_mode_0644, hard_link],
    ids=lambda attack: attack.__name__.replace("_", "-"),
)
def test_cache_attack_leaves_the_attacked_file_alone_and_the_output_correct(
    guard_site, tmp_path, unprivileged_user, reference_reload, attack
):
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    step = Step(guard_site, tmp_path)
    victim, expected_names = attack(step, unprivileged_user)
    before = snapshot(victim)
    links = {
        name: os.readlink(step.scratch / name)
        for name in expected_names
        if (step.scratch / name).is_symlink()
    }

    run = step.run()

    assert (run.returncode, run.stderr) == (0, b"")
    assert run.stdout == reference_reload
    assert_reloaded_for_zen3(guard_site, step.env, run.stdout)
    assert step.runs() == RELOAD_RUNS
    assert snapshot(victim) == before
    # Nothing replaced the attacker's entries, and nothing else was left beside them.
    assert step.scratch_names() == expected_names
    assert {name: os.readlink(step.scratch / name) for name in links} == links


def test_dangling_symlink_at_the_lock_path_creates_nothing_where_it_points(
    guard_site, tmp_path, reference_reload
):
    # The lock is opened with O_CREAT: followed, the link would make root create a file of
    # the attacker's choosing.
    step = Step(guard_site, tmp_path)
    target = tmp_path / "planted" / "created-by-the-guard"
    target.parent.mkdir()
    lock = Path(step.cache_path() + ".lock")
    lock.symlink_to(target)

    run = step.run()

    assert (run.returncode, run.stdout, run.stderr) == (0, reference_reload, b"")
    assert list(target.parent.iterdir()) == []
    assert step.scratch_names() == {lock.name}
    assert os.readlink(lock) == str(target)


def test_untrusted_cache_file_does_not_make_the_steps_tasks_wait_for_each_other(guard_site, tmp_path):
    # Each task computes its own result; if each did so holding the step's lock, the tasks
    # of a step would run one after another and the later ones would reach their deadline.
    # archdetect sleeping 1 s per run makes a decision take 2 s: 8 tasks side by side fit a
    # 10 s deadline, 8 tasks in a row do not.
    step = Step(guard_site, tmp_path, login=ZEN3, EESSI_ARCH_GUARD_TIMEOUT="10")
    executable(
        step.tmp / "init" / "eessi_archdetect.sh",
        f'sleep 1; exec /bin/bash {guard_site.prefix.archdetect} "$@"\n',
    )
    step.env["EESSI_INIT_PREFIX"] = str(step.tmp / "init")
    planted = forged_file(Path(step.cache_path()), mode=0o644)

    children = [step.start(dict(step.env, SLURM_LOCALID=str(local_id))) for local_id in range(8)]
    runs = [finish(child) for child in children]

    assert [(run.returncode, run.stdout) for run in runs] == [(0, b"")] * 8
    assert step.runs() == 8 * MATCH_RUNS
    assert planted.read_bytes() == cache.encode(FORGED)


PINNED_TASKS = 4


@pytest.fixture
def shared_tmp():
    """A directory like /tmp: root's, mode 1777, below directories every user may search."""
    root = Path(tempfile.mkdtemp(prefix="hpcstack-guard-pin-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_link_another_user_plants_at_the_lock_makes_each_task_compute_a_correct_result_on_its_own(
    guard_site, shared_tmp, attacker_user, reference_reload
):
    # The choice the threat model records ("A name planted at the lock"): in a directory
    # every user writes, another user can plant the step's lock name before the step starts
    # (its parts can be learnt or guessed). The guard does not follow it: each task then
    # computes its own decision, the right one, and nothing is written. What it costs is
    # time, a decision per task instead of per step; a job TMPDIR of its own avoids it.
    step = Step(guard_site, shared_tmp)
    step.scratch.chmod(0o1777)
    victim = forged_file(shared_tmp / "victim", owner=attacker_user)
    lock = Path(step.cache_path() + ".lock")
    planted = attacker_user.run(["ln", "-s", str(victim), str(lock)])
    assert planted.returncode == 0, planted.stderr
    before = snapshot(victim)

    children = [step.start(dict(step.env, SLURM_LOCALID=str(local_id))) for local_id in range(PINNED_TASKS)]
    runs = [finish(child) for child in children]

    assert [(run.returncode, run.stderr) for run in runs] == [(0, b"")] * PINNED_TASKS
    assert runs[0].stdout == reference_reload  # the first task of the node says what it did
    assert [directives(run.stdout) for run in runs] == [directives(reference_reload)] * PINNED_TASKS
    for run in runs:
        assert_reloaded_for_zen3(guard_site, step.env, run.stdout)
    assert step.runs() == PINNED_TASKS * RELOAD_RUNS
    assert snapshot(victim) == before
    assert step.scratch_names() == {lock.name}
    assert (os.lstat(lock).st_uid, os.readlink(lock)) == (attacker_user.uid, str(victim))


# ------------------------------------------------------------- deadline, SIGTERM


# The hanging scripts write "<pid> <process group>" of each process they start to a file,
# and create a marker file once all of them run.
RECORD = 'echo "$1 $(cut -d" " -f5 /proc/$1/stat)" >> {pids}'


def hanging_archdetect(step: Step) -> dict:
    """An eessi_archdetect.sh (in its own EESSI_INIT_PREFIX) that hangs with a child."""
    pids, started = step.tmp / "pids", step.tmp / "started"
    record = RECORD.format(pids=pids)
    executable(
        step.tmp / "init" / "eessi_archdetect.sh",
        f"record() {{ {record}; }}\nrecord $$\nsleep 300 &\nrecord $!\n: > {started}\nwait\n",
    )
    return {"EESSI_INIT_PREFIX": str(step.tmp / "init")}


def helper_with_a_grandchild_ignoring_sigterm(step: Step) -> dict:
    """LMOD_CMD that starts a grandchild ignoring SIGTERM, then sleeps."""
    pids, started = step.tmp / "pids", step.tmp / "started"
    record = RECORD.format(pids=pids)
    executable(
        step.tmp / "bin" / "lmod",
        "#!/bin/bash\n"
        f"record() {{ {record}; }}\nrecord $$\n"
        f"bash -c \"trap '' TERM; $(declare -f record); record \\$\\$; : > {started}; sleep 300\" &\n"
        "sleep 300\n",
    )
    return {"LMOD_CMD": str(step.tmp / "bin" / "lmod")}


def repair(step: Step, hang) -> None:
    """Make the hanging program do its real work; its path, and so the cache name, stay."""
    if hang is hanging_archdetect:
        executable(
            step.tmp / "init" / "eessi_archdetect.sh", f'exec /bin/bash {step.site.prefix.archdetect} "$@"\n'
        )
    else:
        executable(step.tmp / "bin" / "lmod", f'#!/bin/bash\nexec {step.site.lmod.cmd} "$@"\n')


def recorded(step: Step) -> tuple:
    """The pids and process groups the scripts wrote down."""
    pairs = [line.split() for line in (step.tmp / "pids").read_text().splitlines()]
    return {int(pid) for pid, _group in pairs}, {int(group) for _pid, group in pairs}


def live_processes() -> dict:
    """pid -> process group of every process that is not a zombie."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] not in ("Z", "X"):
            found[int(entry)] = int(fields[2])
    return found


def assert_no_process_left(step: Step) -> None:
    pids, groups = recorded(step)
    assert len(pids) >= 2, "the hanging scripts did not record their processes"
    # SIGKILLed processes finish exiting a moment after the pipes they held are closed.
    give_up = time.monotonic() + 10
    while True:
        alive = {pid: group for pid, group in live_processes().items() if pid in pids or group in groups}
        if not alive or time.monotonic() > give_up:
            break
        time.sleep(0.05)
    assert alive == {}


def assert_cleaned_up_and_nothing_cached(step: Step) -> None:
    assert_no_process_left(step)
    # The lock may stay; no cache file, no helper work directory, no temporary.
    assert step.scratch_names() == {os.path.basename(step.cache_path()) + ".lock"}


def assert_next_task_computes_again(step: Step, hang) -> None:
    repair(step, hang)
    before = step.runs()
    env = {name: value for name, value in step.env.items() if name != "EESSI_ARCH_GUARD_TIMEOUT"}
    run = step.run(env)
    assert run.returncode == 0
    assert step.runs() > before
    assert run.stdout.endswith(RELOADED + MESSAGE)


HANGS = pytest.mark.parametrize(
    "hang",
    [hanging_archdetect, helper_with_a_grandchild_ignoring_sigterm],
    ids=["archdetect-hangs", "helper-grandchild-ignores-sigterm"],
)


@HANGS
def test_deadline_ends_the_decision_with_timeout_and_cleans_up(guard_site, tmp_path, hang):
    step = Step(guard_site, tmp_path)
    step.env.update(hang(step), EESSI_ARCH_GUARD_TIMEOUT=str(DEADLINE))

    started = time.monotonic()
    run = step.run(timeout=WORST_CASE + 30)
    took = time.monotonic() - started

    assert run.returncode == 0
    assert TIMEOUT in run.stdout
    assert took < WORST_CASE
    assert_cleaned_up_and_nothing_cached(step)
    assert_next_task_computes_again(step, hang)


@HANGS
def test_sigterm_mid_decision_ends_it_with_terminated_and_cleans_up(guard_site, tmp_path, hang):
    step = Step(guard_site, tmp_path)
    step.env.update(hang(step))
    child = step.start()
    give_up = time.monotonic() + 60
    while not (step.tmp / "started").exists() and child.poll() is None and time.monotonic() < give_up:
        time.sleep(0.02)
    assert (step.tmp / "started").exists(), "the hanging program never started"

    child.send_signal(signal.SIGTERM)
    run = finish(child, timeout=WORST_CASE + 30)

    assert run.returncode == 0
    assert TERMINATED in run.stdout
    assert_cleaned_up_and_nothing_cached(step)
    assert_next_task_computes_again(step, hang)


# ------------------------------------------------------------------- start-up cost


SLOW_IMPORTS = (
    "os",
    "stat",
    "re",
    "json",
    "argparse",
    "subprocess",
    "signal",
    "hashlib",
    "shutil",
    "tempfile",
)


def test_a_cache_hit_imports_none_of_the_slow_modules(guard_site, tmp_path):
    step = Step(guard_site, tmp_path)
    first = step.run()
    assert first.returncode == 0

    hit = subprocess.run(
        [step.site.python, "-X", "importtime", *step.site.guard_argv()[1:]],
        env=step.env,
        capture_output=True,
        check=False,
        timeout=60,
    )

    assert (hit.returncode, hit.stdout) == (0, first.stdout)
    imported = {line.rsplit("|", 1)[1].strip() for line in hit.stderr.decode().splitlines() if "|" in line}
    assert "hpcstack_ops.arch_guard.cache" in imported
    assert "hpcstack_ops.arch_guard.decide" not in imported
    assert "hpcstack_ops.arch_guard.family" not in imported
    assert not imported & set(SLOW_IMPORTS)
