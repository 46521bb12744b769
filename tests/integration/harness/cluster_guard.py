"""eessi-arch-guard on the session's namespace cluster: the arch_guard role over SSH, jobs from
the login node, and Slurm run the ways sites run it.

Everything jobs read lives in one world-readable directory under ``/tmp``, which every node
sees, as a CVMFS repository is seen: the EESSI-like repository (``eessi/``), with version
``2023.06`` built for the login node's target and each compute node's, and ``2025.06`` built
without the last compute node's target (a node whose EESSI has no software for its CPU); the
test job's setup for the rollout playbook (``setup.sh``); the tasks' script and output.

A "login" is real: bash and Lmod run ON a node (its own ``/proc/cpuinfo``), from a clean
environment, ``module use`` the repository's init modules and ``module load`` EESSI and two
user modules. No variable simulates a node: archdetect reads the node's CPU.

Ansible runs on the controller and reaches the nodes over SSH at their own addresses, the
collection being this checkout (linked into a collections directory under the root).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import checkout
import cluster as namespace_cluster
import eessilike
import slurmjobs
import stackenv
from localplay import Play
from tests.integration.harness.cluster import ansible_env
from tests.integration.harness.guard_slurm import (
    TASK_SCRIPT,
    job_output,
    job_workdir,
    readable_by_all,
    write_env_file,
)

VERSION = "2023.06"
# The later version, built without the last compute node's target.
PARTIAL_VERSION = "2025.06"
PLAY_TIMEOUT = 600
JOB_TIMEOUT = 120
POLL_SECONDS = 0.1
SLURM_CONF = namespace_cluster.SLURM_CONF
# task.sh of the single-node tests, and the node each task ran on.
CLUSTER_TASK_SCRIPT = TASK_SCRIPT + 'echo "$tag node=${SLURMD_NODENAME-}"\n'
# The role alone, on the hosts of the group guard_nodes.
ROLE_PLAYBOOK = """\
- name: Roll the guard out
  hosts: guard_nodes
  gather_facts: false
  roles:
    - role: hpcstack.ops.arch_guard
