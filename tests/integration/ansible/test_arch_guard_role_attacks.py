"""The arch_guard role against a user of the node, of its own uid (``attacker_user``).

A prefix below a world-writable sticky directory (as the role's own tests use ``/tmp``), with
a component that does not exist yet: a racing attacker makes that component while the role
surveys the node and installs, moves what root made in it away, and puts its own launcher in
place of root's. The role must refuse with one line naming the component, or install
correctly, every time; no file of the attacker's may ever run.

The role is driven as its tasks drive it, in this process: the survey's view of the prefix
(``survey.look_at_prefix``), the plan's refusal (``plan.node``), then the install module's
three steps (``install.install_code``, ``switch``, ``write_launcher``, which runs the launcher
as root to check it). One ansible-playbook run per attempt would take 200 times half a
minute; the race is with what these functions do on the node, which is all the role does
there. The code installed is a stand-in package with the launcher's entry point: compiling
the guard's forty modules 200 times would cost minutes, and the code's content plays no part
in the race.

A user's fake ``slurmd`` (a script and a binary named slurmd, with ``--conf-server``) does not
make the survey take the node for configless.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import installed
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import (
    install,
    plan,
    slurmd,
    survey,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.version import VERSION
from tests.support.racing import ATTEMPTS

PYTHON = "/usr/bin/python3"
# At least 200 in `make test`; `make stress` sets 1,000.
ROLE_ATTEMPTS = max(200, ATTEMPTS)
# How long the attacker waits before it starts, in turn: before the survey, during it, during
# the install.
DELAYS = (0.0, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008)

# The attacker, as its own uid. For each component name read from stdin, until the stop file
# for it appears: make the component (it may write the sticky directory); once it is its own,
# plant its launcher below it, and move whatever root makes there away and plant again; when
# root made the component, try to rename it away and to put its launcher in place of root's
# (both must fail). Its launcher records the uid that ran it. It answers one JSON line per
# component: whether it made it, how often it moved root's directory away.
_ATTACKER = r"""
import json, os, sys, time
shared, evidence, control = sys.argv[1:4]
evil = ("#!/bin/sh\necho \"$(id -u)\" > %s/ran.$$\n" % evidence).encode()
stage = os.path.join(shared, ".attacker-%d" % os.getpid())
os.mkdir(stage)

