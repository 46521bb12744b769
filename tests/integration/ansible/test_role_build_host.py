"""The build_host role's refusals and its check mode, on this machine.

Each refusal is one failed task whose message says what is wrong and what to set, and it
comes before the role writes anything: the command's directory, the command and the state
root are not created. The refusal cases share one ansible-playbook run, each on a host of its
own (see "the refusals" below). Check mode on a new host reports what it would change and writes
nothing either. (The first install, EasyBuild's with it, its second run, what the installed
command does, and a new release of the core installed on the next run are the molecule
scenario's: test_molecule_build_host.py.)
"""

from __future__ import annotations

import os
import re

import pytest

import checkout
import pythons
from localplay import LocalPlaybooks
from tests.integration.harness import refusal_batch

PLAYBOOK = """\
- name: Prepare a build host
  hosts: localhost
  gather_facts: false
  roles:
    - role: hpcstack.ops.build_host
"""


class Host:
    """A temporary root with a live tree, and the role's directories inside it."""

    def __init__(self, root, collection=checkout.REPO):
        self.root = root
        self.apps = root / "apps"
        (self.apps / "software").mkdir(parents=True)
        self.playbook = root / "play.yml"
        self.playbook.write_text(PLAYBOOK)
        # HOME for pip's cache, which .venv's install of the same EasyBuild filled.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
        self.playbooks = LocalPlaybooks(root / "ansible", env, collection)

    def variables(self, **overrides) -> dict:
        variables = {
            "build_host_prefix": str(self.root / "opt"),
            "build_host_bin_dir": str(self.root / "bin"),
            "build_host_installpath": str(self.apps),
        }
        variables.update(overrides)
        return variables

    def run(self, *extra, **overrides):
        extra_vars = [
            item for name, value in self.variables(**overrides).items() for item in ("-e", f"{name}={value}")
        ]
        return self.playbooks.run(str(self.playbook), *extra_vars, *extra)

    def written(self) -> list:
        """What the role made: its directories, the command, the state root."""
        candidates = [self.root / "opt", self.root / "bin", self.apps / ".eb-staged-rebuild"]
        return [str(path) for path in candidates if os.path.lexists(path)]


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


# ------------------------------------------------------------------ the refusals
#
# Every refusal case arranges a node of its own (a Host under one scratch directory) and names
# the variables the role gets there. One ansible-playbook run holds them all: one play over
# every case, each an inventory host of its own (this machine, under the case's name, with the
# case's variables as its host variables; the role looks at no other host), the role in a
# block whose rescue ends that host's play. Each test reads its host's lines of the run: the
# one task that failed there, its message, and what the node holds after it. (The exit status
# of a refused run, 2, is shown by the first case, which runs on its own.)

REFUSAL_PLAY = """\
- name: Prepare build hosts the role refuses
  hosts: all
  gather_facts: false
""" + refusal_batch.RESCUED_ROLE.format(role="hpcstack.ops.build_host")
BATCH = refusal_batch.Batch("build_host_refusals")
REFUSAL = BATCH.mark
_case = BATCH.case  # register ``arrange(host) -> variables`` as a refusal case


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("build-host-refusals")
    hosts, inventory = {}, {}
    aliases = BATCH.aliases()
    for name, arrange in BATCH.arrange.items():
        host = hosts[name] = Host(scratch / aliases[name])
        inventory[aliases[name]] = {"ansible_connection": "local", **host.variables(**arrange(host))}
    play = refusal_batch.run(scratch, REFUSAL_PLAY, inventory, forks=len(inventory))
    return refusal_batch.Refusals(play, hosts, aliases)


def _failed_tasks(output: str, host: str) -> list:
    """The names of the tasks that failed on ``host`` in ``output``."""
    sections = re.split(r"^TASK \[", output, flags=re.M)[1:]
    return [
        section.split("\n", 1)[0].rsplit("] *", 1)[0]
        for section in sections
        if re.search(rf"^(fatal|failed): \[{re.escape(host)}\]", section, re.M)
    ]


def _refused(refusals, name, message) -> str:
    """Case ``name`` was refused by one task, whose message says ``message``, and the rescue
    ran; the node's lines of the run."""
    lines = refusals.lines(name)
    alias = refusals.aliases[name]
    assert len(_failed_tasks(refusals.play.stdout, alias)) == 1, refusals.play.output
    assert message in lines, lines
    rescue = refusals.play.stdout.split("TASK [The role refused]", 1)[1]
    assert f"ok: [{alias}]" in rescue, refusals.play.output
    return lines


