"""The collection's plays over SSH to a fleet: how long each takes on a namespace cluster of
3 and of 8 compute nodes, beside the least that any play to the same hosts costs.

Each size gets a cluster of its own (``testbed/cluster.py``: a controller, a login node and
the compute nodes, whose CPUs go round three targets; Slurm runs jobs on all of them), with
the EESSI-like repository every node sees, as in the cluster tests. Ansible runs on the
controller and reaches every node over SSH at its own address, with the connection settings
``docs/ansible.md`` gives sites (pipelining, ControlPersist, forks), as the cluster tests use
them. The floors, to the same inventory with the same settings:

- ``ansible -m ping``: one round trip to each node, the interpreter started there;
- one ``copy`` of the whole ``module_utils`` (both tools' code) as one tar archive.

Then each play once, in this order, each checked before its time counts (a failed or
unreachable host, or a rerun that changed something, stops the benchmark):

- the arch_guard role's first install, the role owning each node's slurm.conf;
- the same again, which must change nothing;
- the role's removal (absent), which must put every slurm.conf back;
- ``playbooks/guard_rollout.yml`` from nothing: the canary node with a real test job
  submitted from the login node's target, then the batches (the playbook's default 10%, so
  one node each: serial by design), then the fleet report;
- the build_host role's first install on the same nodes (EasyBuild from the wheelhouse into
  a virtual environment, and the core), then its rerun, which must change nothing.

Goals (the issue's): on 3 nodes the first install at most 30 s, the rerun at most 10 s and
the rollout at most 60 s; on 8 nodes the first install and the rerun at most 1.5x their
3-node times, so that hosts are worked on in parallel, not one after another.

Needs root, like the cluster tests (``tools/bootstrap.sh test``).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

import checkout
import cluster as namespace_cluster
import stackenv
from benchlib import FleetCase, FleetStep

sys.path.insert(0, str(checkout.REPO))

from tests.integration.harness.cluster import CONNECTION_ENV, cluster_specs
from tests.integration.harness.cluster_guard import ClusterGuard, guard_root

SIZES = (3, 8)
FLOOR_ROUNDS = 3
PING = "ansible -m ping"
COPY = "copy of module_utils as one archive"
GUARD_INSTALL = "arch_guard first install"
GUARD_RERUN = "arch_guard rerun, nothing to change"
GUARD_REMOVE = "arch_guard removal"
ROLLOUT = "guard_rollout.yml (canary, batches, report)"
BUILD_INSTALL = "build_host first install"
BUILD_RERUN = "build_host rerun, nothing to change"
STEPS = [
    FleetStep(GUARD_INSTALL, goal=30, growth=1.5),
    FleetStep(GUARD_RERUN, goal=10, growth=1.5),
    FleetStep(GUARD_REMOVE),
    FleetStep(ROLLOUT, goal=60),
    FleetStep(BUILD_INSTALL),
    FleetStep(BUILD_RERUN),
]
GUARD_SETTINGS = {"arch_guard_manage_slurm_conf": True}
BUILD_PLAY = """\
- name: Prepare the build hosts
  hosts: guard_nodes
  gather_facts: false
  roles:
    - role: hpcstack.ops.build_host
