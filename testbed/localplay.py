"""Run the collection's playbooks by their full names against localhost, from this checkout.

``ansible-playbook hpcstack.ops.NAME -i localhost, -c local``, with the checkout linked into a
collections directory of the caller's and Ansible's own files kept there too, so nothing is
written into the checkout or the user's ``~/.ansible``. The demo and the playbook tests run
the playbooks this way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import checkout

PLAY_TIMEOUT = 900
MOLECULE_TIMEOUT = 900
# What a root shell has on PATH: the roles' scenarios run scontrol, runuser and the like.
ADMIN_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# The venv's Python runs Ansible and, as the interpreter of localhost, its modules.
BIN = Path(sys.executable).parent


class Play:
    """A finished ``ansible-playbook`` run and the counts of its recap, summed over its hosts.

    A count is None when the run printed no recap (it failed before any play ran).
    """

    def __init__(self, done: subprocess.CompletedProcess) -> None:
        self.done = done
        self.recap = {
            host: tuple(int(count) for count in counts) for host, *counts in RECAP.findall(done.stdout)
        }
        totals = [sum(column) for column in zip(*self.recap.values())] if self.recap else [None] * 4
        self.ok, self.changed, self.unreachable, self.failed = totals

    @property
    def stdout(self) -> str:
        return self.done.stdout

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    def published_run_id(self) -> str:
        """The run id the rebuild playbook's report names for what it published."""
        return re.search(r"by run (\S+) \(previous tree", self.stdout).group(1)


class LocalPlaybooks:
    """The playbooks, run on localhost with ``base_env`` and Ansible's files under ``scratch``;
    the collection is ``repo`` (this checkout, or a copy a test changes)."""

    def __init__(self, scratch: Path, base_env: dict, repo: Path = checkout.REPO) -> None:
        self.collections = checkout.link_collection(scratch / "collections", repo)
        self.home = scratch / "ansible-home"
        self.base_env = base_env

    def env(self) -> dict:
        return dict(
            self.base_env,
            PATH=f"{BIN}:{self.base_env.get('PATH', '/usr/bin:/bin')}",
            ANSIBLE_COLLECTIONS_PATH=str(self.collections),
            ANSIBLE_HOME=str(self.home),
            ANSIBLE_LOCAL_TEMP=str(self.home / "tmp"),
            ANSIBLE_REMOTE_TEMP=str(self.home / "remote-tmp"),
            ANSIBLE_NOCOLOR="1",
        )

    def argv(self, name: str, *extra: str, inventory: str = "localhost,") -> list:
        """``name`` is one of the collection's playbooks, or a playbook file (``*.yml``)."""
        return [
            str(BIN / "ansible-playbook"),
            name if name.endswith(".yml") else f"hpcstack.ops.{name}",
            "-i",
            inventory,
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *extra,
        ]

    def run(self, name: str, *extra: str, inventory: str = "localhost,") -> Play:
        """``ansible-playbook hpcstack.ops.NAME EXTRA`` (or a playbook file); every host of
        ``inventory`` is this machine."""
        done = subprocess.run(
            self.argv(name, *extra, inventory=inventory),
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PLAY_TIMEOUT,
            check=False,
        )
        return Play(done)


def molecule_test(
    scenario: str, collection: Path, scratch: Path, *, command: str = "test", **scenario_env: str
) -> subprocess.CompletedProcess:
    """``molecule test -s scenario`` from ``collection`` (a copy of the checkout), in the
    environment the playbook tests have, with Ansible's files under ``scratch`` and the
    scenario's own variables (``MOLECULE_...``) added. ``command``: another of molecule's
    commands (``converge``, ``idempotence``) on the scenario a test ran before."""
    ansible = LocalPlaybooks(scratch / "ansible", {"PATH": ADMIN_PATH}, collection)
    return subprocess.run(
        [str(BIN / "molecule"), command, "-s", scenario],
        cwd=collection,
        env=dict(os.environ, **ansible.env(), NO_COLOR="1", **scenario_env),
        capture_output=True,
        text=True,
        timeout=MOLECULE_TIMEOUT,
        check=False,
    )
