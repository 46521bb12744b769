"""`make demo`: build a small live EasyBuild tree under ./demo and show its modules.

Real EasyBuild (from .venv) builds TinyApp 1.0 and its dependency TinyLib 1.0, offline,
into ./demo (software/ and modules/all/, as on a cluster); real Lmod then lists and loads
them. A second run finds both installed and EasyBuild skips them. HPCSTACK_DEMO_DIR puts
the tree elsewhere (the tests do).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import checkout
import stackenv
import tinypkgs

DEMO = Path(os.environ.get("HPCSTACK_DEMO_DIR") or checkout.REPO / "demo").absolute()
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
    say(f"module load {tinypkgs.APP} && tinyapp:")
    ran = module_shell(f"module load {tinypkgs.APP} && tinyapp")
    print("   " + (ran.stdout.strip() or ran.stderr.strip()))
    return 0 if shown.returncode == 0 and ran.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
