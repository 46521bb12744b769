"""The namespace cluster itself: nodes that are really separate hosts, reached over SSH at
their own addresses, that keep what is written on them, and that leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cluster as namespace_cluster
from tests.integration.harness.cluster import CLUSTER_GUARD, ansible_env

pytestmark = CLUSTER_GUARD

HERE = Path(namespace_cluster.__file__).resolve()


def test_every_node_is_its_own_host_over_ssh(cluster):
    inventory = cluster.inventory({"nodes": [node.name for node in cluster.nodes]})
    done = cluster.controller.run(
        [
            "ansible", "-i", str(inventory), "all", "-o", "-m", "setup",
            "-a", "gather_subset=!all,hardware filter=ansible_hostname,ansible_env,ansible_processor",
        ],
        env=ansible_env(),
    )  # fmt: skip
    facts = {}
    for line in done.stdout.splitlines():
        host, _sep, rest = line.partition(" | SUCCESS => ")
        facts[host] = json.loads(rest)["ansible_facts"]
    assert sorted(facts) == sorted(node.name for node in cluster.nodes)
    for node in cluster.nodes:
        assert facts[node.name]["ansible_hostname"] == node.name
        # SSH_CONNECTION: client address, client port, server address, server port.
        assert facts[node.name]["ansible_env"]["SSH_CONNECTION"].split()[2] == node.address
    models = {tuple(facts[node.name]["ansible_processor"]) for node in cluster.by_role("compute")}
    assert len(models) == len(cluster.by_role("compute")), "each compute node has its own CPU"


def test_each_node_reads_its_own_cpu_and_only_the_gpu_node_has_nvidia_smi(cluster):
    for node in cluster.by_role("compute") + cluster.by_role("login"):
        seen = node.read("/proc/cpuinfo")
        assert seen == (namespace_cluster.CPUINFO_DIR / node.spec.cpu).read_text()
        has_smi = node.run(["sh", "-c", "command -v nvidia-smi"], check=False).returncode == 0
        assert has_smi == node.spec.gpu


def test_a_file_written_on_a_node_stays_on_it(cluster):
    first, second = cluster.by_role("compute")[:2]
    first.write("/etc/hc-written-here", "only on the first\n")
    try:
        assert first.read("/etc/hc-written-here") == "only on the first\n"
        assert second.run(["test", "-e", "/etc/hc-written-here"], check=False).returncode == 1
        assert not Path("/etc/hc-written-here").exists()
    finally:
        first.run(["rm", "-f", "/etc/hc-written-here"])


def test_addresses_exist_only_inside_the_cluster(cluster):
    here = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert namespace_cluster.SUBNET not in here
    inside = cluster.by_role("compute")[0].run(["ip", "-o", "addr"]).stdout
    assert f"{cluster.by_role('compute')[0].address}/24" in inside


def test_slurm_runs_one_task_on_each_compute_node_from_the_login_node(cluster):
    login = cluster.by_role("login")[0]
    done = login.run(["srun", "-N3", "-l", "hostname"], timeout=60)
    hosts = sorted(line.split(": ", 1)[1] for line in done.stdout.splitlines())
    assert hosts == sorted(node.name for node in cluster.by_role("compute"))


def test_leftovers_names_a_running_cluster_and_nothing_after_down(tmp_path):
    specs = namespace_cluster.default_specs([("", False)])
    started = namespace_cluster.up(specs, Path(f"/tmp/hc-t-{os.getpid()}"))
    try:
        running = started.leftovers()
        assert any(item.startswith("process ") for item in running), running
    finally:
        started.down()
    assert started.leftovers() == []
    namespace_cluster.remove_root(started)
    assert not started.root.exists()


def test_a_killed_caller_takes_its_cluster_with_it():
    root = Path(f"/tmp/hc-k-{os.getpid()}")
    caller = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time, cluster\n"
            "cluster.up(cluster.default_specs(), sys.argv[1])\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n",
            str(root),
        ],
        stdout=subprocess.PIPE, text=True, cwd=HERE.parent,
    )  # fmt: skip
    try:
        assert caller.stdout.readline().strip() == "up"
        started = namespace_cluster.Cluster.load(root)
        assert all(node.alive() for node in started.nodes)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
    deadline = time.monotonic() + 10
    while started.leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.leftovers() == []
    namespace_cluster.remove_root(started)


def test_a_recycled_pid_is_never_signalled(tmp_path):
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        impostor = namespace_cluster.Node(namespace_cluster.NodeSpec("x", "login"), "10.77.0.99")
        impostor.pid = bystander.pid
        impostor.start_time = namespace_cluster._start_time(bystander.pid) + 1  # another process's
        namespace_cluster.Cluster(root=tmp_path, nodes=[impostor]).down()
        assert bystander.poll() is None, "down() signalled a process that is not the node's"
        with pytest.raises(namespace_cluster.ClusterError, match="not running"):
            impostor.run(["true"])
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_a_node_keeps_no_copy_of_another_process_s_fuse_mount_nor_sees_later_ones(tmp_path):
    backing, mountpoint, later = tmp_path / "backing", tmp_path / "fuse", tmp_path / "later"
    for directory in (backing, mountpoint, later):
        directory.mkdir()
    bindfs = subprocess.run(
        ["bindfs", str(backing), str(mountpoint)], capture_output=True, text=True, check=False
    )
    assert bindfs.returncode == 0, bindfs.stderr
    try:
        started = namespace_cluster.up(namespace_cluster.default_specs(), Path(f"/tmp/hc-f-{os.getpid()}"))
        try:
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(later)], check=True)
            try:
                mounts = started.node("login").read("/proc/self/mountinfo")
            finally:
                subprocess.run(["umount", str(later)], check=True)
            assert str(mountpoint) not in mounts
            # A mount made on the machine once the node is up does not propagate into it.
            assert str(later) not in mounts
        finally:
            started.down()
            namespace_cluster.remove_root(started)
    finally:
        subprocess.run(["fusermount", "-u", str(mountpoint)], check=False)
    # Its daemon ends with its own unmount: no node holds the filesystem open.
    deadline = time.monotonic() + 10
    while _bindfs_serves(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _bindfs_serves(mountpoint)


def _bindfs_serves(mountpoint: Path) -> bool:
    found = subprocess.run(["pgrep", "-f", f"bindfs .* {mountpoint}$"], capture_output=True, check=False)
    return found.returncode == 0
