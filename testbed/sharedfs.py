"""Real shared filesystems inside a namespace cluster (``testbed/cluster.py``): GlusterFS and CephFS.

    sharedfs = start_glusterfs(cluster, cluster.controller, [b1, b2])   # mounted at /mnt/glusterfs
    sharedfs = start_cephfs(cluster, cluster.controller, [b1, b2])      # mounted at /mnt/cephfs
    stop(cluster, sharedfs)

The servers run on one node (the controller, say) and every client node mounts the
filesystem over the cluster's network with the FUSE client of Debian's packages: several
kernels' worth of clients, each with its own cache and lock state, as build nodes have.

- GlusterFS: glusterd and one brick (a directory in the server's copy-on-write ``/var``, so
  ``volume create ... force``, with ``performance.stat-prefetch off`` as the docs recommend for
  a volume that receives publishes); clients run ``glusterfs`` (what ``mount -t glusterfs`` runs).
- CephFS: one mon, one OSD on memstore (RAM only), one MDS, no manager and ``auth none``;
  clients run ``ceph-fuse``. The configuration lives in the cluster's directory, which every
  node sees; each daemon's data, log, admin socket and pid file are the node's own (``/var``
  and ``/run``), so clients on several nodes never share an admin socket. Without a manager
  ``ceph fs status`` never answers: readiness is ``ceph mds stat`` saying ``up:active``.

Every daemon runs inside a node, in its pid namespace, and writes a pid file in the node's
``/run``; ``stop`` unmounts on the clients and signals each daemon by that pid from inside its
node (a pid written inside a node means another process on the host). Killing the nodes
also ends everything. Nothing is mounted in the machine's own mount namespace.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Sequence

from cluster import Cluster, ClusterError, Node

GLUSTER_VOLUME = "hc"
GLUSTER_BRICK = "/var/lib/hc-glusterfs/brick"
CEPH_FS = "cephfs"
GSYNCD_STUB = """#!/bin/sh
if [ "$1" = --version ]; then echo "gsyncd.py (geo-replication is not used here)"; fi
"""
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
STOP_GRACE = 5.0  # seconds from SIGTERM to SIGKILL
_POLL = 0.05


@dataclass(frozen=True)
class SharedFS:
    """A running shared filesystem: what it is, where the clients mount it, and its daemons."""

    kind: str  # "glusterfs" | "cephfs"
    mountpoint: str  # the same path on every client node
    # The first line of the server's ``glusterfs --version`` / ``ceph-mon --version`` (the same
    # line as ``ceph --version``, without starting a Python program).
    version: str
    nodes: tuple  # the client nodes' names
    server: str = ""
    fstype: str = ""  # the filesystem type the clients' /proc/self/mountinfo names
    servers: tuple = ()  # (node name, pid file inside that node) of every server daemon
    clients: tuple = ()  # (node name, pid file inside that node) of every client daemon
    start_seconds: float = 0.0


def _wait(what: str, ready, timeout: float = START_TIMEOUT, detail=None) -> None:
    """Poll ``ready()``; past ``timeout`` raise, with what ``detail()`` says about why."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            why = f": {detail()}" if detail is not None else ""
            raise ClusterError(f"{what} not ready after {timeout:.0f} s{why}")
        time.sleep(_POLL)


def _fstype(node: Node, mountpoint: str) -> str:
    for line in node.read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if fields[4] == mountpoint:
            return fields[fields.index("-") + 1]
    raise ClusterError(f"nothing is mounted at {mountpoint} on {node.name}")


