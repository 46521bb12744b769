"""Real shared filesystems inside a namespace cluster (``testbed/cluster.py``): GlusterFS and CephFS.

    sharedfs = start_glusterfs(cluster, cluster.controller, [b1, b2])   # mounted at /mnt/glusterfs
    sharedfs = start_cephfs(cluster, cluster.controller, [b1, b2])      # mounted at /mnt/cephfs
    stop(cluster, sharedfs)

The servers run on one node (the controller, say) and every client node mounts the
filesystem over the cluster's network with the FUSE client of Debian's packages: several
kernels' worth of clients, each with its own cache and lock state, as build nodes have.

- GlusterFS: glusterd and one brick (a directory in the server's copy-on-write ``/var``, so
  ``volume create ... force``); clients run ``glusterfs`` (what ``mount -t glusterfs`` runs).
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
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Sequence

from cluster import Cluster, ClusterError, Node

GLUSTER_VOLUME = "hc"
GLUSTER_BRICK = "/var/lib/hc-glusterfs/brick"
CEPH_FS = "cephfs"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0
_POLL = 0.05


@dataclass(frozen=True)
class SharedFS:
    """A running shared filesystem: what it is, where the clients mount it, and its daemons."""

    kind: str  # "glusterfs" | "cephfs"
    mountpoint: str  # the same path on every client node
    version: str  # the first line of the server's ``glusterfs --version`` / ``ceph --version``
    nodes: tuple  # the client nodes' names
    server: str = ""
    fstype: str = ""  # the filesystem type the clients' /proc/self/mountinfo names
    servers: tuple = ()  # (node name, pid file inside that node) of every server daemon
    clients: tuple = ()  # (node name, pid file inside that node) of every client daemon
    start_seconds: float = 0.0


def _wait(what: str, ready, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(_POLL)


def _fstype(node: Node, mountpoint: str) -> str:
    for line in node.read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if fields[4] == mountpoint:
            return fields[fields.index("-") + 1]
    raise ClusterError(f"nothing is mounted at {mountpoint} on {node.name}")


def _mount_on(clients: Iterable[Node], mountpoint: str, command: Sequence[str], pid_file: str) -> tuple:
    """Start the FUSE client ``command`` (which daemonizes) on each node; wait for the mount."""
    mounted = []
    for node in clients:
        node.sh(f"mkdir -p {mountpoint} /run/ceph; {shlex.join(command)}")
        mounted.append((node, pid_file))
    for node, _pid_file in mounted:
        # The daemon answers the mount before it serves it: the root is there once stat succeeds
        # on the FUSE mount itself, not on the directory below it.
        _wait(
            f"the mount at {mountpoint} on {node.name}",
            lambda node=node: (
                node.run(["mountpoint", "-q", mountpoint], check=False).returncode == 0
                and node.run(["stat", "-f", mountpoint], check=False).returncode == 0
            ),
        )
    return tuple((node.name, pid_file) for node, pid_file in mounted)


# --- GlusterFS ----------------------------------------------------------------------------
def start_glusterfs(cluster: Cluster, server: Node, clients: Sequence[Node]) -> SharedFS:
    """glusterd and a one-brick volume on ``server``, mounted at /mnt/glusterfs on ``clients``."""
    started = time.monotonic()
    gluster = "gluster --mode=script"
    server.sh(f"mkdir -p {GLUSTER_BRICK} /run/gluster; glusterd -p /run/glusterd.pid")
    _wait(
        "glusterd",
        lambda: server.run(["gluster", "--mode=script", "pool", "list"], check=False).returncode == 0,
    )
    # force: the brick is on the node's root filesystem, which gluster otherwise refuses.
    server.sh(
        f"{gluster} volume create {GLUSTER_VOLUME} {server.name}:{GLUSTER_BRICK} force >/dev/null\n"
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
def ceph_conf(cluster: Cluster, server: Node) -> str:
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
# One MDS and one OSD: report to the mon often, so that "up:active" comes in a second.
mds beacon interval = 1
osd mon report interval = 1
"""


