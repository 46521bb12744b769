"""How the arch_guard role tells its layouts apart, from what each host reports of its slurm.conf.

Each case is a batch of hosts with the identity the role's survey reports on each (configless,
filesystem type and source, device, inode, boot id, sha256), and the layout the role must
find, through the role's own variables and the ``hpcstack.ops.arch_guard_fleet`` filter in a
real play (one play per case, no module run on a host). The survey itself and the layouts it
leads to run for real on the namespace cluster (test_cluster_guard_layouts.py); what a cluster
there cannot show is here: NFS (device numbers differ from client to client), hosts cloned
from one image, identical per-node copies, a host without the file. The decision's own table,
with more cases, is the unit test test_plan.py::test_the_layout_follows_what_the_hosts_report.
"""

from __future__ import annotations

import json
import os
import re

import checkout
from localplay import LocalPlaybooks

SUM = "0" * 64
NFS = ("nfs4", "filer:/export/slurm")
ROLE = checkout.REPO / "roles" / "arch_guard"


def _identity(
    dev: str, ino: int = 4242, boot: str = "boot-1", fs: tuple = ("ext4", "/dev/vda1"), configless=False
) -> dict:
    """``slurm_conf.identity`` as the survey reports it."""
    return dict(
        zip(("fstype", "source"), fs), configless=configless, dev=dev, ino=ino, boot_id=boot, sha256=SUM
    )


NO_FILE = {"configless": False, "fstype": None, "source": None, "dev": None, "ino": None}
NO_FILE.update(boot_id=None, sha256=None)

CASES = {
    # Copies with the same content on each node's own disk: one file each, each edited.
    "identical_copies": ([_identity("253:0"), _identity("253:1"), _identity("253:2")], "per_node"),
    # The same file under one kernel (the namespace cluster's bind mount, containers).
    "one_file": ([_identity("253:0")] * 3, "shared"),
    # Cloned from one image: equal device, inode and content, but other kernels.
    "cloned": ([_identity("253:0", boot=f"boot-{n}") for n in range(3)], "per_node"),
    # NFS: each client numbers the device itself; the source and the inode name the file.
    "nfs": ([_identity(f"0:{50 + n}", boot=f"boot-{n}", fs=NFS) for n in range(3)], "shared"),
    "nfs_alone": ([_identity("0:50", fs=NFS)], "shared"),
    "local_alone": ([_identity("253:0")], "per_node"),
    "mixed": ([_identity("253:0"), _identity("253:0"), _identity("253:2")], "mixed"),
    "configless": ([_identity("253:0", configless=True), _identity("253:1")], "configless"),
    # No file anywhere: per_node, and each host is refused by name later (it cannot be read).
    "no_file": ([NO_FILE] * 2, "per_node"),
}


def _playbook() -> str:
    plays = []
    for case in CASES:
        plays.append(
            f"""- name: Layout of {case}
  hosts: {case}
  gather_facts: false
  vars_files: [{ROLE / "defaults" / "main.yml"}, {ROLE / "vars" / "main.yml"}]
  tasks:
    - name: What the survey reported, on hosts whose slurm.conf the role owns
      ansible.builtin.set_fact:
        arch_guard_manage_slurm_conf: true
        __arch_guard_survey: {{slurm_conf: {{identity: "{{{{ identity }}}}"}}}}
    - name: Show the layout
      ansible.builtin.debug:
        msg: "{case}={{{{ __arch_guard_fleet_found.layout }}}}"
      run_once: true
"""
        )
    return "\n".join(plays)


def test_the_layout_follows_what_the_hosts_report(tmp_path):
    inventory = {
        case: {"hosts": {f"{case}-{n}": {"identity": identity} for n, identity in enumerate(identities)}}
        for case, (identities, _layout) in CASES.items()
    }
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"children": inventory}}))
    playbook = tmp_path / "layout.yml"
    playbook.write_text(_playbook())
    playbooks = LocalPlaybooks(tmp_path / "ansible", {"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]})

    play = playbooks.run(str(playbook), inventory=str(tmp_path / "inventory.json"))

    assert (play.done.returncode, play.failed) == (0, 0), play.output[-4000:]
    found = dict(re.findall(r'"msg": "(\w+)=(\w+)"', play.stdout))
    assert found == {case: layout for case, (_lines, layout) in CASES.items()}