"""
# Where on a node (its own /var) the archdetect stand-in logs its runs: one log per node.
RUNLOG = "/var/tmp/eessi-archdetect-runs"
# The job loop's period, and what each task of its jobs prints: its node, the guard's marker
# and the site TaskProlog's variable.
LOOP_PERIOD = 2.0
LOOP_TASK = (
    'echo "task node=${SLURMD_NODENAME-} reloaded=${EESSI_ARCH_GUARD_RELOADED-} site=${SITE_TASK_PROLOG-}"'
)


def target_of(cpu_file: str) -> str:
    """The CPU target the archdetect stand-in answers for a cpuinfo fixture."""
    return {name: target for target, name in eessilike.CPUINFO_FIXTURES.items()}[cpu_file]


@dataclass
class ClusterGuard:
    """The cluster, the repository every node sees, and how to run plays and jobs there."""

    cluster: namespace_cluster.Cluster
    root: Path
    lmod: stackenv.Lmod
    prefix: eessilike.EessiPrefix
    targets: dict  # node name -> its CPU target
    timings: list = field(default_factory=list)  # (what, seconds) of every play run

    @property
    def login(self) -> namespace_cluster.Node:
        return self.cluster.by_role("login")[0]

    @property
    def compute(self) -> list:
        return self.cluster.by_role("compute")

    # --- logins ---------------------------------------------------------------------------
    def login_env(self, node: namespace_cluster.Node, modules: tuple | None = None) -> dict:
        """What a login shell ON ``node`` exports after loading EESSI and the user modules."""
        modules = eessilike.default_modules(self.prefix) if modules is None else modules
        base = eessilike.login_base(self.prefix, self.lmod)
        command = (
            f"exec 3>&1 1>&2; . {shlex.quote(str(self.lmod.init))} || exit 97\n"
            f"{eessilike.load_script(self.prefix, modules)} || exit 98\n"
            "env -0 >&3"
        )
        done = node.run(["bash", "--noprofile", "--norc", "-c", command], env=base, check=False)
        assert done.returncode == 0, f"login on {node.name}: {done.stderr}"
        env = eessilike.parse_env0(done.stdout.encode())
        for name in ("PWD", "OLDPWD", "SHLVL", "_"):
            env.pop(name, None)
        return env

    def node_view(self, node: namespace_cluster.Node) -> dict:
        """What task.sh prints after a fresh login on ``node`` (its marker aside)."""
        env = self.login_env(node)
        script = f"exec 3>&1 1>&2; . {shlex.quote(str(self.lmod.init))}; module -t list"
        listed = node.run(["bash", "--noprofile", "--norc", "-c", script], env=env)
        return {
            "EESSI_SOFTWARE_SUBDIR": env["EESSI_SOFTWARE_SUBDIR"],
            "MODULEPATH": env["MODULEPATH"],
            "PATH": env["PATH"],
            "modules": " ".join(line for line in listed.stderr.split() if "/" in line),
            "usera": env["EESSI_SOFTWARE_SUBDIR"],
            "node": node.name,
        }

    # --- jobs -----------------------------------------------------------------------------
    def rollout_settings(self, **more) -> dict:
        """guard_rollout.yml's variables for these nodes: the role owns slurm.conf, one node a
        batch, and the test job submitted from the login node's target."""
        return {
            "arch_guard_manage_slurm_conf": True,
            "guard_batch": 1,
            "guard_mismatch_target": self.targets["login"],
            "guard_eessi_setup": f". {self.root / 'setup.sh'}",
            "guard_eessi_root": str(self.prefix.root),
            "guard_srun_args": ["--overcommit", "--time=5"],
            **more,
        }

    def workdir(self, name: str) -> Path:
        return job_workdir(self.root, name, CLUSTER_TASK_SCRIPT)

    def task_argv(self, work: Path) -> str:
        return f"{shlex.quote(str(work / 'task.sh'))} {shlex.quote(str(work))}"

    def clear_runlogs(self) -> None:
        for node in self.compute:
            node.run(["rm", "-f", RUNLOG])

    def runlogs(self) -> dict:
        """Node name -> the archdetect runs logged there."""
        found = {}
        for node in self.compute:
            done = node.run(["cat", RUNLOG], check=False)
            found[node.name] = done.stdout.splitlines() if done.returncode == 0 else []
        return found

    def srun(self, work: Path, env: dict, *args: str):
        """``srun -N3 --ntasks-per-node=2 --label task.sh`` from the login node, with ``env``."""
        argv = [
            "srun", "--quiet", "-N3", "--ntasks-per-node=2", "--overcommit", "--label", *args,
            str(work / "task.sh"), str(work),
        ]  # fmt: skip
        done = self.login.run(argv, env=env, workdir=str(work), timeout=JOB_TIMEOUT, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        self.wait_idle()
        return job_output(done.stdout, first="0")

    def sbatch(self, work: Path, env: dict):
        """A batch job over the three compute nodes, submitted from the login node: the batch
        step's report, then one srun step of two tasks per node. Waits until it is done."""
        srun = f"srun --quiet --label {self.task_argv(work)}"
        script = work / "job.sh"
        script.write_text(f"#!/bin/bash\n{self.task_argv(work)}\necho '== step 0'\n{srun}\n")
        script.chmod(0o755)
        output = work / "job.out"
        argv = [
            "sbatch", "--parsable", "-N3", "--ntasks-per-node=2", "--overcommit", f"--output={output}",
            str(script),
        ]  # fmt: skip
        submitted = self.login.run(argv, env=env, workdir=str(work), check=False)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().split(";")[0]
        state, exit_code = self.wait(job_id)
        text = output.read_text(errors="replace") if output.exists() else ""
        assert (state, exit_code) == ("COMPLETED", "0:0"), text
        return job_output(text)

    def wait(self, job_id: str) -> tuple:
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            shown = self.cluster.controller.run(
                ["scontrol", "show", "job", "--oneliner", job_id], check=False
            )
            fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
            if fields.get("JobState") in slurmjobs.FINISHED_STATES:
                self.wait_idle()
                return fields["JobState"], fields.get("ExitCode", "")
            assert time.monotonic() < deadline, f"job {job_id} not done: {shown.stdout} {shown.stderr}"
            time.sleep(POLL_SECONDS)

    def wait_idle(self) -> None:
        """Until no job is listed: srun returns while its job may still be completing."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            listed = self.cluster.controller.run(["squeue", "--noheader", "--format=%A %T"], check=False)
            if listed.returncode == 0 and not listed.stdout.strip():
                return
            assert time.monotonic() < deadline, f"jobs still listed: {listed.stdout}"
            time.sleep(POLL_SECONDS)

    # --- plays ----------------------------------------------------------------------------
    def ansible_env(self) -> dict:
        """Ansible's environment on the controller: the collection, and its files under the root,
        the SSH masters that ControlPersist keeps between plays too (the ssh connection's
        directory is ~/.ansible/cp whatever ANSIBLE_HOME says), so that ``guard_root`` finds
        them to close."""
        home = self.root / "ansible"
        return ansible_env(
            {
                "ANSIBLE_COLLECTIONS_PATH": str(self.root / "collections"),
                "ANSIBLE_HOME": str(home),
                "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(home / "cp"),
            }
        )

    def playbook(self, what: str, name: str, inventory: Path, variables: dict, *extra: str) -> Play:
        """``ansible-playbook`` on the controller (a file, or one of the collection's by name)."""
        target = name if name.endswith(".yml") else f"hpcstack.ops.{name}"
        argv = ["ansible-playbook", target, "-i", str(inventory), "-e", json.dumps(variables), *extra]
        return self._ansible(what, argv)

    def adhoc(self, what: str, inventory: Path, module: str, args: str = "") -> Play:
        """``ansible all -m module -a args`` on the controller, to every host of ``inventory``."""
        return self._ansible(what, ["ansible", "all", "-i", str(inventory), "-m", module, "-a", args])

    def _ansible(self, what: str, argv: list) -> Play:
        started = time.monotonic()
        done = self.cluster.controller.run(
            argv, env=self.ansible_env(), check=False, timeout=PLAY_TIMEOUT, workdir=str(self.root)
        )
        self.timings.append((what, time.monotonic() - started))
        return Play(done)

    def role(self, what: str, inventory: Path, **variables) -> Play:
        return self.playbook(what, str(self.root / "role.yml"), inventory, variables)

    def inventory(self, name: str, groups: dict, **host_vars) -> Path:
        return self.cluster.inventory(groups, self.root / f"{name}.yml", **host_vars)

    def slurm_confs(self, names: list) -> dict:
        """Node name -> the bytes of its slurm.conf."""
        return {name: self.cluster.node(name).read(SLURM_CONF) for name in names}

    # --- Slurm's modes --------------------------------------------------------------------
    def restart_slurm(self, configless: bool) -> None:
        """slurmctld and every slurmd stopped (by pid, inside their nodes) and started again:
        configless (``enable_configless``, ``slurmd --conf-server``) or as the harness runs it."""
        ctl = self.cluster.controller
        for node in [*self.compute, ctl]:
            daemon = "slurmctld" if node is ctl else "slurmd"
            _stop(node, f"/run/slurm/{daemon}.pid")
        extra = "SlurmctldParameters=enable_configless\n" if configless else ""
        ctl.write(SLURM_CONF, namespace_cluster.slurm_conf(self.cluster, extra))
        ctl.run(["slurmctld", "-i"])
        for node in self.compute:
            # What a configless slurmd fetched is kept in its spool and /run; the harness's
            # mode reads the node's own file only.
            node.run(["rm", "-rf", "/var/spool/slurmd/conf-cache", "/run/slurm/conf"])
            node.run(["slurmd", "--conf-server", ctl.address] if configless else ["slurmd"])
        namespace_cluster.wait_for_slurm(self.cluster)

    @contextlib.contextmanager
    def shared_slurm_conf(self, names: tuple = ()) -> Iterator[Path]:
        """One ``/etc/slurm`` for the controller, the login node and the compute nodes (or
        the nodes ``names``), as a site mounts it from a shared filesystem: a directory under
        the root, bound over each node's own (the file in it is edited by rename, as over
        NFS). Its ``slurm.conf`` is the controller's; the daemons read it at the next
        ``scontrol reconfigure``. Each node's own directory comes back afterwards."""
        shared = Path(tempfile.mkdtemp(prefix="shared-etc-slurm-", dir=self.root))
        shared.chmod(0o755)
        (shared / "slurm.conf").write_text(self.cluster.controller.read(SLURM_CONF))
        (shared / "slurm.conf").chmod(0o644)
        nodes = [self.cluster.node(name) for name in names] or [
            self.cluster.controller,
            self.login,
            *self.compute,
        ]
        bound = []
        try:
            for node in nodes:
                node.run(["mount", "--bind", str(shared), "/etc/slurm"])
                bound.append(node)
            self.cluster.controller.run(["scontrol", "reconfigure"])
            yield shared / "slurm.conf"
        finally:
            for node in bound:
                node.run(["umount", "/etc/slurm"], check=False)
            self.cluster.controller.run(["scontrol", "reconfigure"], check=False)
            namespace_cluster.wait_for_slurm(self.cluster)

    def job_loop(self, work: Path, env: dict, period: float = LOOP_PERIOD) -> JobLoop:
        """``srun -N3`` from the login node every ``period`` seconds, until stopped."""
        return JobLoop(self, work, env, period)


@dataclass
class LoopJob:
    """One of the loop's jobs: when it was submitted and finished (monotonic), and how."""

    started: float
    ended: float
    returncode: int
    stdout: str
    stderr: str

    def tasks(self) -> dict:
        """Node -> the ``key=value`` fields its task printed."""
        found = {}
        for line in self.stdout.splitlines():
            text = line.partition(": ")[2]
            if text.startswith("task "):
                fields = dict(item.split("=", 1) for item in text.split()[1:])
                found[fields["node"]] = fields
        return found

    def lines(self, rank: str) -> list:
        """The output of task ``rank`` (prologs' ``print`` lines first), unlabelled."""
        prefix = f"{rank}: "
        return [line[len(prefix) :] for line in self.stdout.splitlines() if line.startswith(prefix)]


class JobLoop:
    """A thread that submits ``srun -N3 -n3`` from the login node every ``period`` seconds, as
    users do while the guard is rolled out, and keeps every job's outcome. ``paused()``
    submits none for a while: each job is a guard's repair on three nodes, CPU that plays
    which change nothing on the nodes need not be checked against."""

    def __init__(self, guard: ClusterGuard, work: Path, env: dict, period: float) -> None:
        self.guard, self.work, self.env, self.period = guard, work, env, period
        self.jobs: list = []
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> JobLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(JOB_TIMEOUT + 10)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No job submitted inside the block; the one running when it starts is waited for."""
        self._idle.clear()
        self._running.clear()
        try:
            assert self._idle.wait(JOB_TIMEOUT + 10), "the loop's job did not end"
            yield
        finally:
            self._running.set()

    def _run(self) -> None:
        argv = ["srun", "--quiet", "-N3", "-n3", "--overcommit", "--label", "/bin/sh", "-c", LOOP_TASK]
        while not self._stop.is_set():
            if not self._running.is_set():
                self._idle.set()
                self._running.wait()
                continue
            started = time.monotonic()
            try:
                done = self.guard.login.run(
                    argv, env=self.env, workdir=str(self.work), timeout=JOB_TIMEOUT, check=False
                )
                outcome = (done.returncode, done.stdout, done.stderr)
            except Exception as problem:  # a hung srun is a failed job too
                outcome = (-1, "", repr(problem))
            self.jobs.append(LoopJob(started, time.monotonic(), *outcome))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def wait_for(self, count: int, after: float) -> None:
        """Until ``count`` jobs submitted after ``after`` have finished."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while len([job for job in self.jobs if job.started > after]) < count:
            assert time.monotonic() < deadline, f"the loop ran {len(self.jobs)} jobs"
            time.sleep(POLL_SECONDS)

    def failed(self) -> list:
        return [job for job in self.jobs if job.returncode != 0 or len(job.tasks()) != 3]


def _stop(node: namespace_cluster.Node, pid_file: str, timeout: float = 30) -> None:
    """SIGTERM to the daemon whose pid (in the node's pid namespace) ``pid_file`` holds, and
    wait until it is gone."""
    script = f"""pid=$(cat {pid_file} 2>/dev/null) || exit 0
kill "$pid" 2>/dev/null || exit 0
i=0
while kill -0 "$pid" 2>/dev/null; do i=$((i+1)); [ "$i" -lt {int(timeout * 20)} ] || exit 1; sleep 0.05; done
rm -f {pid_file}"""
    node.sh(script, timeout=timeout + 10)


def build_root(cluster: namespace_cluster.Cluster, lmod: stackenv.Lmod, root: Path) -> ClusterGuard:
    """The repository, setup.sh, the collection link and the role's playbook under ``root``."""
    targets = {node.name: target_of(node.spec.cpu) for node in cluster.nodes if node.spec.cpu}
    login_target = targets[cluster.by_role("login")[0].name]
    compute_targets = [targets[node.name] for node in cluster.by_role("compute")]
    # Each target once, however many nodes share it.
    every = list(dict.fromkeys([login_target, *compute_targets]))
    prefix = eessilike.build_prefix(root / "eessi", targets=every, accel={})
    eessilike.build_prefix(
        root / "eessi",
        targets=[target for target in every if target != compute_targets[-1]],
        accel={},
        version=PARTIAL_VERSION,
    )
    # The rollout's test job loads EESSI in an empty shell (env -i): a clean login's base first.
    setup = write_env_file(root / "setup.sh", eessilike.login_base(prefix, lmod))
    with setup.open("a") as handle:
        handle.write(f". {shlex.quote(str(lmod.init))} && {eessilike.load_script(prefix, [prefix.module])}\n")
    checkout.link_collection(root / "collections")
    (root / "role.yml").write_text(ROLE_PLAYBOOK)
    readable_by_all(root)
    return ClusterGuard(cluster=cluster, root=root, lmod=lmod, prefix=prefix, targets=targets)


@contextlib.contextmanager
def guard_root(cluster: namespace_cluster.Cluster, lmod: stackenv.Lmod) -> Iterator[ClusterGuard]:
    root = Path(tempfile.mkdtemp(prefix="hc-guard-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield build_root(cluster, lmod, root)
    finally:
        _close_connections(cluster, root / "ansible" / "cp")
        shutil.rmtree(root, ignore_errors=True)


def _close_connections(cluster: namespace_cluster.Cluster, control_dir: Path) -> None:
    """Ask each SSH master Ansible left on the controller to exit (ControlPersist keeps them)."""
    if not control_dir.is_dir():
        return
    for socket in control_dir.iterdir():
        cluster.controller.run(
            ["ssh", "-F", str(cluster.ssh_config), "-o", f"ControlPath={socket}", "-O", "exit", "any"],
            check=False,
        )
