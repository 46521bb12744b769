"""Which processes count as a configless slurmd: a table of what /proc says, and real
processes of root's. (A user's fake slurmd, run as another uid, is in
tests/integration/ansible/test_arch_guard_role_attacks.py.)"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

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


@pytest.mark.parametrize(
    ("exe", "names", "counted"),
    [
        # Debian: /usr/sbin/slurmd is a link to slurmd-wlm, the file the kernel runs.
        ("/usr/sbin/slurmd-wlm", {"slurmd", "slurmd-wlm"}, True),
        ("/usr/sbin/slurmd-wlm (deleted)", {"slurmd", "slurmd-wlm"}, True),
        ("/usr/sbin/slurmd-wlm", {"slurmd"}, False),
        ("/usr/bin/python3", {"slurmd", "slurmd-wlm"}, False),
    ],
)
def test_the_binary_slurmd_resolves_to_counts_by_its_own_name(exe, names, counted):
    assert slurmd.counts(dict(REAL, exe=exe), [0], names) is counted


def test_the_names_of_slurmd_are_those_its_links_in_the_system_s_directories_resolve_to(tmp_path):
    sbin, local = tmp_path / "sbin", tmp_path / "local"
    sbin.mkdir()
    local.mkdir()
    (sbin / "slurmd-wlm").write_bytes(b"")
    (sbin / "slurmd").symlink_to("slurmd-wlm")
    (local / "slurmd").write_bytes(b"")

    assert slurmd.binary_names([str(sbin), str(local), str(tmp_path / "missing")]) == {"slurmd", "slurmd-wlm"}
    assert slurmd.binary_names([str(local)]) == {"slurmd"}


def test_slurmd_user_s_processes_count_too():
    process = dict(REAL, uids=[64030, 64030])

    assert slurmd.counts(process, [0]) is False
    assert slurmd.counts(process, slurmd.allowed_uids("64030")) is True
    assert slurmd.allowed_uids("root") == [0]
    assert slurmd.allowed_uids("no-such-user-here") == [0]


def _started(argv, exe):
    """``argv`` started, once the kernel runs it from ``exe`` with its command line (exec
    sets the file a moment before the arguments)."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    for _attempt in range(500):
        started = os.readlink(f"/proc/{child.pid}/exe") == os.path.realpath(exe)
        if started and b"--conf-server" in Path(f"/proc/{child.pid}/cmdline").read_bytes():
            return child
        time.sleep(0.01)
    child.kill()
    raise AssertionError(f"{argv} did not start {exe}")


def test_a_slurmd_started_through_a_link_counts_by_the_file_it_runs(tmp_path):
    # As Debian installs it: sbin/slurmd -> slurmd-wlm, started as "slurmd".
    sbin = tmp_path / "sbin"
    sbin.mkdir(mode=0o755)
    shutil.copy("/bin/sh", sbin / "slurmd-wlm")
    (sbin / "slurmd-wlm").chmod(0o755)
    (sbin / "slurmd").symlink_to("slurmd-wlm")
    child = _started(
        [str(sbin / "slurmd"), "-c", "sleep 60; :", "slurmd", "--conf-server", "ctl"], sbin / "slurmd-wlm"
    )
    try:
        found = slurmd.configless_pids(search_path=[str(sbin)])
        without = slurmd.configless_pids(search_path=[])
    finally:
        child.kill()
        child.wait()

    assert child.pid in found
    assert child.pid not in without


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
