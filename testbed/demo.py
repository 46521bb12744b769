"""`make demo`: a small live EasyBuild tree under ./demo, rebuilt without breaking it.

Real EasyBuild (from .venv) builds TinyApp 1.0 and its dependency TinyLib 1.0, offline,
into ./demo (software/ and modules/all/, as on a cluster); real Lmod then lists and loads
them. Then eb-staged-rebuild rebuilds TinyApp beside the live tree with real EasyBuild,
swaps it in, rolls it back and collects the retired tree, with Lmod loading the module at
every stage, and does the same again through the collection's playbooks
(testbed/demo_ansible.py). Last, eessi-arch-guard repairs a job that inherited EESSI's
environment for another CPU (testbed/demo_guard.py). A second run finds both installed and
EasyBuild skips them. HPCSTACK_DEMO_DIR puts the tree elsewhere (the tests do).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

# Run as a script, only testbed/ is on sys.path: tools/checkout.py, the checkout's files and
# import names, sits with the tools that build and check the project.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tools"))

import checkout
import demo_ansible
import demo_guard
import stackenv
import tinypkgs

DEMO = Path(os.environ.get("HPCSTACK_DEMO_DIR") or checkout.REPO / "demo").absolute()
STATE = DEMO / ".eb-staged-rebuild"
# The EasyBuild lines worth showing a reader: what it works on and how each ends.
_EB_PROGRESS = re.compile(
    r"^== (processing|building|testing|COMPLETED|.*already installed)|^== Build succeeded"
)


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def build(env: dict, easyconfig) -> bool:
    with subprocess.Popen(
        ["eb", "--robot", str(easyconfig)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        output = []
        for line in proc.stdout:
            output.append(line)
            if _EB_PROGRESS.match(line):
                print("   " + line.rstrip(), flush=True)
    if proc.returncode != 0:
        sys.stdout.write("".join(output[-30:]))
    return proc.returncode == 0


def main() -> int:
    try:
        lmod = stackenv.find_lmod()
    except stackenv.StackError as err:
        say(str(err))
        return 1
    modules = DEMO / "modules" / "all"
    packages = tinypkgs.write_packages(DEMO / ".tinypkgs")
    env = stackenv.easybuild_env(
        lmod,
        prefix=DEMO / ".easybuild",
        installpath=DEMO,
        sources=packages.sources,
        easyconfigs=packages.easyconfigs,
    )
    version = metadata.version("easybuild-framework")
    app, lib = f"{tinypkgs.APP} {tinypkgs.VERSION}", f"{tinypkgs.LIB} {tinypkgs.VERSION}"
    say(f"building {app} and its dependency {lib} with EasyBuild {version}")
    say(f"live tree: {DEMO} (software/ and modules/all/)")
    started = time.monotonic()
    if not build(env, packages.easyconfig(tinypkgs.APP)):
        say(f"EasyBuild failed; its logs are under {DEMO / '.easybuild'}")
        return 1
    say(f"EasyBuild finished in {time.monotonic() - started:.1f} s")

    def module_shell(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            lmod.shell_command(script), env=lmod.env([modules]), capture_output=True, text=True, check=False
        )

    say(f"module avail, with MODULEPATH={modules}:")
    shown = module_shell("module --quiet avail 2>&1")
    print(shown.stdout.rstrip())
    if not show_app(module_shell):
        return 1
    return (
        staged_rebuild(env, module_shell)
        or demo_ansible.run(env, DEMO, STATE, packages.easyconfig(tinypkgs.APP))
        or demo_guard.run(lmod, DEMO)
    )


def show_app(module_shell) -> bool:
    ran = module_shell(f"module load {tinypkgs.APP} && tinyapp")
    say(f"module load {tinypkgs.APP} && tinyapp: " + (ran.stdout.strip() or ran.stderr.strip()))
    return ran.returncode == 0


def staged_rebuild(env: dict, module_shell) -> int:
    """Rebuild TinyApp through eb-staged-rebuild, roll it back, collect the old tree; each
    command's own output is shown as it prints it for a person."""
    with tempfile.TemporaryDirectory(prefix="hpcstack-demo-") as tmp:
        tool_env = dict(env, PYTHONPATH=str(checkout.link_package(Path(tmp))))

        def tool(*args: str) -> bool:
            done = subprocess.run(
                [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli", "--state-root", str(STATE), *args],
                env=tool_env,
                capture_output=True,
                text=True,
                check=False,
            )
            shown = done.stdout + "".join(
                line + "\n" for line in done.stderr.splitlines() if not line.startswith("== ")
            )
            sys.stdout.write("".join("   " + line + "\n" for line in shown.splitlines()))
            return done.returncode == 0

        module = f"{tinypkgs.APP}/{tinypkgs.VERSION}"
        # Each demo run is a run of its own: the journal of an earlier one stays under STATE.
        run_id = "demo-" + time.strftime("%Y%m%dT%H%M%S")
        say(f"eb-staged-rebuild probe --path {DEMO / 'software'}: what this filesystem and host can do")
        if not tool("probe", f"--path={DEMO / 'software'}"):
            return 1
        say(f"eb-staged-rebuild rebuild --module {module}: EasyBuild builds beside the live tree, sandboxed")
        rebuilt = tool(
            "rebuild",
            f"--installpath={DEMO}",
            f"--module={module}",
            f"--eb={stackenv.find_eb()}",
            f"--run-id={run_id}",
            "--",
            f"{tinypkgs.APP}-{tinypkgs.VERSION}.eb",
        )
        if not rebuilt or not show_app(module_shell):
            return 1
        say(f"eb-staged-rebuild rollback {run_id}: the previous tree goes back in one exchange")
        if not tool("rollback", run_id):
            return 1
        say("eb-staged-rebuild gc --grace-hours 0 --no-squeue: no job can hold the old tree here, so it goes")
        if not tool("gc", "--grace-hours", "0", "--no-squeue"):
            return 1
        return 0 if show_app(module_shell) else 1


if __name__ == "__main__":
    raise SystemExit(main())
