"""What the guard trusts in the directories it shares with other users (issue 18, item F).

Real steps of real guard processes, bash and Lmod, as in ``test_arch_guard_step``: planted
names at the cache's temporary names, a TMPDIR that others can write to, report files that
are not what the helper wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cache
from tests.integration.arch_guard.test_arch_guard_step import (
    RELOAD_RUNS,
    Step,
    directives,
    executable,
    finish,
    forged_file,
    reference_reload,
    snapshot,
)

__all__ = ["reference_reload"]  # the fixture, shared with test_arch_guard_step

PLANTED = 3000
TASKS = 64
STEP_TIMEOUT = "15"


def run_step(step: Step, tasks: int) -> tuple:
    """Start ``tasks`` tasks of the step at once; their runs and the wall time of the step."""
    started = time.monotonic()
    children = [step.start(dict(step.env, SLURM_LOCALID=str(local_id))) for local_id in range(tasks)]
    runs = [finish(child) for child in children]
    return runs, time.monotonic() - started


def next_pids(count: int) -> range:
    """The pids the next processes will most likely get (Linux hands them out in order)."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    return range(last + 1, last + 1 + count)


def test_3000_planted_temporary_names_do_not_serialise_a_step_of_64_tasks(
    guard_site, tmp_path, unprivileged_user, reference_reload
):
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    for name in ("unplanted", "planted"):
        (tmp_path / name).mkdir()
    unplanted = Step(guard_site, tmp_path / "unplanted", EESSI_ARCH_GUARD_TIMEOUT=STEP_TIMEOUT)
    clean_runs, clean_took = run_step(unplanted, TASKS)
    assert [run.returncode for run in clean_runs] == [0] * TASKS

    planted_step = Step(guard_site, tmp_path / "planted", EESSI_ARCH_GUARD_TIMEOUT=STEP_TIMEOUT)
    victim = forged_file(planted_step.tmp / "victim", owner=unprivileged_user)
    before = snapshot(victim)
    cache_path = planted_step.cache_path()
    # The predictable names: <cache>.<pid>.new for the next pids, as the attack in issue 18 did.
    planted = {f"{cache_path}.{pid}.new" for pid in next_pids(PLANTED)}
    for name in planted:
        os.symlink(victim, name)

    runs, took = run_step(planted_step, TASKS)

    assert [(run.returncode, run.stderr) for run in runs] == [(0, b"")] * TASKS
    assert not any(b"->timeout" in run.stdout for run in runs)
    assert [directives(run.stdout) for run in runs] == [directives(reference_reload)] * TASKS
    # One decision computed, published, and read by the 63 others.
    assert planted_step.runs() == RELOAD_RUNS
    assert os.path.isfile(cache_path)
    assert not os.path.islink(cache_path)
    assert snapshot(victim) == before
    assert planted_step.scratch_names() == {os.path.basename(name) for name in planted} | {
        os.path.basename(cache_path),
        os.path.basename(cache_path) + ".lock",
    }
    print(f"64 tasks: {clean_took:.1f} s unplanted, {took:.1f} s with {PLANTED} planted names")
    # Within 1.5x of the unplanted step (plus 2 s for two busy shared cores).
    assert took <= 1.5 * clean_took + 2, (took, clean_took)


def lmod_recording_its_directory(step: Step, record: Path) -> str:
    """LMOD_CMD that writes the directory it runs in (the helper's work directory) to ``record``,
    then is the real Lmod."""
    path = executable(
        step.tmp / "bin" / "lmod",
        f'#!/bin/bash\npwd >> {record}\nexec {step.site.lmod.cmd} "$@"\n',
    )
    return str(path)