def start_cephfs(cluster: Cluster, server: Node, clients: Sequence[Node]) -> SharedFS:
    """A mon, a memstore OSD and an MDS on ``server``; ceph-fuse at /mnt/cephfs on ``clients``."""
    started = time.monotonic()
    here = cluster.root / "sharedfs" / "ceph"
    here.mkdir(parents=True, exist_ok=True)
    conf = here / "ceph.conf"
    text = ceph_conf(cluster, server)
    conf.write_text(text)
    fsid = text.split("fsid = ", 1)[1].split("\n", 1)[0]
    ceph = f"ceph -c {conf}"
    osd_uuid = uuid.uuid4()
    # The OSD's uuid is given at mkfs: a mon refuses the boot of an OSD whose uuid differs from
    # the one "osd new" registered.
    server.sh(
        f"""
mkdir -p /run/ceph /var/log/ceph /var/lib/ceph/mon/ceph-{server.name} /var/lib/ceph/osd/ceph-0 \
    /var/lib/ceph/mds/ceph-{server.name}
monmaptool --create --fsid {fsid} --addv {server.name} '[v2:{server.address}:3300]' {here}/monmap >/dev/null
ceph-mon -c {conf} --mkfs -i {server.name} --monmap {here}/monmap
ceph-mon -c {conf} -i {server.name}
{ceph} osd new {osd_uuid} >/dev/null
ceph-osd -c {conf} -i 0 --mkfs --osd-uuid {osd_uuid} 2>/dev/null
ceph-osd -c {conf} -i 0
{ceph} osd pool create cephfs_data 8 >/dev/null 2>&1
{ceph} osd pool create cephfs_metadata 8 >/dev/null 2>&1
{ceph} fs new {CEPH_FS} cephfs_metadata cephfs_data >/dev/null 2>&1
ceph-mds -c {conf} -i {server.name}
"""
    )

    def active() -> bool:
        done = server.run(["ceph", "-c", str(conf), "mds", "stat"], check=False, timeout=30)
        return "up:active" in done.stdout

    _wait("the ceph mds", active)
    mountpoint = "/mnt/cephfs"
    pid_file = "/run/ceph/ceph-fuse.pid"
    mounted = _mount_on(
        clients, mountpoint, ["ceph-fuse", "-c", str(conf), f"--pid-file={pid_file}", mountpoint], pid_file
    )
    elapsed = time.monotonic() - started
    return SharedFS(
        kind="cephfs",
        mountpoint=mountpoint,
        version=server.run(["ceph", "--version"]).stdout.splitlines()[0].strip(),
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
def _signal(node: Node, pid_file: str, signal: str = "TERM") -> str:
    """Signal the daemon of ``pid_file`` from inside ``node``; returns its pid ("" if none)."""
    done = node.run(
        ["sh", "-c", 'pid=$(cat "$1" 2>/dev/null) || exit 0; kill -s "$2" "$pid" 2>/dev/null; echo "$pid"',
         "-", pid_file, signal],
        check=False,
    )  # fmt: skip
    return done.stdout.strip()


def _gone(node: Node, pid: str) -> bool:
    return not pid or node.run(["kill", "-0", pid], check=False).returncode != 0


def _end(node: Node, pid_file: str) -> None:
    pid = _signal(node, pid_file)
    deadline = time.monotonic() + STOP_TIMEOUT
    while not _gone(node, pid):
        if time.monotonic() > deadline:
            _signal(node, pid_file, "KILL")
            break
        time.sleep(_POLL)


def stop(cluster: Cluster, sharedfs: SharedFS) -> None:
    """Unmount on every client, end the client daemons, then the servers, each by its pid."""
    for name, pid_file in sharedfs.clients:
        node = cluster.node(name)
        if not node.alive():
            continue
        # Lazy: a test that failed may have left a process with its working directory there.
        node.run(["umount", "-l", sharedfs.mountpoint], check=False)
        _end(node, pid_file)
    for name, pid_file in sharedfs.servers:
        node = cluster.node(name)
        if node.alive():
            _end(node, pid_file)
