"""A real multi-node cluster on this machine: every node a set of Linux namespaces.

    .venv/bin/python testbed/cluster.py up DIR [--compute 3] [--build 2]   start it; DIR/cluster.json
    .venv/bin/python testbed/cluster.py run DIR NODE -- COMMAND...         run a command on a node
    .venv/bin/python testbed/cluster.py down DIR                            stop it, check nothing is left

Each node is ``unshare --net --uts --mount --pid --fork --kill-child --mount-proc`` around a tiny
reaper that is the node's PID 1. It has its own hostname, its own address on a bridge, its own
``/proc/cpuinfo`` (a fixture of ``testbed/eessi_like/cpuinfo`` bound over it), a fake
``nvidia-smi`` where it has a GPU, and a copy-on-write root: ``/etc``, ``/root``, ``/var``,
``/opt``, ``/usr/local``, ``/home`` and ``/mnt`` (where shared filesystems are mounted) are
overlays with a per-node upper directory, so what is written on a node stays on it, and
``/run`` is the node's own. ``/tmp`` and ``/work`` are the machine's, seen by every node: the
tests' own scratch and this checkout, never the software the cluster runs. A compute node
advertises its CPU target to Slurm as a node feature (``Feature=zen3``: the last component of
what archdetect answers for its cpuinfo fixture), so that ``sbatch --constraint=zen3`` reaches
it; ``add_account`` makes an unprivileged account of the same uid and gid on every node.

The network is a bridge inside the controller's network namespace and a veth per node, its
peer moved into the node. Addresses exist only on those interfaces, in namespaces made here:
nothing is added to the machine's own network namespace, and traffic goes only between nodes.

Every node runs sshd (a host key per node, generated here; root logs in with a key generated
here). The controller runs munged, whose socket directory every node binds at ``/run/munge``,
and slurmctld; every compute node runs slurmd. Ansible runs on the controller
(``Cluster.controller.run``) and reaches every node over SSH at its own address.

Everything is started and stopped by pid: a node is its reaper's host pid (checked against
its start time, so a recycled pid is never signalled), and killing that reaper makes the
kernel kill everything in the node's pid namespace, after which its mounts, veth and network
namespace go too. ``leftovers()`` lists any process, namespace, mount or interface of the
cluster that is still there.

Needs root, util-linux (unshare, nsenter), iproute2, openssh-server, munge, slurmctld and
slurmd.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import eessilike

HERE = Path(__file__).resolve().parent
CPUINFO_DIR = HERE / "eessi_like" / "cpuinfo"
FAKE_NVIDIA_SMI = HERE / "eessi_like" / "nvidia-smi"

SUBNET = "10.77.0"
CONTROLLER = "ctl"
BRIDGE = "br-hc"
# What each node gets a private copy of; the rest of the machine's tree is shared.
COW_DIRS = ("/etc", "/root", "/var", "/opt", "/usr/local", "/home", "/mnt")
SLURM_CONF = "/etc/slurm/slurm.conf"
NAMESPACES = ("net", "mnt", "pid", "uts")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
RUN_TIMEOUT = 120.0

# The node's PID 1: reaps every orphan (daemons double-fork onto it) and nothing else. Blocking
# SIGCHLD and waiting for it with sigwaitinfo leaves no window in which an exit is missed.
REAPER = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if signal.sigwaitinfo({signal.SIGCHLD, signal.SIGTERM}).si_signo == signal.SIGTERM:
        os._exit(0)
"""


