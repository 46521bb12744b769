"""``hpcstack.ops.arch_guard_info`` in a real ``ansible-playbook`` on this machine, unsimulated.

archdetect (our stand-in) reads this machine's real ``/proc/cpuinfo``: nothing in the task
simulates a node. The EESSI-like root has two versions: ``MATCH``, whose targets are the one
the stand-in gives for this CPU and one it cannot use, and ``MISMATCH``, whose only target is
that one, so no candidate of this CPU has software there (``no-software-dir``). Two inventory
hosts are this machine (``ansible_connection=local``), one with the arch_guard role's install
layout under its prefix and one without. The playbook
aggregates the results as a fleet report does, with the expressions of the module's
EXAMPLES, and writes them to a file on the controller.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

import eessilike
from localplay import LocalPlaybooks
from tests.support.nodeinfo import RELEASE, install_guard

# What the module reports depends on this machine's CPU: the other-cpu gate runs it again.
pytestmark = pytest.mark.host_cpu

MATCH = "2023.06"
MISMATCH = "2025.06"
HOSTS = ("node1", "node2")

PLAYBOOK = textwrap.dedent(
    """\
    - name: What eessi-arch-guard sees on each node
      hosts: all
      gather_facts: false
      tasks:
        - name: What the guard sees here
          hpcstack.ops.arch_guard_info:
            eessi_root: "{{ eessi_root }}"
            prefix: "{{ guard_prefix }}"
            tmpdir: "{{ job_tmpdir }}"
            versions: "{{ eessi_versions | default(omit) }}"
          register: guard_info

        - name: The fleet report
          ansible.builtin.copy:
            dest: "{{ report_file }}"
            mode: "0600"
            content: "{{ fleet | to_nice_json }}"
          vars:
            fleet:
              hosts: >-
                {{ dict(ansible_play_hosts
                   | zip(ansible_play_hosts | map('extract', hostvars, 'guard_info'))) }}
              targets_of_match: >-
                {{ dict(ansible_play_hosts | zip(ansible_play_hosts
                   | map('extract', hostvars, ['guard_info', 'targets', '@MATCH@']))) }}
              no_software_dir: >-
                {{ ansible_play_hosts
                   | zip(ansible_play_hosts | map('extract', hostvars, ['guard_info', 'problems'])
                         | map('dict2items') | map('map', attribute='value') | map('list'))
                   | selectattr('1', 'contains', 'no-software-dir') | map(attribute='0') | list }}
          delegate_to: localhost
          run_once: true
          check_mode: false
          changed_when: false
    """
).replace("@MATCH@", MATCH)


class Fleet:
    """The EESSI-like root, the two hosts' guard prefixes, and the playbook to run on them."""

    def __init__(self, root, node_target: str, other: str) -> None:
        self.root = root
        self.eessi_root = root / "eessi"
        eessilike.build_prefix(self.eessi_root, version=MATCH, targets=(node_target, other), accel={})
        eessilike.build_prefix(self.eessi_root, version=MISMATCH, targets=(other,), accel={})
        self.installed = install_guard(root / "guard-node1")
        self.job_tmp = root / "job-tmp"
        self.job_tmp.mkdir()
        self.report_file = root / "fleet.json"
        self.playbook = root / "play.yml"
        self.playbook.write_text(PLAYBOOK)
        inventory = root / "hosts.ini"
        inventory.write_text(
            "[nodes]\n"
            f"node1 ansible_connection=local guard_prefix={self.installed}\n"
            f"node2 ansible_connection=local guard_prefix={root / 'guard-node2'}\n"
        )
        self.inventory = inventory
        # No LMOD_CMD: the module looks in Lmod's usual locations, as over ssh.
        self.playbooks = LocalPlaybooks(root / "ansible", {"PATH": "/usr/local/bin:/usr/bin:/bin"})

    def run(self, *extra: str):
        play = self.playbooks.run(
            str(self.playbook),
            "-e",
            f"eessi_root={self.eessi_root}",
            "-e",
            f"job_tmpdir={self.job_tmp}",
            "-e",
            f"report_file={self.report_file}",
            *extra,
            inventory=str(self.inventory),
        )
        report = json.loads(self.report_file.read_text()) if self.report_file.exists() else None
        return play, report