@REFUSAL
def test_every_refusal_case_ran_on_a_host_of_its_own_and_was_refused(refusals):
    refusal_batch.assert_every_case_refused(refusals)


def test_no_live_tree_and_no_state_root_is_refused(host):
    """A refusal in a run of its own: the play fails, exit status 2, at that one task."""
    play = host.run(build_host_installpath="")

    assert play.done.returncode == 2, play.output
    assert play.failed == 1, play.output
    assert "set build_host_installpath (the live tree; its state root is then" in play.stdout
    assert host.written() == []


_case("a relative state root", lambda host: {"build_host_state_root": "state"})


@REFUSAL
def test_a_relative_state_root_is_refused(refusals):
    name = "a relative state root"

    _refused(refusals, name, "as absolute paths")
    assert refusals.hosts[name].written() == []


_case("a missing live tree", lambda host: {"build_host_installpath": str(host.root / "no-such-tree")})


@REFUSAL
def test_a_live_tree_that_does_not_exist_is_refused(refusals):
    name = "a missing live tree"
    host = refusals.hosts[name]

    _refused(refusals, name, f"build_host_installpath {host.root}/no-such-tree is not a directory")
    assert host.written() == []


_case("a missing Python", lambda host: {"build_host_python": str(host.root / "no-python")})


@REFUSAL
def test_a_missing_python_is_refused(refusals):
    name = "a missing Python"
    host = refusals.hosts[name]

    lines = _refused(refusals, name, f"{host.root}/no-python does not run")
    assert "set build_host_python to another interpreter" in lines
    assert host.written() == []


def _old_python(host):
    old = pythons.find("3.7") or pythons.find("3.6")
    assert old, "no Python 3.6 or 3.7 here (pyenv) to show the refusal of an old interpreter with"
    return {"build_host_python": old}


_case("a Python older than 3.8", _old_python)


@REFUSAL
def test_a_python_older_than_3_8_is_refused(refusals):
    name = "a Python older than 3.8"
    old = pythons.find("3.7") or pythons.find("3.6")

    lines = _refused(refusals, name, f"{old} is Python 3.")
    assert "eb-staged-rebuild needs Python 3.8 or newer" in lines
    assert refusals.hosts[name].written() == []


_case("no Lmod", lambda host: {"build_host_lmod_cmd": str(host.root / "no-lmod")})


@REFUSAL
def test_a_host_without_lmod_is_refused(refusals):
    name = "no Lmod"
    host = refusals.hosts[name]

    _refused(refusals, name, f"Lmod does not run as {host.root}/no-lmod")
    assert host.written() == []


def _state_root_through_a_link(host):
    (host.root / "real").mkdir()
    (host.root / "link").symlink_to(host.root / "real")
    return {"build_host_state_root": str(host.root / "link" / "state")}


_case("a state root reached through a link", _state_root_through_a_link)


@REFUSAL
def test_a_state_root_reached_through_a_link_is_refused(refusals):
    name = "a state root reached through a link"
    host = refusals.hosts[name]

    _refused(refusals, name, f"is reached through the symbolic link {host.root}/link")
    assert list((host.root / "real").iterdir()) == []
    assert host.written() == []


_case("a backend that does not exist", lambda host: {"build_host_backend": "chroot"})


@REFUSAL
def test_a_backend_that_does_not_exist_is_refused_by_the_argument_spec(refusals):
    name = "a backend that does not exist"

    lines = _refused(refusals, name, "build_host_backend")
    assert "chroot" in lines
    assert refusals.hosts[name].written() == []


_case("a build account that does not exist", lambda host: {"build_host_build_user": "no-such-account"})


@REFUSAL
def test_a_build_account_that_does_not_exist_is_refused(refusals):
    name = "a build account that does not exist"

    _refused(refusals, name, "the build account no-such-account (group root) does not exist on this host")
    assert refusals.hosts[name].written() == []


# ------------------------------------------------------------------ check mode


def test_check_mode_on_a_new_host_reports_changes_and_writes_nothing(host):
    play = host.run("--check", "--diff")

    assert (play.done.returncode, play.failed) == (0, 0), play.output
    assert play.changed > 0
    assert host.written() == []
