"""The guard's part of `make demo`: a job that inherited EESSI for the wrong CPU, repaired.

An EESSI-like prefix (testbed/eessilike.py) is built under <demo>/eessi, with a build for the
CPU of this machine among its targets. First a real job: a single-node Slurm cluster starts
on this machine (testbed/slurm-local.sh, as the tests start it; left running for the
how-tos, stopped by `make demo-stop`), and
a user who loaded EESSI on a login node of another CPU submits a job to it, once with a
TaskProlog that does nothing and once with the guard as TaskProlog. Without root or the
Slurm packages the demo says so in one line and goes on.

Then other nodes, simulated by the variables EESSI's archdetect reads, so one machine plays
both: a user logs in on a zen3 node and loads EESSI with two modules; the job lands on an
icelake node with a GPU. Without the guard its programs are the zen3 builds. The guard's
TaskProlog directives are shown, and a job script that runs
`eval "$(eessi-arch-guard --shell)"` gets the icelake builds.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# Run as a script, only testbed/ is on sys.path: tools/checkout.py, the checkout's files and
# import names, sits with the tools that build and check the project.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tools"))

import checkout
import demo_site
import eessilike
import localplay
import slurmjobs
import stackenv

LOGIN = ("x86_64/amd/zen3", None)
COMPUTE = ("x86_64/intel/icelake", "accel/nvidia/cc80")
# The user modules' commands print the CPU target they were built for.
SHOW = 'echo "EESSI_SOFTWARE_SUBDIR=$EESSI_SOFTWARE_SUBDIR"; echo "usera runs the build for $(usera)"'

SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
SLURM_PACKAGES = "munge slurmctld slurmd slurm-client"
JOB_TIMEOUT = 120
JOB_SCRIPT = f"""#!/bin/bash
{SHOW}
echo "EESSI_ARCH_GUARD_RELOADED=${{EESSI_ARCH_GUARD_RELOADED:-(not set)}}"
"""


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def show(ran: eessilike.ShellRun) -> None:
    for line in ran.stderr.splitlines():
        print("   " + line, flush=True)


def show_lines(text: str) -> None:
    for line in text.splitlines():
        print("   " + line, flush=True)


@dataclass(frozen=True)
class Outcome:
    """How the guard's part went, and what it leaves for the how-tos."""

    status: int  # 0 when everything shown went right
    prefix: eessilike.EessiPrefix
    slurm_conf: Optional[Path]  # the demo's running Slurm, None without one
    here: Optional[str]  # archdetect's target for this machine
    other: Optional[str]  # a target of the stack this machine cannot use


def run(lmod: stackenv.Lmod, demo: Path) -> Outcome:
    root = demo / "eessi"
    shutil.rmtree(root, ignore_errors=True)
    compatible = this_cpu()
    targets = eessilike.DEFAULT_TARGETS
    if compatible is not None and compatible[0] not in targets:
        targets = (*targets, compatible[0])
    prefix = eessilike.build_prefix(root, targets=targets)
    say(f"an EESSI-like stack with {len(prefix.targets)} CPU targets: {prefix.prefix}")
    here = other = None
    if compatible is not None:
        here, other = compatible[0], eessilike.target_elsewhere(compatible, prefix.targets)
    slurm_ok, conf = real_slurm_job(lmod, prefix, compatible, (here, other), demo)
    status = simulated_nodes(lmod, prefix) or (0 if slurm_ok else 1)
    return Outcome(status, prefix, conf, here, other)


def simulated_nodes(lmod: stackenv.Lmod, prefix: eessilike.EessiPrefix) -> int:
    modules = " ".join(eessilike.default_modules(prefix))
    say(
        f"nodes simulated by the variables archdetect reads: a user logs in on a {LOGIN[0]} node "
        f"and runs: module load {modules}"
    )
    login = eessilike.login_environment(lmod, prefix, prefix.node_env(*LOGIN))
    job = dict(login, **prefix.node_env(*COMPUTE))
    say(f"the job runs on a {COMPUTE[0]} node with a GPU; without the guard it gets:")
    show(eessilike.run_shell(lmod, job, SHOW))

    with tempfile.TemporaryDirectory(prefix="hpcstack-demo-") as tmp:
        package = checkout.link_package(Path(tmp))
        guard = checkout.guard_argv(sys.executable, package)
        prolog = subprocess.run(guard, env=dict(job, SLURM_LOCALID="0"), capture_output=True, check=False)
        lines = prolog.stdout.decode().splitlines()
        exports = sum(line.startswith(("export ", "unset ")) for line in lines)
        say(f"as Slurm's TaskProlog, eessi-arch-guard writes {exports} export/unset directives and:")
        for line in lines:
            if line.startswith(("print ", "export EESSI_ARCH_GUARD")):
                print("   " + line, flush=True)
        say('in a job script, eval "$(eessi-arch-guard --shell)" repairs the same environment:')
        command = " ".join(shlex.quote(part) for part in [*guard, "--shell"])
        repaired = eessilike.run_shell(
            lmod,
            job,
            f'eval "$({command})" && {SHOW}; echo "EESSI_ARCH_GUARD_RELOADED=$EESSI_ARCH_GUARD_RELOADED"',
        )
    show(repaired)
    return 0 if repaired.returncode == 0 and prolog.returncode == 0 else 1