def test_a_tmpdir_others_can_write_without_the_sticky_bit_is_not_used(guard_site, tmp_path, reference_reload):
    step = Step(guard_site, tmp_path)
    os.chmod(step.scratch, 0o777)  # noqa: S103 (a real directory anyone can rename entries in)
    record = tmp_path / "helper-dirs"
    # A job id of this test alone: the step cache goes to the machine's /tmp.
    job = f"trust{os.getpid()}"
    env = dict(step.env, SLURM_JOB_ID=job, LMOD_CMD=lmod_recording_its_directory(step, record))
    cache_path = cache.path_for(env, "prolog")
    try:
        first, second = step.run(env), step.run(env)

        assert (first.returncode, first.stderr) == (0, b"")
        assert directives(first.stdout) == directives(reference_reload)
        assert (second.returncode, second.stdout, second.stderr) == (0, first.stdout, b"")
        assert step.scratch_names() == set()
        assert os.path.dirname(cache_path) == "/tmp"
        assert os.path.isfile(cache_path)
        assert step.runs() == RELOAD_RUNS  # the second task read the cache in /tmp
        helper_dirs = set(record.read_text().split())
        assert helper_dirs
        assert {os.path.dirname(path) for path in helper_dirs} == {"/tmp"}
    finally:
        for path in (cache_path, cache_path + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def lmod_planting_after_env(step: Step, how: str) -> str:
    """LMOD_CMD: the real Lmod, and on ``load`` it also points the helper's ``env_tool`` at a
    program that writes the environment and then replaces ``after.env`` in the work directory
    (the helper's cwd) by a FIFO or a symlink to a forged report, as an attacker with write
    access to the work directory would."""
    forged = step.tmp / "forged.env"
    forged.write_bytes(b"PATH=/evil\0LD_PRELOAD=/tmp/evil.so\0EESSI_SOFTWARE_SUBDIR=x86_64/amd/zen3\0")
    plant = "mkfifo after.env" if how == "fifo" else f"ln -s {forged} after.env"
    fake_env = executable(
        step.tmp / "bin" / "fake-env", f"#!/bin/bash\n/usr/bin/env -0\nrm -f after.env\n{plant}\n"
    )
    path = executable(
        step.tmp / "bin" / "lmod",
        f'#!/bin/bash\n{step.site.lmod.cmd} "$@" || exit 1\n'
        f'if [ "$2" = load ]; then echo "env_tool={fake_env}"; fi\n',
    )
    return str(path)


@pytest.mark.parametrize("how", ["fifo", "symlink"])
def test_a_report_file_replaced_by_a_fifo_or_a_symlink_is_refused_within_the_deadline(
    guard_site, tmp_path, how
):
    step = Step(guard_site, tmp_path)
    env = dict(step.env, LMOD_CMD=lmod_planting_after_env(step, how), EESSI_ARCH_GUARD_TIMEOUT="5")

    started = time.monotonic()
    run = step.run(env, timeout=30)
    took = time.monotonic() - started

    assert (run.returncode, run.stderr) == (0, b"")
    assert took < 5
    assert run.stdout.startswith(b"export EESSI_ARCH_GUARD_FAILED=x86_64/intel/haswell->restore-failed\n")
    assert b"LD_PRELOAD" not in run.stdout
    assert b"/evil" not in run.stdout
    # Nothing was cached for the step's other tasks from a report that was not believed,
    # and the work directory is gone.
    assert step.scratch_names() <= {
        os.path.basename(step.cache_path()),
        os.path.basename(step.cache_path()) + ".lock",
    }


# The attacker of issue 18, defect 1, as another unprivileged user: it watches the directories
# with inotify (through ctypes: the stdlib has no binding) for the helper's work directories,
# renames each one away as it appears and plants its own in its place with a forged report;
# it leaves alone directories of its own uid. inotify wakes it within microseconds of the
# mkdir, sooner than a poller would, and costs nothing between events; a full listing of the
# directories, after each quiet fifth of a second and after a queue overflow, catches anything
# an event missed. Writes "<dir> <seen> <moved> <denied>" per directory when SIGTERM stops it.
ATTACKER = r"""
import ctypes, os, select, signal, struct, sys
*watched, forged, out = sys.argv[1:]
IN_MOVED_TO, IN_CREATE, IN_Q_OVERFLOW, IN_ISDIR = 0x80, 0x100, 0x4000, 0x40000000
EVENT = struct.Struct("iIII")
libc = ctypes.CDLL(None, use_errno=True)
inotify = libc.inotify_init1(os.O_CLOEXEC)
if inotify < 0:
    raise OSError(ctypes.get_errno(), "inotify_init1")
directory_of = {}
for d in watched:
    wd = libc.inotify_add_watch(inotify, os.fsencode(d), IN_CREATE | IN_MOVED_TO)
    if wd < 0:
        raise OSError(ctypes.get_errno(), "inotify_add_watch", d)
    directory_of[wd] = d
counts = {d: [0, 0, 0] for d in watched}
done = set()
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
parent = os.getppid()


def attack(d, name):
    if not name.startswith(".eessi-arch-guard-restore.") or (d, name) in done:
        return
    try:
        # Another user's directories only: the attacker's own are not an attack (and may be
        # those of a guard running as this user elsewhere on the machine).
        if os.lstat(os.path.join(d, name)).st_uid == os.getuid():
            return
    except OSError:
        return
    done.add((d, name))
    counts[d][0] += 1
    try:
        os.rename(os.path.join(d, name), os.path.join(d, "moved-by-attacker-" + name))
        os.mkdir(os.path.join(d, name), 0o777)
        for report in ("before.env", "after.env", "complete"):
            os.symlink(forged, os.path.join(d, name, report))
        counts[d][1] += 1
    except OSError:
        counts[d][2] += 1


def sweep():
    for d in watched:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            attack(d, name)


open(out + ".ready", "w").close()
while not stop and os.getppid() == parent:  # an orphan (its test killed) stops too
    try:
        ready, _, _ = select.select([inotify], [], [], 0.2)
    except InterruptedError:
        continue
    if not ready:
        sweep()
        continue
    events = os.read(inotify, 1 << 16)
    offset = 0
    while offset < len(events):
        wd, mask, _cookie, length = EVENT.unpack_from(events, offset)
        name = events[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
        offset += EVENT.size + length
        if mask & IN_Q_OVERFLOW:
            sweep()
        elif mask & IN_ISDIR and wd in directory_of:
            attack(directory_of[wd], os.fsdecode(name))
with open(out, "w") as handle:
    for d, (seen, moved, denied) in counts.items():
        handle.write(f"{d} {seen} {moved} {denied}\n")
"""
# 100 tries, as the acceptance asks: about 30 s on two shared cores.
ATTACK_TRIES = 100


def test_work_directory_attack_by_another_user_in_an_open_tmpdir_gives_the_job_nothing(
    guard_site, tmp_path, unprivileged_user, user_tmp_path, reference_reload
):
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    # A root-owned TMPDIR that anyone can write, without the sticky bit, where the attacker can reach it.
    open_tmpdir = Path(tempfile.mkdtemp(prefix="hpcstack-open-tmpdir-"))
    os.chmod(open_tmpdir, 0o777)  # noqa: S103 (the attack's precondition)
    forged = user_tmp_path / "forged.env"
    forged.write_bytes(b"PATH=/evil\0LD_PRELOAD=/tmp/evil.so\0EESSI_SOFTWARE_SUBDIR=x86_64/amd/zen3\0")
    out = user_tmp_path / "attacker.out"
    attacker = subprocess.Popen(
        unprivileged_user.command(
            ["/usr/bin/python3", "-I", "-c", ATTACKER, str(open_tmpdir), "/tmp", str(forged), str(out)]
        ),
        env=unprivileged_user.env(),
        stdin=subprocess.DEVNULL,
    )
    step = Step(guard_site, tmp_path)
    env = {
        name: value for name, value in step.env.items() if name != "SLURM_JOB_ID"
    }  # no cache: each try reloads
    env["TMPDIR"] = str(open_tmpdir)
    try:
        give_up = time.monotonic() + 30
        while not (user_tmp_path / "attacker.out.ready").exists() and time.monotonic() < give_up:
            time.sleep(0.02)
        assert attacker.poll() is None, "the attacker did not start"
        runs = [step.run(env) for _try in range(ATTACK_TRIES)]
    finally:
        attacker.send_signal(signal.SIGTERM)
        attacker.wait(timeout=30)
        shutil.rmtree(open_tmpdir, ignore_errors=True)

    assert [(run.returncode, run.stdout, run.stderr) for run in runs] == [
        (0, reference_reload, b"")
    ] * ATTACK_TRIES
    counts = {line.split()[0]: [int(n) for n in line.split()[1:]] for line in out.read_text().splitlines()}
    # Nothing of the guard's appeared in the open TMPDIR; in /tmp (sticky) no rename succeeded.
    assert counts[str(open_tmpdir)] == [0, 0, 0]
    # The watcher works: it saw the work directories in /tmp, and was refused each rename.
    assert counts["/tmp"][0] >= 1
    assert counts["/tmp"][1] == 0