# The unshare processes this process started, by pid: down() reaps them.
_SPAWNED: dict = {}


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or stopped."""


@dataclass(frozen=True)
class NodeSpec:
    """What a node is: its name, its role, and the CPU (and GPU) it has."""

    name: str
    role: str  # controller | login | compute | build
    cpu: str = ""  # a file name in testbed/eessi_like/cpuinfo; "" keeps the machine's
    gpu: bool = False

    @property
    def slurmd(self) -> bool:
        return self.role == "compute"

    @property
    def target(self) -> str:
        """What archdetect answers for the node's CPU (``x86_64/amd/zen3``); "" for the machine's."""
        return cpu_target(self.cpu) if self.cpu else ""

    @property
    def feature(self) -> str:
        """The node's Slurm feature: its target's last component (``zen3``); "" for none."""
        return self.target.rsplit("/", 1)[-1]


def cpu_target(cpu: str) -> str:
    """The CPU target a cpuinfo fixture of ``testbed/eessi_like/cpuinfo`` is named for."""
    for target, fixture in eessilike.CPUINFO_FIXTURES.items():
        if fixture == cpu:
            return target
    raise ClusterError(f"no CPU target is known for the cpuinfo fixture {cpu}")


@dataclass
class Node:
    """A running node: its spec, address, and the host pid (and start time) of its PID 1."""

    spec: NodeSpec
    address: str
    pid: int = 0
    start_time: int = 0  # field 22 of /proc/<pid>/stat: tells a recycled pid apart
    unshare_pid: int = 0
    namespaces: dict = field(default_factory=dict)  # ns type -> inode, for the leftover check

    @property
    def name(self) -> str:
        return self.spec.name

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start_time != 0

    def command(self, argv: Sequence[str], *, workdir: str = "/") -> list:
        """``argv`` as run inside the node (every namespace of it, working directory ``workdir``)."""
        return ["nsenter", "-t", str(self.pid), "-a", f"--wd={workdir}", "--", *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = RUN_TIMEOUT,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        workdir: str = "/",
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on the node and wait; text output captured."""
        if not self.alive():
            raise ClusterError(f"node {self.name} is not running")
        done = subprocess.run(
            self.command(argv, workdir=workdir),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
            input=input,
            check=False,
        )
        if check and done.returncode != 0:
            raise ClusterError(
                f"on {self.name}: {shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
            )
        return done

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        """Run a shell script on the node."""
        return self.run(["sh", "-ec", script], **kw)

    def run_as(self, account: Account, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` on the node as ``account`` (its uid, gid and no other group)."""
        return self.run(account.command(argv), **kw)

    def popen(self, argv: Sequence[str], *, workdir: str = "/", **kw) -> subprocess.Popen:
        """Start ``argv`` on the node without waiting."""
        return subprocess.Popen(self.command(argv, workdir=workdir), **kw)

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file on the node (in its own copy of the tree)."""
        self.run(
            ["sh", "-ec", 'mkdir -p "$(dirname "$1")"; cat > "$1"; chmod "$2" "$1"', "-", path, f"{mode:o}"],
            input=text,
        )

    def read(self, path: str) -> str:
        return self.run(["cat", path]).stdout


@dataclass(frozen=True)
class Account:
    """An unprivileged account the cluster's nodes share: one uid and gid on every node."""

    name: str
    uid: int
    gid: int
    home: str

    def command(self, argv: Sequence[str]) -> list:
        """``argv`` run as the account, by ``setpriv`` (no PAM, no password)."""
        ids = [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        return ["setpriv", *ids, "--", *argv]

    def env(self, **extra: str) -> dict:
        """A login environment of the account's: its name, its home, the system's PATH."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
            "LANG": "C.UTF-8",
            **extra,
        }


@dataclass
class Cluster:
    """A running cluster: its directory on the host and its nodes, controller first."""

    root: Path
    nodes: list

    # --- what tests use ------------------------------------------------------------------
    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def controller(self) -> Node:
        return self.node(CONTROLLER)

    def by_role(self, role: str) -> list:
        return [node for node in self.nodes if node.spec.role == role]

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    def add_account(self, name: str, uid: int, gid: int, home: str) -> Account:
        """The account ``name`` (uid, gid) on every node, as a site's directory service gives
        it: slurmctld knows it, slurmd runs its jobs. ``home`` is made on each node, in the
        node's own copy of the tree (a directory of a shared filesystem works the same).
        Kept until the cluster stops; adding it again is a no-op."""
        account = Account(name, uid, gid, home)
        script = f"""
if ! getent group {name} >/dev/null; then groupadd -g {gid} {name}; fi
if ! getent passwd {name} >/dev/null; then useradd -u {uid} -g {gid} -M -d {home} -s /bin/sh {name}; fi
test "$(id -u {name}):$(id -g {name})" = "{uid}:{gid}"
mkdir -p {home}
chown {uid}:{gid} {home}
"""
        for node in self.nodes:
            node.sh(script)
        return account

    def ssh(self, node: Node, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``node`` over SSH from the controller, as Ansible does."""
        return self.controller.run(["ssh", "-F", str(self.ssh_config), node.address, shlex.join(argv)], **kw)

    def inventory(self, groups: Mapping[str, Iterable[str]], path: Path | None = None, **host_vars) -> Path:
        """An Ansible inventory (YAML written as JSON) naming ``groups`` of nodes at their addresses."""
        common = {
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": f"-F {self.ssh_config}",
            "ansible_ssh_pipelining": True,
            **host_vars,
        }
        inventory: dict = {"all": {"vars": common, "children": {}}}
        for group, names in groups.items():
            hosts = {name: {"ansible_host": self.node(name).address} for name in names}
            inventory["all"]["children"][group] = {"hosts": hosts}
        target = path or self.root / "inventory.yml"
        target.write_text(json.dumps(inventory, indent=2) + "\n")
        return target

    # --- state on disk -------------------------------------------------------------------
    def save(self) -> None:
        state = {"root": str(self.root), "nodes": [asdict(node) for node in self.nodes]}
        (self.root / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, root: Path) -> Cluster:
        state = json.loads((root / "cluster.json").read_text())
        nodes = []
        for raw in state["nodes"]:
            raw["spec"] = NodeSpec(**raw["spec"])
            nodes.append(Node(**raw))
        return cls(root=Path(state["root"]), nodes=nodes)

    # --- stop and check ------------------------------------------------------------------
    def down(self) -> None:
        """Kill every node's PID 1 (by pid, checked by start time) and wait for them to go."""
        for node in reversed(self.nodes):
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT
        for node in self.nodes:
            unshare = _SPAWNED.pop(node.unshare_pid, None)
            if unshare is not None:
                unshare.wait(timeout=STOP_TIMEOUT)
        while any(node.alive() or _exists(node.unshare_pid) for node in self.nodes):
            if time.monotonic() > deadline:
                raise ClusterError(
                    "nodes still running after SIGKILL: " + " ".join(n.name for n in self.nodes)
                )
            time.sleep(0.02)

    def leftovers(self) -> list:
        """Every process, namespace, mount or interface of this cluster still on the machine."""
        found = []
        ours = {(kind, inode) for node in self.nodes for kind, inode in node.namespaces.items()}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            for kind in NAMESPACES:
                with contextlib.suppress(OSError):
                    inode = os.stat(proc / "ns" / kind).st_ino
                    if (kind, inode) in ours:
                        found.append(f"process {proc.name} in a node's {kind} namespace")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mountpoint = line.split()[4]
            if mountpoint.startswith(str(self.root) + "/") or mountpoint == str(self.root):
                found.append(f"mount {mountpoint}")
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name == BRIDGE or name.startswith("hc-"):
                found.append(f"interface {name}")
        return found


def _start_time(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return 0 if fields[0] == "Z" else int(fields[19])


def _exists(pid: int) -> bool:
    return pid > 0 and Path(f"/proc/{pid}").exists() and _start_time(pid) != 0


def _child_of(pid: int, timeout: float) -> int:
    """The first child of ``pid`` (unshare's forked PID 1), once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.005)
    raise ClusterError(f"unshare {pid} started no node within {timeout:.0f} s")


def default_specs(compute: Sequence[tuple] = (), build: int = 0) -> list:
    """The controller, a login node, ``compute`` nodes (cpu file, gpu) and ``build`` nodes."""
    specs = [NodeSpec(CONTROLLER, "controller"), NodeSpec("login", "login")]
    for number, (cpu, gpu) in enumerate(compute, start=1):
        specs.append(NodeSpec(f"c{number}", "compute", cpu=cpu, gpu=gpu))
    for number in range(1, build + 1):
        specs.append(NodeSpec(f"b{number}", "build"))
    return specs


# --- starting -----------------------------------------------------------------------------
def up(specs: Sequence[NodeSpec], root: Path | None = None, *, die_with_caller: bool = True) -> Cluster:
    """Start a cluster of ``specs`` (the first is the controller) under ``root``."""
    if os.geteuid() != 0:
        raise ClusterError("a namespace cluster needs root")
    if specs[0].role != "controller":
        raise ClusterError("the first node must be the controller")
    root = Path(root or tempfile.mkdtemp(prefix="hc-", dir="/tmp"))
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # noqa: S103 - jobs run as other users read their scripts from here
    nodes = [Node(spec, f"{SUBNET}.{index + 1}") for index, spec in enumerate(specs)]
    cluster = Cluster(root=root, nodes=nodes)
    try:
        for node in nodes:
            _spawn(root, node, die_with_caller)
        cluster.save()
        _keys(cluster)
        for node in nodes:
            _prepare(cluster, node)
        _network(cluster)
        _start_daemons(cluster)
        _wait_for_ssh(cluster)
        if any(node.spec.slurmd for node in nodes):
            wait_for_slurm(cluster)
    except BaseException:
        cluster.down()
        raise
    return cluster


def node_dir(root: Path, node: Node) -> Path:
    """The host directory of a node's own files: upper directories, logs, sshd's configuration."""
    return root / "nodes" / node.name


def _spawn(root: Path, node: Node, die_with_caller: bool) -> None:
    argv = [
        "setsid", "unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--kill-child",
        "--mount-proc", "--propagation", "private", "--", sys.executable, "-c", REAPER,
    ]  # fmt: skip
    preexec = _die_with_parent if die_with_caller else None
    log = node_dir(root, node) / "unshare.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as stderr:
        # unshare complains on stderr when its child is killed: kept out of the caller's output.
        unshare = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            preexec_fn=preexec,  # noqa: PLW1509
        )
    _SPAWNED[unshare.pid] = unshare
    node.unshare_pid = unshare.pid
    node.pid = _child_of(unshare.pid, START_TIMEOUT)
    # The child is unshare's until it execs the reaper: wait until it has entered its namespaces.
    deadline = time.monotonic() + START_TIMEOUT
    while os.stat(f"/proc/{node.pid}/ns/pid").st_ino == os.stat("/proc/self/ns/pid").st_ino:
        if time.monotonic() > deadline:
            raise ClusterError(f"node {node.name} did not enter its namespaces")
        time.sleep(0.005)
    node.start_time = _start_time(node.pid)
    node.namespaces = {
        kind: os.stat(f"/proc/{node.pid}/ns/{kind}").st_ino for kind in ("net", "mnt", "pid", "uts")
    }


def _die_with_parent() -> None:
    """Have the kernel kill unshare (and so, by --kill-child, the node) when the caller dies."""
    import ctypes  # noqa: PLC0415 - only in the child, between fork and exec

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _keys(cluster: Cluster) -> None:
    """A host key per node, the client key, known_hosts and the SSH client configuration."""
    keys = cluster.root / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    known = []
    for node in cluster.nodes:
        key = keys / f"{node.name}_host"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        known.append(f"{node.address},{node.name} {(keys / f'{node.name}_host.pub').read_text().strip()}")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "client")], check=True)
    (cluster.root / "known_hosts").write_text("\n".join(known) + "\n")
    (cluster.root / "authorized_keys").write_text((keys / "client.pub").read_text())
    (cluster.root / "cm").mkdir(mode=0o700, exist_ok=True)
    cluster.ssh_config.write_text(
        f"""Host *
  User root
  IdentityFile {keys}/client
  IdentitiesOnly yes
  UserKnownHostsFile {cluster.root}/known_hosts
  StrictHostKeyChecking yes
  ConnectTimeout 10
  ControlMaster auto
  ControlPersist 120s
  ControlPath {cluster.root}/cm/%C
  LogLevel ERROR
"""
    )


def _hosts(cluster: Cluster) -> str:
    lines = ["127.0.0.1 localhost"]
    lines += [f"{node.address} {node.name}" for node in cluster.nodes]
    return "\n".join(lines) + "\n"


# Run first in a new node: detach the copies of other processes' FUSE mounts and of whatever
# is mounted below /tmp (tests' scratch) that the node's mount namespace got from the machine's.
# They are no part of a host, and a copy would keep another test's FUSE daemon alive after that
# test unmounted it, and the node's tools would walk it (Ansible's mount facts, for one).
DETACH_FOREIGN_MOUNTS = """
import subprocess
points = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    point = fields[4].replace("\\040", " ")
    kind = fields[fields.index("-") + 1]
    if kind.startswith("fuse") or point.startswith("/tmp/"):
        points.append(point)
for point in sorted(set(points), key=len, reverse=True):
    subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL, check=False)
"""


def _prepare(cluster: Cluster, node: Node) -> None:
    """The node's own tree: overlays, /run, hostname, hosts, CPU, GPU, sshd's configuration."""
    here = node_dir(cluster.root, node)
    node.run([sys.executable, "-c", DETACH_FOREIGN_MOUNTS])
    script = [f"hostname {node.name}"]
    for directory in COW_DIRS:
        upper, work = here / "upper" / directory.strip("/"), here / "work" / directory.strip("/")
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        script.append(
            f"mount -t overlay overlay -o lowerdir={directory},upperdir={upper},workdir={work} {directory}"
        )
    munge = cluster.root / "munge"
    munge.mkdir(mode=0o755, exist_ok=True)
    script += [
        "mount -t tmpfs -o mode=0755 tmpfs /run",
        "mkdir -p /run/sshd /run/munge /run/lock /run/slurm /var/spool/slurmd /var/spool/slurmctld "
        "/var/log/slurm /etc/slurm",
        "chmod 0755 /run/sshd",
        f"mount --bind {munge} /run/munge",
        f"cat > /etc/hosts <<'EOF'\n{_hosts(cluster)}EOF",
        f"echo {node.name} > /etc/hostname",
        # sshd's StrictModes refuses a key file below /tmp (world-writable): the node keeps its copy.
        f"install -m 0600 {cluster.root}/authorized_keys /etc/ssh/hc_authorized_keys",
    ]
    if node.spec.cpu:
        script.append(f"mount --bind {CPUINFO_DIR / node.spec.cpu} /proc/cpuinfo")
    if node.spec.gpu:
        script.append(f"install -m 0755 {FAKE_NVIDIA_SMI} /usr/local/bin/nvidia-smi")
    sshd = here / "sshd_config"
    sshd.write_text(
        f"""ListenAddress {node.address}
HostKey {cluster.root}/keys/{node.name}_host
PidFile /run/sshd.pid
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile /etc/ssh/hc_authorized_keys
Subsystem sftp internal-sftp
MaxStartups 100
MaxSessions 100
"""
    )
    if node.spec.role == "controller":
        script += [
            f"ip link add {BRIDGE} type bridge",
            f"ip addr add {node.address}/24 dev {BRIDGE}",
            f"ip link set {BRIDGE} up",
        ]
    script.append("ip link set lo up")
    node.run(["sh", "-ec", "\n".join(script)])


def _network(cluster: Cluster) -> None:
    """A veth per node from the controller's bridge, its peer moved into the node as eth0."""
    batch = []
    for node in cluster.nodes[1:]:
        veth = f"hc-{node.name}"
        batch += [
            f"link add {veth} type veth peer name eth0 netns {node.pid}",
            f"link set {veth} master {BRIDGE} up",
        ]
    if batch:
        # Only the controller's network namespace: `netns <pid>` names nodes by their host pids.
        subprocess.run(
            ["nsenter", "-t", str(cluster.controller.pid), "-n", "ip", "-batch", "-"],
            input="\n".join(batch) + "\n",
            text=True,
            check=True,
        )
    for node in cluster.nodes[1:]:
        node.run(["sh", "-ec", f"ip addr add {node.address}/24 dev eth0; ip link set eth0 up"])


def slurm_conf(cluster: Cluster, extra: str = "") -> str:
    """The cluster's slurm.conf: slurmctld on the controller, a slurmd per compute node."""
    compute = [node for node in cluster.nodes if node.spec.slurmd]
    node_lines = "\n".join(
        f"NodeName={node.name} NodeAddr={node.address} CPUs=2"
        + (f" Feature={node.spec.feature}" if node.spec.feature else "")
        + " State=UNKNOWN"
        for node in compute
    )
    names = ",".join(node.name for node in compute)
    return f"""ClusterName=hc
SlurmctldHost={CONTROLLER}({cluster.controller.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
{extra}{node_lines}
PartitionName=all Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def _start_daemons(cluster: Cluster) -> None:
    """munged and slurmctld on the controller, slurmd on compute nodes, sshd everywhere."""
    conf = slurm_conf(cluster)
    key = cluster.root / "keys" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ctl = cluster.controller
    ctl.run(
        [
            "munged", f"--key-file={key}", "--socket=/run/munge/munge.socket.2", "--force",
            f"--pid-file={cluster.root}/munge/munged.pid", f"--log-file={cluster.root}/munge/munged.log",
            f"--seed-file={cluster.root}/munge/munged.seed",
        ]
    )  # fmt: skip
    for node in cluster.nodes:
        sshd = ["/usr/sbin/sshd", "-f", str(node_dir(cluster.root, node) / "sshd_config")]
        script = [shlex.join(sshd)]
        if node.spec.role in ("controller", "login", "compute"):
            script.insert(0, f"cat > {SLURM_CONF} <<'EOF'\n{conf}EOF")
        if node.spec.role == "controller":
            script.append("slurmctld -i")
        if node.spec.slurmd:
            script.append("slurmd")
        node.sh("\n".join(script))


def _wait_for_ssh(cluster: Cluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    for node in cluster.nodes:
        while True:
            done = cluster.ssh(node, ["hostname"], check=False, timeout=30)
            if done.returncode == 0 and done.stdout.strip() == node.name:
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"sshd on {node.name} ({node.address}) not reachable: {done.stderr.strip()}"
                )
            time.sleep(0.05)


def wait_for_slurm(cluster: Cluster, timeout: float = START_TIMEOUT) -> None:
    """Wait until every compute node is idle in sinfo, as the controller sees it."""
    compute = {node.name for node in cluster.nodes if node.spec.slurmd}
    deadline = time.monotonic() + timeout
    while True:
        done = cluster.controller.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=30)
        states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        if all(states.get(name) == "idle" for name in compute):
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"compute nodes not idle after {timeout:.0f} s: {states} {done.stderr.strip()}"
            )
        time.sleep(0.1)


def remove_root(cluster: Cluster) -> None:
    """Remove a stopped cluster's directory (its nodes' upper directories, keys and logs)."""
    if any(node.alive() for node in cluster.nodes):
        raise ClusterError("the cluster is still running")
    shutil.rmtree(cluster.root)


@contextlib.contextmanager
def running(specs: Sequence[NodeSpec], root: Path | None = None) -> Iterator[Cluster]:
    """A cluster for the ``with`` block; stopped, and checked to leave nothing, at its end."""
    cluster = up(specs, root)
    try:
        yield cluster
    finally:
        cluster.down()
    left = cluster.leftovers()
    if left:
        raise ClusterError("the cluster left: " + "; ".join(left))
    remove_root(cluster)


# --- command line -------------------------------------------------------------------------
def _parse(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("up", help="start a cluster in DIR")
    start.add_argument("dir", type=Path)
    start.add_argument(
        "--cpu", action="append", default=[], help="a compute node's cpuinfo file (repeatable)"
    )
    start.add_argument("--gpu", action="append", default=[], help="a compute node (c1, c2...) with a GPU")
    start.add_argument("--build", type=int, default=0, help="how many build nodes")
    run = sub.add_parser("run", help="run a command on a node")
    run.add_argument("dir", type=Path)
    run.add_argument("node")
    run.add_argument("command", nargs=argparse.REMAINDER)
    stop = sub.add_parser("down", help="stop the cluster in DIR and check that nothing is left")
    stop.add_argument("dir", type=Path)
    return parser.parse_args(argv)


def main(argv: list | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "up":
            compute = [(cpu, f"c{index}" in args.gpu) for index, cpu in enumerate(args.cpu, start=1)]
            cluster = up(default_specs(compute, args.build), args.dir, die_with_caller=False)
            for node in cluster.nodes:
                sys.stdout.write(f"{node.name} {node.address} pid {node.pid}\n")
            return 0
        cluster = Cluster.load(args.dir)
        if args.action == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            return subprocess.run(cluster.node(args.node).command(command), check=False).returncode
        cluster.down()
        left = cluster.leftovers()
        for item in left:
            sys.stderr.write(f"cluster: left behind: {item}\n")
        return 1 if left else 0
    except (ClusterError, OSError, KeyError) as error:
        sys.stderr.write(f"cluster: {error}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
