"""The session's namespace cluster (``testbed/cluster.py``): a controller, a login node, three
compute nodes of three CPU targets (the third with a GPU) and two build nodes.

The cluster gate runs the tests marked ``cluster`` on two xdist workers (``--dist
loadgroup``), each with a cluster of its own that its tests share: the guard's tests, the
harness's and the rebuilds as Slurm jobs (``CLUSTER_GUARD``) on one, those of the shared
filesystems, the rebuilds and the fleet benchmark (``CLUSTER``) on the other. The two groups
cost about the same, so both workers finish together; a group's files run one after another,
in the order pytest collects them. The CPUs are cpuinfo fixtures of this machine's type
(``uname -m``), none of them the machine's own, so what a node reports is what the harness
gave it, whatever machine the suite runs on. The login node's target differs from every
compute node's: a job submitted there carries an environment that is wrong on all of them.

Each compute node advertises its CPU target as a Slurm feature (``zen3``, ``icelake`` and
``haswell`` on x86_64), and ``build_account`` adds the unprivileged account that builds and
owns the per-target trees on every node, with the same uid and gid.

At the end of the session the cluster is stopped by pid and ``leftovers()`` must be empty: a
process, mount, namespace or interface still there fails the session.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import cluster as namespace_cluster
import sharedfs
from localplay import BIN, PLAY_TIMEOUT, LocalPlaybooks, Play

# The two groups of the cluster gate (see above), by the xdist group that puts each on a
# worker of its own. Usage: ``pytestmark = CLUSTER`` (or ``CLUSTER_GUARD``) in a test module.
STORAGE_GROUP = "cluster-storage"
GUARD_GROUP = "cluster-guard"
CLUSTER = [pytest.mark.cluster, pytest.mark.xdist_group(STORAGE_GROUP)]
CLUSTER_GUARD = [pytest.mark.cluster, pytest.mark.xdist_group(GUARD_GROUP)]

# Per machine type: the login node's CPU, then the three compute nodes' (the last has a GPU).
CPUS = {
    "x86_64": (
        "x86_64-intel-sapphirerapids-xeon-platinum-8480.cpuinfo",
        "x86_64-amd-zen3-epyc-7763.cpuinfo",
        "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo",
        "x86_64-intel-haswell-xeon-e5-2690v3.cpuinfo",
    ),
    "aarch64": (
        "aarch64-nvidia-grace.cpuinfo",
        "aarch64-a64fx.cpuinfo",
        "aarch64-neoverse_n1-ampere-altra.cpuinfo",
        "aarch64-neoverse_v1-graviton3.cpuinfo",
    ),
}
BUILD_NODES = 2
# The build account: not root, the same ids on every node, a home of its own on each node
# (so that EasyBuild's build directories of concurrent jobs never meet on /tmp, which the
# nodes share). Its ids are free on the machine (checked when it is added).
BUILD_ACCOUNT = ("hpcstack-build", 2961, 2961, "/home/hpcstack-build")
# The nodes that mount the session's shared filesystems: the build nodes and the compute nodes.
SHARED_FS_CLIENTS = ("b1", "b2", "c1", "c2", "c3")


def cluster_specs(compute: int = 3, build: int = BUILD_NODES) -> list:
    """The session cluster's nodes, for this machine's type: ``compute`` nodes whose CPUs go
    round the three compute fixtures (the third's with a GPU), and ``build`` build nodes."""
    login_cpu, *compute_cpus = CPUS[platform.machine()]
    specs = namespace_cluster.default_specs(
        [
            (compute_cpus[index % len(compute_cpus)], index % len(compute_cpus) == len(compute_cpus) - 1)
            for index in range(compute)
        ],
        build,
    )
    return [
        namespace_cluster.NodeSpec(spec.name, spec.role, cpu=login_cpu) if spec.role == "login" else spec
        for spec in specs
    ]


@pytest.fixture(scope="session")
def cluster() -> Iterator[namespace_cluster.Cluster]:
    """The running cluster; stopped at the end of the session, which fails if anything is left."""
    started = namespace_cluster.up(cluster_specs())
    try:
        yield started
    finally:
        started.down()
        left = started.leftovers()
        if not left:
            namespace_cluster.remove_root(started)
    if left:
        pytest.fail("the cluster left behind: " + "; ".join(left))


@pytest.fixture(scope="session")
def build_account(cluster) -> namespace_cluster.Account:
    """The build account on every node of the session's cluster (kept until it stops)."""
    name, uid, gid, home = BUILD_ACCOUNT
    return cluster.add_account(name, uid, gid, home)


def _shared_fs(cluster, start) -> Iterator[sharedfs.SharedFS]:
    # The servers on the controller; stopped before the cluster, whose leftover check then
    # finds any FUSE daemon or mount that outlived them.
    clients = [cluster.node(name) for name in SHARED_FS_CLIENTS]
    started = start(cluster, cluster.controller, clients)
    try:
        yield started
    finally:
        sharedfs.stop(cluster, started)


@pytest.fixture(scope="session")
def glusterfs(cluster) -> Iterator[sharedfs.SharedFS]:
    """GlusterFS (one brick on the controller), mounted at /mnt/glusterfs on b1, b2, c1, c2, c3."""
    yield from _shared_fs(cluster, sharedfs.start_glusterfs)


@pytest.fixture(scope="session")
def cephfs(cluster) -> Iterator[sharedfs.SharedFS]:
    """CephFS (mon, memstore OSD, MDS on the controller), ceph-fuse at /mnt/cephfs on b1, b2, c1-c3."""
    yield from _shared_fs(cluster, sharedfs.start_cephfs)


@pytest.fixture(scope="session")
def one_disk(cluster) -> sharedfs.SharedFS:
    """A directory of the machine's own disk, which every node sees at the same path: one
    kernel's filesystem under all the nodes, where the directory exchange works, to set
    beside the network filesystems where it does not."""
    # The collection is importable once pytest is configured (tests/conftest.py), not before.
    from ansible_collections.hpcstack.ops.plugins.module_utils.common import mountinfo  # noqa: PLC0415

    shared = cluster.root / "one-disk"
    shared.mkdir(mode=0o755, exist_ok=True)
    filesystem = mountinfo.filesystem_of(str(shared))
    names = tuple(node.name for node in cluster.nodes)
    return sharedfs.SharedFS(
        "one-disk", str(shared), f"{filesystem} on Linux {platform.release()}", names, fstype=filesystem
    )


# The connection settings docs/ansible.md gives sites ("Connection settings for a fleet"),
# beside the inventory's ansible_ssh_pipelining: one SSH connection per node kept for all the
# plays of a run, which jobs run between (Ansible's default keeps it 60 s), no compression of
# what never leaves the machine, and every node of a batch at once (Ansible's default is 5).
CONNECTION_ENV = {
    "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=600s",
    "ANSIBLE_FORKS": "50",
}


def ansible_env(extra: dict | None = None) -> dict:
    """The environment for ansible-playbook run on the controller."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        **CONNECTION_ENV,
    }
    env.update(extra or {})
    return env


class ClusterPlaybooks(LocalPlaybooks):
    """The collection's playbooks run on the cluster's controller over SSH to ``inventory``'s
    hosts at their own addresses (no ``connection: local``); Ansible's files under ``scratch``."""

    def __init__(self, cluster: namespace_cluster.Cluster, scratch: Path, inventory: Path) -> None:
        super().__init__(scratch, ansible_env())
        self.cluster, self.inventory = cluster, inventory

    def argv(self, name: str, *extra: str, inventory: str = "") -> list:
        playbook = name if name.endswith(".yml") else f"hpcstack.ops.{name}"
        return [str(BIN / "ansible-playbook"), playbook, "-i", inventory or str(self.inventory), *extra]

    def run(self, name: str, *extra: str, inventory: str = "") -> Play:
        argv = self.argv(name, *extra, inventory=inventory)
        try:
            done = self.cluster.controller.run(argv, env=self.env(), check=False, timeout=PLAY_TIMEOUT)
        except subprocess.TimeoutExpired as expired:
            raise AssertionError(f"{' '.join(argv)} did not finish in {PLAY_TIMEOUT} s") from expired
        return Play(done)
