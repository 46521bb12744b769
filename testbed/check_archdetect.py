"""Compare our archdetect stand-in with EESSI's own archdetect test data.

    .venv/bin/python testbed/check_archdetect.py DATA_DIR [--real-init INIT_DIR]

DATA_DIR is a copy of EESSI's ``tests/archdetect`` from its software-layer-scripts
repository, kept outside this repository (its licence, GPL-2.0, keeps it out of ours). For every
``<machine>/**/<Name>.cpuinfo`` of x86_64, aarch64 and riscv64 the stand-in runs with
``EESSI_PROC_CPUINFO=<Name>.cpuinfo EESSI_MACHINE_TYPE=<machine>``; ``cpupath`` must print
``<Name>.output`` and ``-a cpupath`` ``<Name>.all.output`` (trailing whitespace ignored).
For ``nvidia-smi/<case>.output`` our fake nvidia-smi plays the GPUs the case names and
``accelpath || echo "non-zero exit code: $?"`` must print the file. One line per case, then
``N/M agree``; exit status 0 only when all agree.

With ``--real-init INIT_DIR`` (EESSI's own ``init/``, with ``eessi_archdetect.sh`` and its
``arch_specs/``, also kept outside this repository) it checks our own cpuinfo fixtures the
other way round: EESSI's real archdetect, run on each of ``testbed/eessi_like/cpuinfo/``, must
answer ``-a cpupath`` as the stand-in does, starting with the target the fixture is named for
(``eessilike.CPUINFO_FIXTURES``): the fixtures are the CPUs they claim to be.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import eessilike

MACHINES = ("x86_64", "aarch64", "riscv64")
# EESSI's GPU cases by name: the compute capabilities of the GPUs their fake nvidia-smi
# reports; "" = the driver sees no GPU; None = no nvidia-smi on PATH.
NVIDIA_CASES = {
    "1xa100": "8.0",
    "2xa100": "8.0,8.0",
    "4xa100": "8.0,8.0,8.0,8.0",
    "cc01": "0.1",
    "no_devices": "",
    "none": None,
}
BASE_PATH = "/usr/bin:/bin"


def cpu_cases(data: Path):
    """(machine, cpuinfo) for every cpuinfo dump of a machine the stand-in supports."""
    for machine in MACHINES:
        for cpuinfo in sorted((data / machine).rglob("*.cpuinfo")):
            yield machine, cpuinfo


def check_cpu(data: Path, machine: str, cpuinfo: Path) -> list:
    """[(label, agrees, got, expected)] for ``cpupath`` and ``-a cpupath`` of one dump."""
    env = eessilike.archdetect_env(
        {"EESSI_PROC_CPUINFO": str(cpuinfo), "EESSI_MACHINE_TYPE": machine}, path=BASE_PATH
    )
    stem = cpuinfo.with_suffix("")
    label = str(stem.relative_to(data))
    results = []
    for args, suffix in ((("cpupath",), ".output"), (("-a", "cpupath"), ".all.output")):
        expected_file = stem.with_name(stem.name + suffix)
        expected = expected_file.read_text().rstrip() if expected_file.is_file() else "<no expected file>"
        ran = eessilike.run_archdetect(env, *args)
        got = ran.stdout.rstrip() if ran.returncode == 0 else f"exit {ran.returncode}: {ran.stderr.strip()}"
        results.append((f"{label} {' '.join(args)}", got == expected, got, expected))
    return results


def check_nvidia(data: Path, fake_bin: Path) -> list:
    results = []
    for expected_file in sorted((data / "nvidia-smi").glob("*.output")):
        case = expected_file.name[: -len(".output")]
        label = f"nvidia-smi/{case} accelpath"
        if case not in NVIDIA_CASES:
            results.append((label, None, "", "no fake nvidia-smi setting for this case"))
            continue
        caps = NVIDIA_CASES[case]
        path = BASE_PATH if caps is None else f"{fake_bin}:{BASE_PATH}"
        env = eessilike.archdetect_env({}, path=path, **{eessilike.GPU_VARIABLE: caps or ""})
        ran = eessilike.run_archdetect(env, "accelpath")
        got = ran.stdout + (f"non-zero exit code: {ran.returncode}\n" if ran.returncode else "")
        expected = expected_file.read_text().rstrip()
        results.append((label, got.rstrip() == expected, got.rstrip(), expected))
    return results


def check_fixtures(real_init: Path) -> list:
    """[(label, agrees, got, expected)]: EESSI's real ``-a cpupath`` on each of our fixtures
    against the stand-in's, whose first target must be the one the fixture is named for."""
    results = []
    for target, name in eessilike.CPUINFO_FIXTURES.items():
        env = eessilike.archdetect_env(eessilike.node_env(target), path=BASE_PATH)
        real = eessilike.run_archdetect(env, "-a", "cpupath", script=real_init / "eessi_archdetect.sh")
        ours = eessilike.run_archdetect(env, "-a", "cpupath")
        got = (
            real.stdout.strip() if real.returncode == 0 else f"exit {real.returncode}: {real.stderr.strip()}"
        )
        expected = ours.stdout.strip()
        agrees = got == expected and expected.split(":")[0] == target
        results.append((f"fixture {name} -a cpupath (EESSI's archdetect)", agrees, got, expected))
    return results


def main(argv: list) -> int:
    real_init = None
    if len(argv) == 3 and argv[1] == "--real-init":
        real_init = Path(argv[2])
        argv = argv[:1]
    if len(argv) != 1:
        print("usage: check_archdetect.py DATA_DIR [--real-init INIT_DIR]", file=sys.stderr)
        return 2
    data = Path(argv[0])
    if not data.is_dir():
        print(f"check_archdetect: {data} is not a directory", file=sys.stderr)
        return 2
    results = []
    for machine, cpuinfo in cpu_cases(data):
        results.extend(check_cpu(data, machine, cpuinfo))
    if (data / "nvidia-smi").is_dir():
        with tempfile.TemporaryDirectory(prefix="check-archdetect-") as tmp:
            results.extend(check_nvidia(data, eessilike.copy_fake_nvidia_smi(Path(tmp))))
    if real_init is not None:
        results.extend(check_fixtures(real_init))
    compared = [result for result in results if result[1] is not None]
    for label, agrees, got, expected in results:
        if agrees is None:
            print(f"skip  {label}: {expected}")
        elif agrees:
            print(f"ok    {label}: {got}")
        else:
            print(f"DIFF  {label}: got {got!r}, expected {expected!r}")
    agreeing = sum(1 for result in compared if result[1])
    print(f"{agreeing}/{len(compared)} agree")
    return 0 if compared and agreeing == len(compared) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
