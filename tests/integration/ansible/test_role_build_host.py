"""The build_host role's refusals and its check mode, on this machine.

Each refusal is one failed task whose message says what is wrong and what to set, and it
comes before the role writes anything: the command's directory, the command and the state
root are not created. Check mode on a new host reports what it would change and writes
nothing either. A new release of the collection's core is installed again on the next run,
and the run after that changes nothing; that test starts from a virtual environment that
already holds EasyBuild. (The first install, EasyBuild's with it, its second run and what the
installed command does are the molecule scenario's: test_molecule_build_host.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import checkout
import pythons
from localplay import LocalPlaybooks

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


def _refused(play, message):
    assert play.done.returncode == 2, play.output
    assert play.failed == 1, play.output
    assert message in play.stdout, play.stdout


def test_no_live_tree_and_no_state_root_is_refused(host):
    play = host.run(build_host_installpath="")

    _refused(play, "set build_host_installpath (the live tree; its state root is then")
    assert host.written() == []


def test_a_relative_state_root_is_refused(host):
    play = host.run(build_host_state_root="state")

    _refused(play, "as absolute paths")
    assert host.written() == []


def test_a_live_tree_that_does_not_exist_is_refused(host):
    play = host.run(build_host_installpath=str(host.root / "no-such-tree"))

    _refused(play, f"build_host_installpath {host.root}/no-such-tree is not a directory")
    assert host.written() == []


def test_a_missing_python_is_refused(host):
    play = host.run(build_host_python=str(host.root / "no-python"))

    _refused(play, f"{host.root}/no-python does not run")
    assert "set build_host_python to another interpreter" in play.stdout
    assert host.written() == []


def test_a_python_older_than_3_8_is_refused(host):
    old = pythons.find("3.7") or pythons.find("3.6")
    assert old, "no Python 3.6 or 3.7 here (pyenv) to show the refusal of an old interpreter with"

    play = host.run(build_host_python=old)

    _refused(play, f"{old} is Python 3.")
    assert "eb-staged-rebuild needs Python 3.8 or newer" in play.stdout
    assert host.written() == []


def test_a_host_without_lmod_is_refused(host):
    play = host.run(build_host_lmod_cmd=str(host.root / "no-lmod"))

    _refused(play, f"Lmod does not run as {host.root}/no-lmod")
    assert host.written() == []


def test_a_state_root_reached_through_a_link_is_refused(host):
    (host.root / "real").mkdir()
    (host.root / "link").symlink_to(host.root / "real")

    play = host.run(build_host_state_root=str(host.root / "link" / "state"))

    _refused(play, f"is reached through the symbolic link {host.root}/link")
    assert list((host.root / "real").iterdir()) == []
    assert host.written() == []


def test_a_backend_that_does_not_exist_is_refused_by_the_argument_spec(host):
    play = host.run(build_host_backend="chroot")

    _refused(play, "build_host_backend")
    assert "chroot" in play.stdout
    assert host.written() == []


def test_check_mode_on_a_new_host_reports_changes_and_writes_nothing(host):
    play = host.run("--check", "--diff")

    assert (play.done.returncode, play.failed) == (0, 0), play.output
    assert play.changed > 0
    assert host.written() == []


def test_a_build_account_that_does_not_exist_is_refused(host):
    play = host.run(build_host_build_user="no-such-account")

    _refused(play, "the build account no-such-account (group root) does not exist on this host")
    assert host.written() == []


def _task_changed(play, task):
    """Whether the task named ``task`` reported a change in ``play``."""
    section = play.stdout.split(f"TASK [hpcstack.ops.build_host : {task}]", 1)
    assert len(section) == 2, f"task {task!r} did not run:\n{play.stdout}"
    return section[1].split("\nTASK [", 1)[0].lstrip("* \n").startswith("changed:")


def _venv_holding_easybuild(venv: Path) -> None:
    """A virtual environment as the role's first run leaves it, without installing EasyBuild
    again (the molecule scenario's first run does that): made from the role's default
    interpreter, with .venv's EasyBuild at the pinned release, setuptools and pip on its path
    (a .pth file) and EasyBuild's ``eb`` (a shell script that runs ``$EB_PYTHON``)."""
    pinned = yaml.safe_load((checkout.REPO / "roles" / "build_host" / "defaults" / "main.yml").read_text())
    assert metadata.version("easybuild") == pinned["build_host_easybuild_version"]
    subprocess.run([pinned["build_host_python"], "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python3*/site-packages")
    assert site.name == Path(sysconfig.get_paths()["purelib"]).name
    (site / "hpcstack-test-easybuild.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    shutil.copy2(Path(sys.executable).parent / "eb", venv / "bin" / "eb")


def test_a_new_release_of_the_core_is_installed_on_the_next_run(tmp_path):
    collection = checkout.copy_to(tmp_path / "collection")
    host = Host(tmp_path / "host", collection)
    _venv_holding_easybuild(host.root / "opt" / "venv")
    first = host.run()
    assert (first.done.returncode, first.failed) == (0, 0), first.output
    cli = collection / "plugins" / "module_utils" / "staged_rebuild" / "cli.py"
    cli.write_text(cli.read_text() + "# a later release\n")

    second = host.run()
    third = host.run()

    assert (second.done.returncode, second.failed) == (0, 0), second.output
    assert _task_changed(second, "Install the core with pip")
    [installed] = (host.root / "opt" / "venv").glob(
        "lib/python3*/site-packages/hpcstack_ops/staged_rebuild/cli.py"
    )
    assert installed.read_text().endswith("# a later release\n")
    assert (third.done.returncode, third.changed) == (0, 0), third.output
