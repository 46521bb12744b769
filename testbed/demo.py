"""`make demo`: a small live EasyBuild tree under ./demo, and the site the how-tos run on.

Real EasyBuild (from .venv) builds TinyApp 1.0 and its dependency TinyLib 1.0, offline,
into ./demo (software/ and modules/all/, as on a cluster); real Lmod then lists and loads
them. Then eessi-arch-guard repairs a job that inherited EESSI's environment for another
CPU (testbed/demo_guard.py), on a single-node Slurm that stays up. Last, demo/demo.env is
written (testbed/demo_site.py): with it, the how-tos of docs/howto/ run against this tree,
this Slurm and the two commands. A second run finds both packages installed and EasyBuild
skips them. HPCSTACK_DEMO_DIR puts the tree elsewhere (the tests do).

`testbed/demo.py stop` (`make demo-stop`) stops the demo's Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

# Run as a script, only testbed/ is on sys.path: tools/checkout.py, the checkout's files and
# import names, sits with the tools that build and check the project.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tools"))

import checkout
import demo_guard
import demo_site
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
    guard = demo_guard.run(lmod, DEMO)
    variables = site_variables(env, guard)
    demo_site.install_commands(DEMO)
    env_file = demo_site.write_env_file(DEMO, variables, lmod.init)
    say(f"the demo site's environment is in {env_file}; the how-tos in docs/howto/ start with:")
    print(f"   . {env_file}")
    if guard.slurm_conf is not None:
        say("its single-node Slurm keeps running for them; make demo-stop stops it")
    return guard.status


def site_variables(env: dict, guard: demo_guard.Outcome) -> dict:
    """What demo.env exports: the EasyBuild configuration the tree was built with, the
    commands, the collection for Ansible, Slurm and the EESSI-like stack."""
    ansible = DEMO / ".ansible"
    collections = ansible / "collections"
    if not (collections / "ansible_collections" / "hpcstack" / "ops").exists():
        checkout.link_collection(collections)
    variables = {
        name: value
        for name, value in env.items()
        if name.startswith(("EASYBUILD_", "LMOD_")) or name in ("EB_PYTHON", "MODULEPATH")
    }
    variables.update(
        {
            "DEMO": str(DEMO),
            "PATH": f"{DEMO / 'bin'}:{stackenv.find_eb().parent}",
            "EB_STAGED_REBUILD_STATE_ROOT": str(STATE),
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_HOME": str(ansible / "home"),
            "DEMO_EESSI": str(guard.prefix.root),
        }
    )
    wheels = Path(sys.executable).parent.parent / "wheelhouse"
    if (wheels / ".complete").is_file():
        # EasyBuild's wheels, built by tools/bootstrap.sh: the build_host role of the how-to
        # installs from them, as a site without a route to PyPI does.
        variables["DEMO_WHEELS"] = str(wheels)
    if guard.slurm_conf is not None:
        variables["SLURM_CONF"] = str(guard.slurm_conf)
    if guard.here is not None:
        variables["DEMO_CPU_TARGET"] = guard.here
        variables["DEMO_OTHER_TARGET"] = guard.other
    return variables


def show_app(module_shell) -> bool:
    ran = module_shell(f"module load {tinypkgs.APP} && tinyapp")
    say(f"module load {tinypkgs.APP} && tinyapp: " + (ran.stdout.strip() or ran.stderr.strip()))
    return ran.returncode == 0


def stop() -> int:
    stopped = demo_site.stop_slurm(DEMO)
    if stopped is None:
        say("no Slurm of this demo is running")
        return 0
    say("the demo's Slurm daemons are stopped" if stopped.returncode == 0 else stopped.stderr.strip())
    return 0 if stopped.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(stop() if sys.argv[1:] == ["stop"] else main())