def this_cpu() -> tuple | None:
    """archdetect's targets for this machine's /proc/cpuinfo, most specific first, or None."""
    try:
        return eessilike.cpupath()
    except eessilike.EessiLikeError:
        return None


def why_no_slurm(compatible: tuple | None) -> str | None:
    """Why this machine cannot run the real Slurm job, in a few words; None if it can."""
    if compatible is None:
        return "archdetect does not recognise this machine's CPU"
    if os.geteuid() != 0:
        return "starting slurmd needs root (run make demo as root)"
    admin_path = os.pathsep.join([os.environ.get("PATH", os.defpath), localplay.ADMIN_PATH])
    missing = [name for name in SLURM_COMMANDS if shutil.which(name, path=admin_path) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install {SLURM_PACKAGES})"
    return None


def real_slurm_job(
    lmod: stackenv.Lmod,
    prefix: eessilike.EessiPrefix,
    compatible: tuple | None,
    targets: tuple,
    demo: Path,
) -> tuple[bool, Optional[Path]]:
    """Start the demo's Slurm (or find it running) and run the mismatched job without and
    with the guard; Slurm stays up for the how-tos, with its no-op TaskProlog back.

    ``(False, ...)`` only when a job that ran went wrong; Slurm that cannot start is one line.
    The second value is the running cluster's slurm.conf.
    """
    reason = why_no_slurm(compatible)
    if reason:
        say(f"no real Slurm job in this demo: {reason}")
        return True, None
    try:
        cluster = demo_site.make_slurm_root(demo)
    except (OSError, demo_site.DemoSiteError) as err:
        say(f"no real Slurm job in this demo: {err}")
        return True, None
    started = slurmjobs.slurm_local("start", cluster, demo_site.SLURM_START_TIMEOUT)
    if started.returncode != 0:
        last = (started.stderr.strip().splitlines() or ["no message"])[0]
        say(f"no real Slurm job in this demo: testbed/slurm-local.sh could not start it ({last})")
        demo_site.stop_slurm(demo)
        return True, None
    work = cluster.parent / "jobs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    try:
        return _two_jobs(lmod, prefix, targets, work, cluster), cluster / "slurm.conf"
    finally:
        _set_task_prolog(cluster, "#!/bin/sh\nexit 0\n")


def _two_jobs(
    lmod: stackenv.Lmod, prefix: eessilike.EessiPrefix, targets: tuple, work: Path, cluster: Path
) -> bool:
    """``targets``: this machine's CPU target, and the login node's that it cannot use."""
    here, other = targets
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=False).stdout.strip()
    say(
        f"this machine is now a real Slurm node, {node} (munged, slurmctld and slurmd started by "
        f"testbed/slurm-local.sh start {cluster}); archdetect says its CPU is {here}"
    )
    modules = " ".join(eessilike.default_modules(prefix))
    login = eessilike.login_environment(lmod, prefix, prefix.node_env(other))
    for name in eessilike.NODE_VARIABLES:
        login.pop(name, None)
    (work / "tmp").mkdir()
    env = dict(login, SLURM_CONF=str(cluster / "slurm.conf"), TMPDIR=str(work / "tmp"))
    script = work / "job.sh"
    script.write_text(JOB_SCRIPT)
    script.chmod(0o755)

    say(
        f"on a login node whose CPU is {other}, a user runs module load {modules} and submits "
        "a job with sbatch; the job prints what it sees"
    )
    say("without the guard (Slurm's TaskProlog does nothing), the job's output is:")
    without = _sbatch(work, script, env, "without-guard")
    show_lines(without[1])
    package = checkout.copy_package(work / "package")
    _set_task_prolog(cluster, checkout.guard_task_prolog(sys.executable, package))
    say("with eessi-arch-guard as Slurm's TaskProlog, the same job's output is:")
    guarded = _sbatch(work, script, env, "with-guard")
    show_lines(guarded[1])
    return without[0] == guarded[0] == "COMPLETED"


def _set_task_prolog(cluster: Path, text: str) -> None:
    """Replace the cluster's TaskProlog in one rename: Slurm reads it afresh for each task."""
    new = cluster / ".task_prolog.new"
    new.write_text(text)
    new.chmod(0o755)
    os.replace(new, cluster / "task_prolog")


def _sbatch(work: Path, script: Path, env: dict, name: str) -> tuple[str, str]:
    """Submit ``script`` and wait for its end: (job state, output)."""
    output = work / f"{name}.out"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={output}", str(script)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    if submitted.returncode != 0:
        return "NOT SUBMITTED", submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    state = _wait(job, env)
    text = output.read_text(errors="replace") if output.exists() else ""
    if state != "COMPLETED":
        text += f"(job {job} ended {state})\n"
    return state, text


def _wait(job: str, env: dict) -> str:
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        shown = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
        if fields.get("JobState") in slurmjobs.FINISHED_STATES:
            return fields["JobState"]
        time.sleep(0.1)
    subprocess.run(["scancel", job], env=env, capture_output=True, check=False)
    return "TIMEOUT"


if __name__ == "__main__":
    demo_dir = Path(os.environ.get("HPCSTACK_DEMO_DIR") or checkout.REPO / "demo").absolute()
    raise SystemExit(run(stackenv.find_lmod(), demo_dir).status)
