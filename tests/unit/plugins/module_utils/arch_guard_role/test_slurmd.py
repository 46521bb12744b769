"""Which processes count as a configless slurmd: a table of what /proc says, and real
processes of root's. (A user's fake slurmd, run as another uid, is in
tests/integration/test_arch_guard_role_attacks.py.)"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import slurmd

REAL = {
    "uids": [0, 0],
    "exe": "/usr/sbin/slurmd",
    "exe_uid": 0,
    "exe_mode": 0o755,
    "argv": ["/usr/sbin/slurmd", "--conf-server", "ctl:6817"],
}


@pytest.mark.parametrize(
    ("change", "counted"),
    [
        ({}, True),
        ({"argv": ["slurmd", "--conf-server=ctl"]}, True),
        ({"exe": "/usr/sbin/slurmd (deleted)"}, True),  # upgraded since it started
        ({"exe": "/opt/slurm/23.11/sbin/slurmd"}, True),
        ({"argv": ["/usr/sbin/slurmd"]}, False),
        ({"argv": ["/usr/sbin/slurmd", "-D", "x--conf-server"]}, False),
        # A user's process, whatever it runs and says.
        ({"uids": [1000, 1000]}, False),
        ({"uids": [0, 1000]}, False),
        ({"uids": [1000, 0]}, False),
        # Another program of root's that calls itself slurmd (a script: its exe is the shell).
        ({"exe": "/usr/bin/dash", "argv": ["/bin/sh", "/tmp/slurmd", "--conf-server", "x"]}, False),
        # A binary named slurmd that another user could have written.
        ({"exe": "/home/u/slurmd", "exe_uid": 1000}, False),
        ({"exe_mode": 0o775}, False),
        ({"exe_mode": 0o757}, False),
    ],
)
def test_a_process_counts_only_as_root_s_slurmd_binary_with_conf_server(change, counted):
    assert slurmd.counts(dict(REAL, **change), [0]) is counted


def test_slurmd_user_s_processes_count_too():
    process = dict(REAL, uids=[64030, 64030])

    assert slurmd.counts(process, [0]) is False
    assert slurmd.counts(process, slurmd.allowed_uids("64030")) is True
    assert slurmd.allowed_uids("root") == [0]
    assert slurmd.allowed_uids("no-such-user-here") == [0]


def _started(argv, exe):
    """``argv`` started, once the kernel runs it from ``exe`` (its exec is done)."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    for _attempt in range(500):
        if os.readlink(f"/proc/{child.pid}/exe") == os.path.realpath(exe):
            return child
        time.sleep(0.01)
    child.kill()
    raise AssertionError(f"{argv} did not start {exe}")


def test_a_real_slurmd_binary_of_root_s_counts_and_a_script_named_slurmd_does_not(tmp_path):
    folder = tmp_path / "sbin"
    folder.mkdir(mode=0o755)
    # A copy of the shell named slurmd stands in for the binary: what counts is the file the
    # kernel runs, its owner and mode, and the command line. "; :" keeps the shell from
    # handing its process to sleep.
    binary = folder / "slurmd"
    shutil.copy("/bin/sh", binary)
    binary.chmod(0o755)
    script = tmp_path / "script" / "slurmd"
    script.parent.mkdir(mode=0o755)
    script.write_text("#!/bin/sh\nsleep 60; :\n")
    script.chmod(0o755)
    real = _started([str(binary), "-c", "sleep 60; :", "slurmd", "--conf-server", "ctl"], binary)
    named = _started([str(script), "--conf-server", "ctl"], "/bin/sh")
    try:
        found = slurmd.configless_pids()
        binary.chmod(0o775)
        writable = slurmd.configless_pids()
    finally:
        for child in (real, named):
            child.kill()
            child.wait()

    assert real.pid in found
    assert named.pid not in found
    assert stat.S_IMODE(binary.stat().st_mode) == 0o775
    assert real.pid not in writable
