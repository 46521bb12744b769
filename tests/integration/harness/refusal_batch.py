"""A role's refusal cases run as one batch: one ansible-playbook run over one inventory host
per case (this machine under the case's alias, ``case00``, ``case01``, ...), the role in a
block whose rescue ends that host's play, so every case is refused in the same run. Each test
then reads its case's part of the run's output.

The batch's tests go to one xdist worker (``--dist loadgroup``, the ``Batch.mark`` group),
which runs it once for all of them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, Dict

import pytest

from localplay import LocalPlaybooks

# The role inside a block whose rescue marks the host refused and lets the run go on.
RESCUED_ROLE = """\
  tasks:
    - name: Run the role
      block:
        - name: Run the role
          ansible.builtin.import_role:
            name: {role}
      rescue:
        - name: The role refused
          ansible.builtin.debug:
            msg: refused
"""


class Batch:
    """The registered refusal cases of one role: name -> ``arrange(host, ...) -> variables``."""

    def __init__(self, group: str) -> None:
        self.mark = pytest.mark.xdist_group(group)
        self.arrange: Dict[str, Callable] = {}

    def case(self, name: str, arrange: Callable) -> None:
        self.arrange[name] = arrange

    def aliases(self) -> Dict[str, str]:
        return {name: f"case{number:02d}" for number, name in enumerate(self.arrange)}


class Refusals:
    """The batch's run, and each case's node and inventory alias."""

    def __init__(self, play, hosts: dict, aliases: dict) -> None:
        self.play = play
        self.hosts = hosts
        self.aliases = aliases

    def lines(self, name: str) -> str:
        """The run's lines about case ``name``'s host."""
        tag = f"[{self.aliases[name]}]"
        return "\n".join(line for line in self.play.stdout.splitlines() if tag in line)

    def section(self, name: str) -> str:
        """The output of the play named ``refusal: <name>`` (a batch of one play per case)."""
        head = f"PLAY [refusal: {name}] "
        parts = re.split(r"^(?=PLAY \[|PLAY RECAP)", self.play.stdout, flags=re.M)
        found = [part for part in parts if part.startswith(head)]
        assert len(found) == 1, self.play.output
        return found[0]


def run(scratch: Path, playbook_text: str, inventory: dict, forks: int = 5):
    """Run ``playbook_text`` over ``inventory`` (alias -> host variables) in ``scratch``."""
    playbook = scratch / "refusals.yml"
    playbook.write_text(playbook_text)
    (scratch / "inventory.json").write_text(json.dumps({"all": {"hosts": inventory}}))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return LocalPlaybooks(scratch / "ansible", env).run(
        str(playbook), "--forks", str(forks), inventory=str(scratch / "inventory.json")
    )


def assert_every_case_refused(refusals: Refusals) -> None:
    """The run ended well, every case's host was in it, and each was rescued exactly once."""
    play = refusals.play
    assert play.done.returncode == 0, play.output
    assert set(play.recap) == set(refusals.aliases.values()), play.output
    rescued = dict(re.findall(r"^(case\d+)\s*:.*\brescued=(\d+)", play.stdout, re.M))
    assert rescued == {alias: "1" for alias in refusals.aliases.values()}, play.output
    assert play.failed == 0, play.output