"""
# Where on each node the build_host role points EasyBuild (the node's own /opt).
BUILD_INSTALLPATH = "/opt/apps"
# What the build_host role writes outside the install path (its defaults): its environment
# and the command.
BUILD_HOST_FILES = ("/opt/hpcstack/eb-staged-rebuild", "/usr/local/bin/eb-staged-rebuild")
# What the arch_guard role installs on a node (its defaults): the guard, and the state
# directory that keeps the TaskProlog line found before it.
GUARD_FILES = ("/opt/hpcstack/arch-guard", "/var/lib/hpcstack/arch-guard")
LEGEND = f"""\
Fleet: the wall time of each play over SSH, one run each on a cluster of that many compute
nodes (Ansible on the controller; {", ".join(f"{k}={v}" for k, v in CONNECTION_ENV.items())},
pipelining). x floor: the play / the floor of the same cluster ({PING} + one {COPY});
{SIZES[-1]}/{SIZES[0]}: the time on {SIZES[-1]} nodes / on {SIZES[0]}; / floor's: that over the floor's
{SIZES[-1]}/{SIZES[0]} (1: as parallel as the floor; where the nodes share the machine's CPUs the floor
itself grows with them)."""


class BenchError(RuntimeError):
    """A play of the benchmark did not do what it should: no figure for it."""


@contextlib.contextmanager
def _fleet(size: int) -> Iterator[ClusterGuard]:
    cluster = namespace_cluster.up(cluster_specs(compute=size, build=0))
    try:
        with guard_root(cluster, stackenv.find_lmod()) as site:
            yield site
    finally:
        cluster.down()
        left = cluster.leftovers()
        if not left:
            namespace_cluster.remove_root(cluster)
    if left:
        raise BenchError("the cluster left behind: " + "; ".join(left))


def _checked(play, hosts: int, *, changed: bool | None, what: str):
    """``play`` if every one of ``hosts`` hosts ran it without failing and it changed
    something (``changed``), nothing (not ``changed``) or either (None)."""
    fine = (
        play.done.returncode == 0 and play.failed == 0 and play.unreachable == 0 and len(play.recap) == hosts
    )
    if fine and changed is not None:
        fine = (play.changed > 0) == changed
    if not fine:
        raise BenchError(f"{what}: rc {play.done.returncode}, recap {play.recap}\n{play.output[-4000:]}")
    return play


def _checked_adhoc(play, hosts: int, what: str):
    answered = [line for line in play.stdout.splitlines() if " | SUCCESS" in line or " | CHANGED" in line]
    if play.done.returncode != 0 or len(answered) != hosts:
        raise BenchError(f"{what}: rc {play.done.returncode}\n{play.output[-4000:]}")
    return play


def _last_seconds(site: ClusterGuard) -> float:
    return site.timings[-1][1]


def _archive(directory: Path) -> Path:
    """The whole module_utils as one tar archive, as the roles ship their part of it."""
    archive = directory / "module_utils.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(checkout.REPO / "plugins" / "module_utils", arcname="hpcstack_ops")
    archive.chmod(0o644)
    return archive


def measure(size: int, rounds: int = FLOOR_ROUNDS) -> dict:
    """The seconds of the floors (the median of ``rounds`` runs each) and every step on a
    cluster of ``size`` compute nodes."""
    with _fleet(size) as site:
        return _measure(site, site.compute, rounds)


def measure_on(root: Path, size: int, rounds: int = FLOOR_ROUNDS) -> dict:
    """The seconds of the floors and every step on ``size`` compute nodes of the running
    cluster whose directory is ``root`` (``testbed/cluster.py``'s ``cluster.json``): the
    cluster tests' own, which the suite's run of this benchmark borrows rather than start a
    third. The cluster is left as it was found: the guard removed by its role, the build_host
    role's files gone from the nodes, every slurm.conf back byte for byte."""
    cluster = namespace_cluster.Cluster.load(root)
    nodes = cluster.by_role("compute")[:size]
    if len(nodes) < size:
        raise BenchError(f"the cluster in {root} has {len(nodes)} compute nodes, not {size}")
    with guard_root(cluster, stackenv.find_lmod()) as site:
        before = site.slurm_confs([node.name for node in cluster.nodes if node.spec.role != "build"])
        try:
            return _measure(site, nodes, rounds)
        finally:
            _give_back(site, nodes, before)


def _give_back(site: ClusterGuard, nodes: list, before: dict) -> None:
    """Undo on a borrowed cluster what the plays did on ``nodes``: their files removed, each
    slurm.conf written back as it was and Slurm told. Not by a play of the role's removal:
    its step was measured already, and test_cluster_guard.py checks it after a rollout."""
    for node in nodes:
        node.run(["rm", "-rf", *GUARD_FILES, *BUILD_HOST_FILES, BUILD_INSTALLPATH])
        node.sh("rm -f /var/tmp/fleet-floor-*.tar")
    changed = [name for name, text in site.slurm_confs(list(before)).items() if text != before[name]]
    for name in changed:
        site.cluster.node(name).write(namespace_cluster.SLURM_CONF, before[name])
    if changed:
        site.cluster.controller.run(["scontrol", "reconfigure"])


def _measure(site: ClusterGuard, nodes: list, rounds: int) -> dict:
    """The seconds of the floors and every step on the compute nodes ``nodes`` of ``site``."""
    size = len(nodes)
    names = [node.name for node in nodes]
    inventory = site.inventory(f"fleet-{size}", {"slurm_compute": names, "guard_nodes": names})
    (site.root / "build.yml").write_text(BUILD_PLAY)
    seconds = {}

    pings = []
    for _round in range(rounds):
        _checked_adhoc(site.adhoc(PING, inventory, "ping"), size, PING)
        pings.append(_last_seconds(site))
    seconds[PING] = statistics.median(pings)
    with tempfile.TemporaryDirectory(dir=site.root) as scratch:
        archive = _archive(Path(scratch))
        copies = []
        for round_ in range(rounds):
            args = f"src={archive} dest=/var/tmp/fleet-floor-{round_}.tar mode=0644"
            _checked_adhoc(site.adhoc(COPY, inventory, "copy", args), size, COPY)
            copies.append(_last_seconds(site))
    seconds[COPY] = statistics.median(copies)

    _checked(site.role(GUARD_INSTALL, inventory, **GUARD_SETTINGS), size, changed=True, what=GUARD_INSTALL)
    seconds[GUARD_INSTALL] = _last_seconds(site)
    _checked(site.role(GUARD_RERUN, inventory, **GUARD_SETTINGS), size, changed=False, what=GUARD_RERUN)
    seconds[GUARD_RERUN] = _last_seconds(site)
    removal = site.role(GUARD_REMOVE, inventory, arch_guard_state="absent", **GUARD_SETTINGS)
    _checked(removal, size, changed=True, what=GUARD_REMOVE)
    seconds[GUARD_REMOVE] = _last_seconds(site)

    rollout = site.playbook(ROLLOUT, "guard_rollout", inventory, site.rollout_settings(guard_batch="10%"))
    _checked(rollout, size, changed=True, what=ROLLOUT)
    if f"eessi-arch-guard on {size} nodes: installed on {size}" not in rollout.stdout:
        raise BenchError(f"{ROLLOUT}: the report does not say installed on {size}\n{rollout.stdout[-4000:]}")
    seconds[ROLLOUT] = _last_seconds(site)

    for node in nodes:
        node.run(["mkdir", "-p", f"{BUILD_INSTALLPATH}/software", f"{BUILD_INSTALLPATH}/modules"])
    build = str(site.root / "build.yml")
    # EasyBuild from the wheelhouse tools/bootstrap.sh built, as the cluster tests install it.
    wheelhouse = Path(stackenv.find_eb()).parent.parent / "wheelhouse"
    build_settings = {
        "build_host_installpath": BUILD_INSTALLPATH,
        "build_host_pip_args": ["--no-index", "--find-links", str(wheelhouse)],
    }
    for step, changed in ((BUILD_INSTALL, True), (BUILD_RERUN, False)):
        _checked(site.playbook(step, build, inventory, build_settings), size, changed=changed, what=step)
        seconds[step] = _last_seconds(site)
    return seconds


# ``run.py --once``: one compute node. Every play and check of the benchmark runs (the
# rollout's batches play matches no host: the canary is the whole fleet), at a third less
# CPU than on two nodes, most of it the build_host role's install of EasyBuild on each node;
# the rollout's batches are test_cluster_guard.py's.
SMALLEST_SIZES = (1,)

CASES = [
    FleetCase(
        "fleet",
        SIZES,
        [PING, COPY],
        STEPS,
        measure,
        legend=LEGEND,
        smallest={"sizes": SMALLEST_SIZES},
        measure_on=measure_on,
        rounds=FLOOR_ROUNDS,
    )
]
