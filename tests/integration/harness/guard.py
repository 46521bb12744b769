"""The real ``eessi-arch-guard`` against an EESSI-like prefix, with real bash and Lmod.

A node is ``(cpu_target, accel)``; its variables (``EessiPrefix.node_env``) make archdetect
answer for it. A job environment is what a login node's shell exported after loading
modules, with the compute node's variables laid over it: the situation the guard repairs.
The guard runs the way a node without an installation runs it, ``python -IS`` with the
checkout's ``module_utils`` as the package ``hpcstack_ops``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import checkout
import eessilike
import stackenv
from tests.support import slurm_taskprolog

GUARD_TIMEOUT = 120
GPU = "accel/nvidia/cc80"


def node_id(node) -> str:
    cpu, accel = node
    return f"{cpu}+gpu" if accel else cpu


def as_bytes(env: dict) -> dict:
    return {os.fsencode(name): os.fsencode(value) for name, value in env.items()}


def as_str(env: dict) -> dict:
    return {os.fsdecode(name): os.fsdecode(value) for name, value in env.items()}


@dataclass(frozen=True)
class GuardRun:
    returncode: int
    stdout: bytes
    stderr: bytes


@dataclass
class GuardSite:
    """An EESSI-like prefix, the machine's Lmod, and the guard to run against them."""

    prefix: eessilike.EessiPrefix
    lmod: stackenv.Lmod
    package_root: Path
    python: str = sys.executable
    _logins: dict = field(default_factory=dict)

    def guard_argv(self, *args: str) -> list[str]:
        return checkout.guard_argv(self.python, self.package_root, *args)

    def login(self, node, modules=None) -> dict:
        """The environment a login shell on ``node`` exports after loading ``modules``."""
        key = (node, tuple(modules or ()))
        if key not in self._logins:
            self._logins[key] = eessilike.login_environment(
                self.lmod, self.prefix, self.prefix.node_env(*node), modules
            )
        return dict(self._logins[key])

    def job_env(self, login_node, compute_node, modules=None, **extra: str) -> dict:
        """A task's environment: the login shell's, seen on ``compute_node``."""
        env = self.login(login_node, modules)
        env.update(self.prefix.node_env(*compute_node))
        env.update(extra)
        return env

    def run(self, env: dict, *args: str) -> GuardRun:
        done = subprocess.run(
            self.guard_argv(*args),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=GUARD_TIMEOUT,
            check=False,
        )
        return GuardRun(done.returncode, done.stdout, done.stderr)

    def as_prolog(self, env: dict) -> tuple[GuardRun, dict]:
        """Run the guard as Slurm's TaskProlog and apply its output the way slurmd does."""
        run = self.run(env)
        applied = slurm_taskprolog.parse(run.stdout, as_bytes(env))
        return run, as_str(applied.env)

    def in_job_script(self, env: dict, after: str = "true") -> eessilike.ShellRun:
        """A batch script doing ``eval "$(eessi-arch-guard --shell)"``, then ``after``."""
        guard = " ".join(shlex.quote(part) for part in self.guard_argv("--shell"))
        return eessilike.run_shell(self.lmod, env, f'eval "$({guard})" && {after}')

    def repaired(self, env: dict, mode: str) -> dict:
        """The task's environment after the guard, as the TaskProlog (``mode`` "prolog") or
        by ``eval "$(guard --shell)"`` in a job script ("shell"); the guard must succeed."""
        if mode == "prolog":
            run, task = self.as_prolog(env)
            assert run.returncode == 0, run.stderr
            return task
        script = self.in_job_script(env)
        assert script.returncode == 0, script.stderr
        return script.env

    def module_list(self, env: dict) -> list[str]:
        """``module -t list`` in a shell started from ``env``."""
        ran = eessilike.run_shell(self.lmod, env, "module -t list")
        assert ran.returncode == 0, ran.stderr
        return [line for line in ran.stderr.split() if "/" in line]


@pytest.fixture(scope="session")
def eessi_prefix(tmp_path_factory) -> eessilike.EessiPrefix:
    return eessilike.build_prefix(tmp_path_factory.mktemp("eessi"))


@pytest.fixture(scope="session")
def guard_site(eessi_prefix, lmod, package_root) -> GuardSite:
    return GuardSite(prefix=eessi_prefix, lmod=lmod, package_root=package_root)