def _mount_on(
    clients: Iterable[Node], mountpoint: str, command: Sequence[str], pid_file: str, dirs: str = ""
) -> tuple:
    """Start the FUSE client ``command`` (which daemonizes) on every node at once; wait for the mounts."""
    script = f"mkdir -p {mountpoint} {dirs}; {shlex.join(command)}"
    starting = [
        (
            node,
            node.popen(["sh", "-ec", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        )
        for node in clients
    ]
    for node, process in starting:
        _out, err = process.communicate(timeout=START_TIMEOUT)
        if process.returncode != 0:
            raise ClusterError(f"on {node.name}: {shlex.join(command)} exited {process.returncode}: {err}")
    for node, _process in starting:
        # The client daemonizes once it has the mount, before it serves it: statfs answers
        # once it does.
        _wait(
            f"the mount at {mountpoint} on {node.name}",
            lambda node=node: (
                node.run(["stat", "-f", "-c", "%T", mountpoint], check=False).returncode == 0
                and node.run(["mountpoint", "-q", mountpoint], check=False).returncode == 0
            ),
        )
    return tuple((node.name, pid_file) for node, _process in starting)


# --- GlusterFS ----------------------------------------------------------------------------
def start_glusterfs(cluster: Cluster, server: Node, clients: Sequence[Node]) -> SharedFS:
    """glusterd and a one-brick volume on ``server``, mounted at /mnt/glusterfs on ``clients``."""
    started = time.monotonic()
    gluster = "gluster --mode=script"
    # glusterd runs geo-replication's Python helper (gsyncd) some twenty times before it
    # answers, 4 s here. No geo-replication is used: the server node sees a stub there (a bind
    # mount in that node's mount namespace only) that answers --version as gsyncd does, which
    # glusterd requires, and does nothing else.
    stub = cluster.root / "sharedfs" / "gsyncd"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(GSYNCD_STUB)
    stub.chmod(0o755)
    server.sh(
        f"mkdir -p {GLUSTER_BRICK} /run/gluster\n"
        "for gsyncd in /usr/lib/*/glusterfs/gsyncd /usr/libexec/glusterfs/gsyncd; do\n"
        f'  if [ -e "$gsyncd" ]; then mount --bind {stub} "$gsyncd"; fi\n'
        "done\n"
        "glusterd -p /run/glusterd.pid"
    )
    _wait(
        "glusterd",
        lambda: server.run(["gluster", "--mode=script", "pool", "list"], check=False).returncode == 0,
    )
    # force: the brick is on the node's root filesystem, which gluster otherwise refuses.
    server.sh(
        f"{gluster} volume create {GLUSTER_VOLUME} {server.name}:{GLUSTER_BRICK} force >/dev/null\n"
        # As a site publishing software there should (docs/staged-rebuild.md): with md-cache on,
        # a client answers a lookup of a name from the inode it last saw there, and a job that
        # keeps using the live path keeps the old tree after another node's publish.
        f"{gluster} volume set {GLUSTER_VOLUME} performance.stat-prefetch off >/dev/null\n"
        f"{gluster} volume start {GLUSTER_VOLUME} >/dev/null"
    )
    brick_pid = f"/run/gluster/vols/{GLUSTER_VOLUME}/{server.name}{GLUSTER_BRICK.replace('/', '-')}.pid"
    _wait("the gluster brick", lambda: server.run(["test", "-s", brick_pid], check=False).returncode == 0)
    mountpoint = "/mnt/glusterfs"
    pid_file = "/run/glusterfs-client.pid"
    command = [
        "glusterfs", "--process-name", "fuse", f"--volfile-server={server.address}",
        f"--volfile-id=/{GLUSTER_VOLUME}", f"--pid-file={pid_file}", mountpoint,
    ]  # fmt: skip
    mounted = _mount_on(clients, mountpoint, command, pid_file)
    elapsed = time.monotonic() - started
    return SharedFS(
        kind="glusterfs",
        mountpoint=mountpoint,
        version=server.run(["glusterfs", "--version"]).stdout.splitlines()[0].strip(),
        nodes=tuple(node.name for node in clients),
        server=server.name,
        fstype=_fstype(clients[0], mountpoint) if clients else "",
        servers=((server.name, brick_pid), (server.name, "/run/glusterd.pid")),
        clients=mounted,
        start_seconds=elapsed,
    )


# --- CephFS -------------------------------------------------------------------------------
def ceph_conf(server: Node) -> str:
    """The configuration every daemon and client reads: one mon on ``server``, no auth."""
    return f"""[global]
fsid = {uuid.uuid4()}
mon host = v2:{server.address}:3300
mon initial members = {server.name}
public network = {server.address.rsplit(".", 1)[0]}.0/24
auth cluster required = none
auth service required = none
auth client required = none
run dir = /run/ceph
pid file = /run/ceph/$cluster-$name.pid
admin socket = /run/ceph/$cluster-$name.asok
log file = /var/log/ceph/$cluster-$name.log
mon data = /var/lib/ceph/mon/$cluster-$id
osd data = /var/lib/ceph/osd/$cluster-$id
mds data = /var/lib/ceph/mds/$cluster-$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
# One mon, one OSD, one MDS: the mon commits each change at once rather than batching a
# second of them, so the OSD is up and the MDS active about 1 s after they start.
paxos propose interval = 0.1
mds beacon interval = 1
"""


def start_cephfs(cluster: Cluster, server: Node, clients: Sequence[Node]) -> SharedFS:
    """A mon, a memstore OSD and an MDS on ``server``; ceph-fuse at /mnt/cephfs on ``clients``."""
    started = time.monotonic()
    # Per server: a second CephFS in the same cluster has its own fsid and mon.
    here = cluster.root / "sharedfs" / f"ceph-{server.name}"
    here.mkdir(parents=True, exist_ok=True)
    conf = here / "ceph.conf"
    text = ceph_conf(server)
    conf.write_text(text)
    fsid = text.split("fsid = ", 1)[1].split("\n", 1)[0]
    ceph = f"ceph -c {conf}"
    osd_uuid = uuid.uuid4()
    # The OSD's uuid is given at mkfs: a mon refuses the boot of an OSD whose uuid differs from
    # the one "osd new" registered. The OSD's mkfs runs while one ceph command (a Python
    # program, 0.3 s a start here) reads the four cluster commands from its input.
    commands = [
        f"osd new {osd_uuid}",
        "osd pool create cephfs_data 8",
        "osd pool create cephfs_metadata 8",
        f"fs new {CEPH_FS} cephfs_metadata cephfs_data",
    ]
    server.sh(
        f"""
mkdir -p /run/ceph /var/log/ceph /var/lib/ceph/mon/ceph-{server.name} /var/lib/ceph/osd/ceph-0 \
    /var/lib/ceph/mds/ceph-{server.name}
monmaptool --create --fsid {fsid} --addv {server.name} '[v2:{server.address}:3300]' {here}/monmap >/dev/null
ceph-mon -c {conf} --mkfs -i {server.name} --monmap {here}/monmap
ceph-mon -c {conf} -i {server.name}
ceph-osd -c {conf} -i 0 --mkfs --osd-uuid {osd_uuid} >{here}/osd-mkfs.log 2>&1 &
printf '%s\\n' {shlex.join(commands)} | {ceph} >/dev/null 2>{here}/commands.log
wait $!
ceph-osd -c {conf} -i 0
ceph-mds -c {conf} -i {server.name} >/dev/null
"""
    )

    def active() -> bool:
        done = server.run(["ceph", "-c", str(conf), "mds", "stat"], check=False, timeout=30)
        return "up:active" in done.stdout

    def why() -> str:
        done = server.run(["ceph", "-c", str(conf), "-s"], check=False, timeout=30)
        return f"{done.stdout.strip()} {(here / 'commands.log').read_text().strip()}"

    _wait("the ceph mds", active, detail=why)
    mountpoint = "/mnt/cephfs"
    pid_file = "/run/ceph/ceph-fuse.pid"
    # /run/ceph: each client's admin socket, in its node's own /run.
    command = ["ceph-fuse", "-c", str(conf), f"--pid-file={pid_file}", mountpoint]
    mounted = _mount_on(clients, mountpoint, command, pid_file, dirs="/run/ceph")
    elapsed = time.monotonic() - started
    return SharedFS(
        kind="cephfs",
        mountpoint=mountpoint,
        version=server.run(["ceph-mon", "--version"]).stdout.splitlines()[0].strip(),
        nodes=tuple(node.name for node in clients),
        server=server.name,
        fstype=_fstype(clients[0], mountpoint) if clients else "",
        servers=tuple(
            (server.name, f"/run/ceph/ceph-{name}.pid")
            for name in ("mds." + server.name, "osd.0", "mon." + server.name)
        ),
        clients=mounted,
        start_seconds=elapsed,
    )


# --- stopping -----------------------------------------------------------------------------
# Signals the daemon of every pid file given, from inside the node (its pids are the node's),
# waits for them all, and kills what is still there after the grace period.
_END = r"""
signal=$1 grace=$2; shift 2
pids=
for file in "$@"; do
    pid=$(cat "$file" 2>/dev/null) || continue
    kill -s "$signal" "$pid" 2>/dev/null && pids="$pids $pid"
done
end=$(($(date +%s) + grace))
for pid in $pids; do
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$end" ]; then kill -9 "$pid" 2>/dev/null; fi
        sleep 0.05
    done
done
"""


_UNSTUB = (
    "for gsyncd in /usr/lib/*/glusterfs/gsyncd /usr/libexec/glusterfs/gsyncd; do "
    'umount "$gsyncd" 2>/dev/null || :; done'
)


def _end(node: Node, pid_files: Sequence[str], signal: str = "TERM") -> None:
    if node.alive() and pid_files:
        node.run(["sh", "-c", _END, "-", signal, str(int(STOP_GRACE)), *pid_files], timeout=STOP_TIMEOUT)


def _end_client(node: Node, mountpoint: str, pid_file: str) -> None:
    if node.alive():
        # Lazy: a failed test may have left a process with its working directory there.
        node.run(["umount", "-l", mountpoint], check=False)
        _end(node, [pid_file])


def stop(cluster: Cluster, sharedfs: SharedFS) -> None:
    """Unmount on every client and end its FUSE daemon, then end the servers, each by its pid.
    The clients all at once: each is on a node of its own, and a FUSE daemon may take its
    grace period to go, which one after another would add up."""
    with ThreadPoolExecutor(max_workers=max(1, len(sharedfs.clients))) as pool:
        ended = [
            pool.submit(_end_client, cluster.node(name), sharedfs.mountpoint, pid_file)
            for name, pid_file in sharedfs.clients
        ]
    for future in ended:
        future.result()
    by_node: dict = {}
    for name, pid_file in sharedfs.servers:
        by_node.setdefault(name, []).append(pid_file)
    for name, pid_files in by_node.items():
        node = cluster.node(name)
        # Ceph's daemons keep nothing worth a clean shutdown (the OSD's store is memory) and
        # its mon takes 4 s to act on SIGTERM: they are killed.
        _end(node, pid_files, "KILL" if sharedfs.kind == "cephfs" else "TERM")
        if sharedfs.kind == "glusterfs" and node.alive():
            node.sh(_UNSTUB)