def write_evil(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
    os.write(fd, evil)
    os.close(fd)
    os.chmod(path, 0o755)

def plant(prefix):
    for part in ("", "/bin", "/lib"):
        try:
            os.mkdir(prefix + part, 0o777)
        except FileExistsError:
            pass
    write_evil(prefix + "/bin/eessi-arch-guard")
    write_evil(prefix + "/bin/task-prolog")

for line in sys.stdin:
    name, delay = line.split()
    comp = os.path.join(shared, name)
    prefix = os.path.join(comp, "arch-guard")
    stop = os.path.join(control, "stop-" + name)
    mine, moved, swaps, tries = False, 0, 0, 0
    time.sleep(float(delay))
    while not os.path.exists(stop):
        tries += 1
        if not mine:
            try:
                os.mkdir(comp)
                os.chmod(comp, 0o777)
                mine = True
                plant(prefix)
            except OSError:
                pass
        if mine:
            try:
                if os.lstat(prefix).st_uid != os.getuid():
                    os.rename(prefix, os.path.join(comp, "away-%d" % moved))
                    moved += 1
                    plant(prefix)
            except OSError:
                pass
        else:
            # Root's: the swaps below must all fail; a breath between tries leaves a core to the role.
            time.sleep(0.0002)
            for target in ("/bin/eessi-arch-guard", "/bin/task-prolog"):
                try:
                    write_evil(stage + "/launcher")
                    os.rename(stage + "/launcher", prefix + target)
                    swaps += 1
                except OSError:
                    pass
            try:
                os.rename(comp, os.path.join(stage, name))
                swaps += 1
            except OSError:
                pass
    done = {"name": name, "mine": mine, "moved": moved, "swaps": swaps, "tries": tries}
    print(json.dumps(done), flush=True)
"""


def _stand_in_code() -> str:
    """A tar archive in base64 of a package with the launcher's entry point, ``run``."""
    members = {
        f"{installed.PACKAGE}/__init__.py": b"",
        f"{installed.PACKAGE}/arch_guard/__init__.py": b"",
        f"{installed.PACKAGE}/arch_guard/launcher.py": b"def run(**settings):\n    return 0\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


class Attacker:
    """The attacker's process: ``race(name, delay)`` starts it on a component, ``stop(name)``
    ends that attempt and returns what it did."""

    def __init__(self, user, shared: Path, evidence: Path, control: Path) -> None:
        self.control = control
        argv = user.command([PYTHON, "-c", _ATTACKER, str(shared), str(evidence), str(control)])
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=user.env(), text=True, cwd="/"
        )

    def race(self, name: str, delay: float) -> None:
        self.process.stdin.write(f"{name} {delay:.6f}\n")
        self.process.stdin.flush()

    def stop(self, name: str) -> dict:
        (self.control / f"stop-{name}").touch()
        answer = json.loads(self.process.stdout.readline())
        assert answer["name"] == name, answer
        return answer

    def close(self) -> None:
        self.process.stdin.close()
        returncode = self.process.wait(timeout=30)
        self.process.stdout.close()
        assert returncode == 0


@pytest.fixture
def sticky_base():
    """A directory of root's, 0755, that everyone may enter, outside pytest's private tmp."""
    base = Path(tempfile.mkdtemp(prefix="hpcstack-role-race-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _role_run(prefix: str, code: str, release: dict, launcher: str) -> str:
    """The role on one node, as its tasks go: the survey, the plan's refusal, then the install
    module's steps. "installed", or the one line it refused with."""
    settings = plan.Settings({"prefix": prefix, "python": PYTHON, "manage_slurm_conf": False})
    try:
        found = survey.survey(prefix=prefix)
        refusal = plan.node(settings, "node1", survey_facts=found)["refusals"]["prefix"]
        if refusal:
            return refusal
        install.install_code(prefix, release["build"], code, PYTHON)
        install.switch(prefix, release["build"], release)
        install.write_launcher(prefix, launcher=launcher, python=PYTHON)
    except errors.HpcstackError as err:  # the module's fail_json(msg=str(err))
        return str(err)
    return "installed"


def _owners(path: Path) -> set:
    return {entry.lstat().st_uid for entry in [path, *path.rglob("*")]}


def test_a_racing_user_never_gets_a_launcher_run_and_the_role_refuses_or_installs(attacker_user, sticky_base):
    shared = sticky_base / "shared"  # as /tmp: root's, world-writable, sticky
    shared.mkdir()
    shared.chmod(0o1777)
    evidence = sticky_base / "evidence"  # where the attacker's launcher says who ran it
    evidence.mkdir()
    evidence.chmod(0o1777)
    control = sticky_base / "control"
    control.mkdir()
    control.chmod(0o755)
    code = _stand_in_code()
    release = installed.release_record(VERSION, "ab" * 32, PYTHON)
    outcomes = {"installed": 0, "refused at the survey": 0, "refused while installing": 0}
    attacker_made = moved = 0
    attacker = Attacker(attacker_user, shared, evidence, control)
    started = time.monotonic()
    try:
        for attempt in range(ROLE_ATTEMPTS):
            name = f"c{attempt}"
            component = shared / name
            prefix = str(component / "arch-guard")
            launcher = plan.launcher_text(plan.Settings({"prefix": prefix}), PYTHON)
            # The attacker starts before the survey, during it or during the install.
            attacker.race(name, DELAYS[attempt % len(DELAYS)])

            outcome = _role_run(prefix, code, release, launcher)

            did = attacker.stop(name)
            attacker_made += did["mine"]
            moved += did["moved"]
            assert os.listdir(evidence) == [], f"attempt {attempt}: the attacker's launcher ran"
            assert did["swaps"] == 0, f"attempt {attempt}: the attacker replaced root's file: {did}"
            if outcome == "installed":
                outcomes["installed"] += 1
                info = component.lstat()
                assert (stat.S_ISDIR(info.st_mode), info.st_uid, stat.S_IMODE(info.st_mode)) == (
                    True,
                    0,
                    0o755,
                )
                assert _owners(component) == {0}, f"attempt {attempt}: {did}"
                assert (component / "arch-guard" / "bin" / "eessi-arch-guard").read_text() == launcher
                assert not did["mine"]
            else:
                assert "\n" not in outcome, outcome
                assert outcome.startswith(
                    f"arch_guard: {component} must be a directory (not a symlink) owned by root"
                ), outcome
                assert did["mine"], f"attempt {attempt}: refused though root made {component}: {outcome}"
                # Nothing of root's was made in the attacker's directory.
                assert _owners(component) == {attacker_user.uid}, f"attempt {attempt}: {outcome}"
                # The walk of the install module says why; the survey's refusal is the plan's line.
                installing = f"({component} belongs to uid {attacker_user.uid})" in outcome
                step = "refused while installing" if installing else "refused at the survey"
                outcomes[step] += 1
            shutil.rmtree(component)
    finally:
        attacker.close()
    took = time.monotonic() - started
    print(
        f"the role against a racing attacker, {ROLE_ATTEMPTS} attempts in {took:.1f} s: {outcomes}; "
        f"the attacker made the component {attacker_made} times and moved root's directory {moved} times"
    )
    assert sum(outcomes.values()) == ROLE_ATTEMPTS
    assert os.listdir(evidence) == []
    # The race was run: the attacker won the component in some attempts, root in others.
    assert outcomes["installed"] > 0
    assert outcomes["refused at the survey"] + outcomes["refused while installing"] > 0


# ------------------------------------------------------------------ a user's fake slurmd


def _wait_for_exe(pid: int, exe: str) -> None:
    """Until the kernel runs ``pid`` from ``exe`` with its new command line (exec sets the
    file a moment before the arguments)."""
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        try:
            started = os.readlink(f"/proc/{pid}/exe") == exe
            if started and b"--conf-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not start {exe}")


def test_a_user_s_fake_slurmd_does_not_make_the_node_configless(attacker_user, sticky_base, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\nTaskProlog=/etc/slurm/prolog.sh\n")
    before = survey.look_at_slurm_conf(str(conf))["identity"]["configless"]
    # The user's own: a script named slurmd, and a binary named slurmd (a copy of the shell:
    # "; :" keeps it from handing its process to sleep).
    own = sticky_base / "user"
    own.mkdir()
    script = own / "slurmd"
    script.write_text("#!/bin/sh\nsleep 60; :\n")
    binary = own / "bin" / "slurmd"
    binary.parent.mkdir()
    shutil.copy("/bin/sh", binary)
    for path in (own, script, binary, binary.parent):
        os.chown(path, attacker_user.uid, attacker_user.gid)
        path.chmod(0o755)
    # Root's binary named slurmd, run by the user: not root's process.
    sbin = sticky_base / "sbin"
    sbin.mkdir(mode=0o755)
    root_binary = sbin / "slurmd"
    shutil.copy("/bin/sh", root_binary)
    root_binary.chmod(0o755)
    keep = ["-c", "sleep 60; :", "slurmd"]
    fakes = [
        ([str(script), "--conf-server", "evil:6817"], "/bin/sh"),
        ([str(binary), *keep, "--conf-server", "evil:6817"], str(binary)),
        ([str(root_binary), *keep, "--conf-server=evil:6817"], str(root_binary)),
    ]
    children = []
    try:
        for argv, exe in fakes:
            child = subprocess.Popen(attacker_user.command(argv), env=attacker_user.env(), cwd="/")
            children.append(child)
            _wait_for_exe(child.pid, os.path.realpath(exe))
        counted = slurmd.configless_pids()
        found = survey.look_at_slurm_conf(str(conf))
        # The same binary of root's, run by root: it counts (the detection is not blind).
        real = subprocess.Popen([str(root_binary), *keep, "--conf-server", "ctl:6817"])
        children.append(real)
        _wait_for_exe(real.pid, str(root_binary))
        with_root_s = slurmd.configless_pids()
    finally:
        for child in children:
            child.kill()
            child.wait()

    assert [child.pid for child in children[:3] if child.pid in counted] == []
    assert found["identity"]["configless"] is before
    identities = [("node1", found["identity"]), ("node2", dict(found["identity"], dev="254:9"))]
    assert plan.auto_layout(identities) != "configless" or before
    assert real.pid in with_root_s
