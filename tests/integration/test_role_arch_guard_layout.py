"""How the arch_guard role tells its layouts apart, from what each host reports of its slurm.conf.

Each case is a batch of hosts with the identity line the role's survey prints on each (configless,
filesystem type and source, device, inode, boot id, sha256), and the layout the role must
find. The survey itself and the layouts it leads to run for real on the namespace cluster
(test_cluster_guard_layouts.py); what a cluster there cannot show is here: NFS (device
numbers differ from client to client), hosts cloned from one image, identical per-node
copies, a host without the file.
"""

from __future__ import annotations

import json
import os
import re

import checkout
from localplay import LocalPlaybooks

SUM = "0" * 64
NFS = ("nfs4", "filer:/export/slurm")


def _line(
    dev: str, ino: str = "4242", boot: str = "boot-1", fs: tuple = ("ext4", "/dev/vda1"), sum_: str = SUM
):
    return "\t".join(["no", *fs, dev, ino, boot, sum_])


CASES = {
    # Copies with the same content on each node's own disk: one file each, each edited.
    "identical_copies": ([_line("64768"), _line("64769"), _line("64770")], "per_node"),
    # The same file under one kernel (the namespace cluster's bind mount, containers).
    "one_file": ([_line("64768")] * 3, "shared"),
    # Cloned from one image: equal device, inode and content, but other kernels.
    "cloned": ([_line("64768", boot=f"boot-{n}") for n in range(3)], "per_node"),
    # NFS: each client numbers the device itself; the source and the inode name the file.
    "nfs": ([_line(f"0:{50 + n}", boot=f"boot-{n}", fs=NFS) for n in range(3)], "shared"),
    "nfs_alone": ([_line("0:50", fs=NFS)], "shared"),
    "local_alone": ([_line("64768")], "per_node"),
    "mixed": ([_line("64768"), _line("64768"), _line("64770")], "mixed"),
    "configless": ([_line("64768").replace("no", "yes", 1), _line("64769")], "configless"),
    # No file anywhere: per_node, and chain.yml refuses each host by name.
    "no_file": (["no\t-\t-\t-\t-\t-\t-"] * 2, "per_node"),
}


def _playbook(vars_file: str) -> str:
    plays = []
    for case in CASES:
        plays.append(
            f"""- name: Layout of {case}
  hosts: {case}
  gather_facts: false
  vars_files: [{vars_file}]
  vars:
    arch_guard_slurm_conf_host: ""
  tasks:
    - name: What the survey printed
      ansible.builtin.set_fact:
        __arch_guard_survey: {{stdout_lines: ["identity\\t{{{{ probe }}}}"]}}
    - name: Show the layout
      ansible.builtin.debug:
        msg: "{case}={{{{ __arch_guard_layout_auto }}}}"
      run_once: true
"""
        )
    return "\n".join(plays)


def test_the_layout_follows_what_the_hosts_report(tmp_path):
    inventory = {
        case: {"hosts": {f"{case}-{n}": {"probe": line} for n, line in enumerate(lines)}}
        for case, (lines, _layout) in CASES.items()
    }
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"children": inventory}}))
    playbook = tmp_path / "layout.yml"
    playbook.write_text(_playbook(str(checkout.REPO / "roles" / "arch_guard" / "vars" / "main.yml")))
    playbooks = LocalPlaybooks(tmp_path / "ansible", {"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]})

    play = playbooks.run(str(playbook), inventory=str(tmp_path / "inventory.json"))

    assert (play.done.returncode, play.failed) == (0, 0), play.output[-4000:]
    found = dict(re.findall(r'"msg": "(\w+)=(\w+)"', play.stdout))
    assert found == {case: layout for case, (_lines, layout) in CASES.items()}
