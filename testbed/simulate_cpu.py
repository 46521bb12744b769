"""Run a command on this machine as if its CPU were another: a cpuinfo dump bound over /proc/cpuinfo.

    .venv/bin/python testbed/simulate_cpu.py -- make test            # the other vendor's CPU
    .venv/bin/python testbed/simulate_cpu.py --as x86_64/amd/zen4 -- .venv/bin/python -m pytest ...

The command runs in a private mount namespace (``unshare --mount``, so root) in which
``/proc/cpuinfo`` is one of ``testbed/eessi_like/cpuinfo/``; everything it starts, Slurm's daemons
and their jobs included, reads that CPU, and nothing outside the namespace sees a change. Without
``--as`` the CPU is one of another vendor than this machine's (an AMD one on an Intel host, an
Intel one on an AMD host), chosen the way the tests choose "a target this node cannot use".
``make test`` runs its host-dependent tests a second time this way (the ``other-cpu`` gate).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import eessilike

# The CPUs a host may be simulated as when none is named: one per vendor and machine type.
OTHER_VENDOR_HOSTS = (
    "x86_64/amd/zen3",
    "x86_64/intel/icelake",
    "aarch64/a64fx",
    "aarch64/neoverse_v1",
    "riscv64/sifive/p550",
    "riscv64/spacemit/x60",
)
PROC_CPUINFO = "/proc/cpuinfo"


def other_vendor(compatible: tuple) -> str:
    """A CPU of this machine's type whose targets this machine's CPU cannot use."""
    machine = compatible[0].split("/", 1)[0]
    return eessilike.target_elsewhere(
        compatible, [target for target in OTHER_VENDOR_HOSTS if target.startswith(machine + "/")]
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="simulate_cpu.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--as", dest="target", help="the CPU target to simulate (default: another vendor's)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given (put it after --)")
    return args


def _inside(target: str, command: list[str]) -> int:
    """In the new mount namespace: bind the dump, check archdetect sees it, run the command."""
    dump = eessilike.CPUINFO_DIR / eessilike.CPUINFO_FIXTURES[target]
    subprocess.run(["mount", "--bind", str(dump), PROC_CPUINFO], check=True)
    seen = eessilike.cpupath()[0]
    if seen != target:
        sys.stderr.write(f"simulate_cpu: archdetect sees {seen} with {dump} bound, not {target}\n")
        return 2
    sys.stdout.write(f"simulate_cpu: this machine's CPU is simulated as {target} ({dump.name})\n")
    sys.stdout.flush()
    os.execvp(command[0], command)  # noqa: S606 - the command line the caller gave, as it is
    return 127  # not reached: execvp raises if it cannot run the command


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.inside:
        return _inside(args.target, args.command)
    real = eessilike.cpupath()
    target = args.target or other_vendor(real)
    if target not in eessilike.CPUINFO_FIXTURES:
        sys.stderr.write(
            f"simulate_cpu: no cpuinfo dump for {target}; known: {' '.join(eessilike.CPUINFO_FIXTURES)}\n"
        )
        return 2
    if target.split("/", 1)[0] != real[0].split("/", 1)[0]:
        sys.stderr.write(f"simulate_cpu: {target} is not of this machine's type ({real[0]})\n")
        return 2
    if os.geteuid() != 0:
        sys.stderr.write("simulate_cpu: binding over /proc/cpuinfo needs root (unshare --mount)\n")
        return 2
    unshare = shutil.which("unshare") or "unshare"
    inner = [sys.executable, str(Path(__file__).resolve()), "--inside", "--as", target, "--", *args.command]
    return subprocess.run(
        [unshare, "--mount", "--propagation", "private", "--", *inner], check=False
    ).returncode


if __name__ == "__main__":
    raise SystemExit(main())
