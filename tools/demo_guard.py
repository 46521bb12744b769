"""The guard's part of `make demo`: a job that inherited EESSI for the wrong CPU, repaired.

An EESSI-like prefix (tools/eessilike.py) is built under <demo>/eessi. A user logs in on a
zen3 node and loads EESSI with two modules; the job lands on an icelake node with a GPU.
Without the guard its programs are the zen3 builds. The job script then runs
`eval "$(eessi-arch-guard --shell)"`, and the same commands are the icelake builds; as the
TaskProlog, the guard's directives are shown too. Nodes are simulated by the variables
EESSI's archdetect reads, so one machine plays both.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import checkout
import eessilike
import stackenv

LOGIN = ("x86_64/amd/zen3", None)
COMPUTE = ("x86_64/intel/icelake", "accel/nvidia/cc80")
# The user modules' commands print the CPU target they were built for.
SHOW = 'echo "EESSI_SOFTWARE_SUBDIR=$EESSI_SOFTWARE_SUBDIR"; echo "usera runs the build for $(usera)"'


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def show(ran: eessilike.ShellRun) -> None:
    for line in ran.stderr.splitlines():
        print("   " + line, flush=True)


def run(lmod: stackenv.Lmod, demo: Path) -> int:
    root = demo / "eessi"
    shutil.rmtree(root, ignore_errors=True)
    prefix = eessilike.build_prefix(root)
    say(f"an EESSI-like stack with {len(prefix.targets)} CPU targets: {prefix.prefix}")
    modules = " ".join(eessilike.default_modules(prefix))
    say(f"a user logs in on a {LOGIN[0]} node and runs: module load {modules}")
    login = eessilike.login_environment(lmod, prefix, prefix.node_env(*LOGIN))
    job = dict(login, **prefix.node_env(*COMPUTE))
    say(f"the job runs on a {COMPUTE[0]} node with a GPU; without the guard it gets:")
    show(eessilike.run_shell(lmod, job, SHOW))

    with tempfile.TemporaryDirectory(prefix="hpcstack-demo-") as tmp:
        package = checkout.link_package(Path(tmp))
        guard = [sys.executable, "-IS", "-c", _launcher(package)]
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


def _launcher(package: Path) -> str:
    return (
        f"import sys; sys.path.insert(0, {os.fspath(package)!r}); "
        "from hpcstack_ops.arch_guard.cli import main; raise SystemExit(main())"
    )


if __name__ == "__main__":
    demo_dir = Path(os.environ.get("HPCSTACK_DEMO_DIR") or checkout.REPO / "demo").absolute()
    raise SystemExit(run(stackenv.find_lmod(), demo_dir))