@pytest.fixture
def fleet(tmp_path):
    return Fleet(tmp_path, *eessilike.node_and_elsewhere())


def test_the_real_cpu_gets_its_target_and_the_other_version_no_software_dir(fleet, lmod):
    node_target = eessilike.cpupath()[0]

    play, report = fleet.run()

    assert (play.done.returncode, play.failed, play.changed) == (0, 0, 0), play.output
    assert sorted(play.recap) == list(HOSTS)
    for host in HOSTS:
        info = report["hosts"][host]
        assert info["changed"] is False
        assert info["available_versions"] == [MATCH, MISMATCH]
        assert info["targets"] == {MATCH: node_target, MISMATCH: None}
        assert info["problems"] == {MISMATCH: "no-software-dir"}
        match, mismatch = info["eessi"]
        assert match["cpupath"][0] == node_target
        assert (
            match["software_dir"]
            == f"{fleet.eessi_root}/versions/{MATCH}/software/linux/{node_target}/software"
        )
        assert match["software_dir_exists"] is True
        assert (match["accelpath"], match["accel"]) == (None, None)
        assert mismatch["cpupath"] == match["cpupath"]
        assert mismatch["software_dir_exists"] is False
        assert mismatch["detail"].startswith("no software directory for any of ")
        assert info["cache_dir"] == str(fleet.job_tmp)
        assert info["lmod"] == {"cmd": str(lmod.cmd), "executable": True, "source": "search"}
    assert report["targets_of_match"] == {"node1": node_target, "node2": node_target}
    assert report["no_software_dir"] == list(HOSTS)


def test_the_report_tells_the_installed_guard_from_the_missing_one(fleet):
    play, report = fleet.run("-e", json.dumps({"eessi_versions": [MATCH]}))

    assert (play.done.returncode, play.failed, play.changed) == (0, 0, 0), play.output
    installed, missing = report["hosts"]["node1"]["guard"], report["hosts"]["node2"]["guard"]
    assert installed["installed"] is True
    assert (installed["version"], installed["digest"], installed["python"]) == (
        RELEASE["version"],
        RELEASE["digest"],
        RELEASE["python"],
    )
    assert installed["launcher"] == f"{fleet.installed}/bin/eessi-arch-guard"
    assert installed["code"] == f"{fleet.installed}/lib/current/hpcstack_ops"
    assert missing == {
        "prefix": str(fleet.root / "guard-node2"),
        "installed": False,
        "version": None,
        "digest": None,
        "python": None,
        "launcher": None,
        "code": None,
        "problem": None,
    }
    assert [entry["version"] for entry in report["hosts"]["node1"]["eessi"]] == [MATCH]
    assert report["no_software_dir"] == []


def test_check_mode_reports_the_same(fleet):
    _play, normal = fleet.run()
    fleet.report_file.unlink()

    play, checked = fleet.run("--check")

    assert (play.done.returncode, play.failed, play.changed) == (0, 0, 0), play.output
    for host in HOSTS:
        assert {key: value for key, value in checked["hosts"][host].items() if key != "invocation"} == {
            key: value for key, value in normal["hosts"][host].items() if key != "invocation"
        }


def test_a_bad_option_fails_each_host_with_one_line(fleet):
    play, report = fleet.run("-e", json.dumps({"eessi_versions": ["../etc"]}))

    assert play.done.returncode == 2, play.output
    assert play.failed == len(HOSTS), play.output
    failures = dict(re.findall(r"^fatal: \[(\S+)\]: FAILED! => (\{.*\})$", play.stdout, re.M))
    assert sorted(failures) == list(HOSTS), play.stdout
    for result in failures.values():
        assert json.loads(result) == {
            "changed": False,
            "msg": "versions: '../etc' is not the name of a directory under versions/",
        }
    assert "Traceback" not in play.output
    assert report is None
