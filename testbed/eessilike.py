"""An EESSI-like software prefix, built at test time, and the shells that use it.

eessi-arch-guard repairs jobs that inherited EESSI's environment from a node with another
CPU. Testing that needs what EESSI is made of, run for real: an archdetect script
(``testbed/eessi_like/eessi_archdetect.sh``, our stand-in with our own CPU tables), the EESSI
module that runs it through Lmod's ``source_sh`` (``testbed/eessi_like/EESSI.lua``; Lmod keeps
the detection in its module table, so an environment carried to another node keeps the
first node's answer until EESSI is unloaded and loaded again), and a software tree per CPU
target whose modules say which target they were built for.

Nodes are simulated, not booted: a node is the set of variables archdetect reads
(``node_env``): ``EESSI_PROC_CPUINFO`` pointing at one of our cpuinfo fixtures,
``EESSI_MACHINE_TYPE``, and ``EESSI_LIKE_GPU_COMPUTE_CAP`` for the fake ``nvidia-smi`` that
every node has on ``PATH`` (so ``PATH`` is the same on all nodes, as on a real cluster).

Layout written by ``build_prefix(root)`` (version 2023.06)::

    <root>/node-bin/nvidia-smi                      fake nvidia-smi, on every node's PATH
    <root>/node-cpuinfo/*.cpuinfo                   copies of our cpuinfo fixtures
    <root>/init/modules/EESSI/2023.06.lua           the EESSI module (module_dir = <root>/init/modules)
    <root>/init/lmod/bash                           EESSI as Lmod's default module (init_lmod_bash.sh)
    <root>/versions/2023.06/                        EESSI_PREFIX
        init/eessi_archdetect.sh, init/arch_specs/{x86_64,aarch64}
        init/bash                                   EESSI without its module (init_bash.sh)
        init/lmod_eessi_archdetect_wrapper.sh, init/lmod_eessi_archdetect_wrapper_accel.sh
        compat/linux/<family>/                      EPREFIX: programs and Lmod (eessicompat.py)
        software/linux/<target>/software/<Name>/<ver>/bin/<cmd>
        software/linux/<target>/modules/all/<Name>/<ver>.lua
        software/linux/<target>/.lmod/SitePackage.lua    the GPU module's driver hook (LMOD_PACKAGE_PATH)
        software/linux/<target>/.lmod/lmodrc.lua         Lmod's settings for the target (LMOD_RC)
        scripts/gpu_support/nvidia/get_cuda_driver_version.sh   what the hook sources
        software/linux/<target>/accel/nvidia/cc80/{software,modules/all}   GpuKit/1.0

Imported by the integration tests and by ``testbed/demo.py``; ``testbed/check_archdetect.py``
compares the stand-in with EESSI's own test data.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping

import eessicompat
import stackenv

HERE = Path(__file__).resolve().parent / "eessi_like"
STANDIN = HERE / "eessi_archdetect.sh"
CPUINFO_DIR = HERE / "cpuinfo"
MODULE_FILE = HERE / "EESSI.lua"
SITE_PACKAGE = HERE / "SitePackage.lua"
LMODRC = HERE / "lmodrc.lua"
CUDA_DRIVER_SCRIPT = HERE / "get_cuda_driver_version.sh"
FAKE_NVIDIA_SMI = HERE / "nvidia-smi"
INIT_BASH = HERE / "init_bash.sh"
INIT_LMOD_BASH = HERE / "init_lmod_bash.sh"
_INIT_SCRIPTS = (
    "eessi_archdetect.sh",
    "lmod_eessi_archdetect_wrapper.sh",
    "lmod_eessi_archdetect_wrapper_accel.sh",
)

DEFAULT_VERSION = "2023.06"
DEFAULT_TARGETS = (
    "x86_64/intel/haswell",
    "x86_64/intel/icelake",
    "x86_64/amd/zen3",
    "aarch64/neoverse_n1",
    "aarch64/neoverse_v1",
)
DEFAULT_ACCEL = {"x86_64/intel/icelake": "accel/nvidia/cc80"}
# Name/version -> command: every CPU target gets these; GpuKit only the accelerator subtrees.
USER_MODULES = {"UserA/1.0": "usera", "UserB/2.0": "userb"}
GPU_MODULE = ("GpuKit/1.0", "gpukit")
GPU_VARIABLE = "EESSI_LIKE_GPU_COMPUTE_CAP"
# The CUDA version the fake nvidia-smi's driver reports (12.2 when unset).
CUDA_DRIVER_VARIABLE = "EESSI_LIKE_CUDA_DRIVER_VERSION"
# With this set, Lmod appends to that file the path of every SitePackage.lua and
# lmodrc.lua of the prefix that it reads (what LMOD_PACKAGE_PATH and LMOD_RC lead it to).
LMOD_READLOG_VARIABLE = "EESSI_LIKE_LMOD_READLOG"
# The variables that make a shell "a node" (node_env); without them archdetect reads the
# real machine.
NODE_VARIABLES = ("EESSI_PROC_CPUINFO", "EESSI_MACHINE_TYPE", GPU_VARIABLE, CUDA_DRIVER_VARIABLE)
# Variables of a node, not of a login: a clean base drops them whatever the caller had.
_NODE_PREFIXES = ("EESSI_", "EESSI_LIKE_")

# The CPU each fixture describes, named by the target the stand-in must answer for it.
CPUINFO_FIXTURES = {
    "x86_64/generic": "x86_64-generic-xeon-e5-2670.cpuinfo",
    "x86_64/intel/haswell": "x86_64-intel-haswell-xeon-e5-2690v3.cpuinfo",
    "x86_64/intel/skylake_avx512": "x86_64-intel-skylake_avx512-xeon-gold-6148.cpuinfo",
    "x86_64/intel/cascadelake": "x86_64-intel-cascadelake-xeon-gold-6248r.cpuinfo",
    "x86_64/intel/icelake": "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo",
    "x86_64/intel/sapphirerapids": "x86_64-intel-sapphirerapids-xeon-platinum-8480.cpuinfo",
    "x86_64/amd/zen2": "x86_64-amd-zen2-epyc-7742.cpuinfo",
    "x86_64/amd/zen3": "x86_64-amd-zen3-epyc-7763.cpuinfo",
    "x86_64/amd/zen4": "x86_64-amd-zen4-epyc-9554.cpuinfo",
    "x86_64/amd/zen5": "x86_64-amd-zen5-epyc-9755.cpuinfo",
    "aarch64/generic": "aarch64-generic-cortex-a72.cpuinfo",
    "aarch64/neoverse_n1": "aarch64-neoverse_n1-ampere-altra.cpuinfo",
    "aarch64/neoverse_v1": "aarch64-neoverse_v1-graviton3.cpuinfo",
    "aarch64/nvidia/grace": "aarch64-nvidia-grace.cpuinfo",
    "aarch64/google/axion": "aarch64-google-axion.cpuinfo",
    "aarch64/a64fx": "aarch64-a64fx.cpuinfo",
    "riscv64/generic": "riscv64-generic-starfive-jh7110.cpuinfo",
    "riscv64/sifive/p550": "riscv64-sifive-p550-eic7700x.cpuinfo",
    "riscv64/spacemit/x60": "riscv64-spacemit-x60-k1.cpuinfo",
}

MACHINES = ("x86_64", "aarch64", "riscv64")
_TARGET = re.compile(r"^(x86_64|aarch64|riscv64)(/[a-z0-9_]+)+$")
_ACCEL = re.compile(r"^accel/nvidia/cc([0-9]+)([0-9])$")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)+$")
SHELL_TIMEOUT = 120
# The shell of a job script (``#!/bin/bash``), by its path: not the one of a compatibility
# layer that the environment's PATH may name first, of another family on this node.
SYSTEM_BASH = shutil.which("bash", path="/usr/bin:/bin") or "/bin/bash"


class EessiLikeError(Exception):
    """The prefix cannot be built as asked, or a shell using it failed."""


def _lua_string(text: str) -> str:
    """``text`` as a Lua string literal (any bytes survive, newlines included)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def user_module_lua(name: str, root: Path) -> str:
    """A module file like EasyBuild's for ``name`` ("UserA/1.0") installed at ``root``."""
    package, version = name.split("/", 1)
    key = re.sub(r"[^A-Z0-9]", "", package.upper())
    return (
        f"help([[{package} {version}: prints the CPU target it was built for]])\n"
        f'whatis("Description: {package} {version} (EESSI-like test software)")\n'
        f"local root = {_lua_string(str(root))}\n"
        f'conflict("{package}")\n'
        f'prepend_path("PATH", pathJoin(root, "bin"))\n'
        f'setenv("EBROOT{key}", root)\n'
        f'setenv("EBVERSION{key}", "{version}")\n'
        # What the Lmod process that unloads it started with: the settings it read.
        f'if mode() == "unload" and (os.getenv("{LMOD_READLOG_VARIABLE}") or "") ~= "" then\n'
        f'    local log = io.open(os.getenv("{LMOD_READLOG_VARIABLE}"), "a")\n'
        f"    if log then\n"
        f'        log:write("unload {name} LMOD_RC=", os.getenv("LMOD_RC") or "", " LMOD_PACKAGE_PATH=",\n'
        f'                  os.getenv("LMOD_PACKAGE_PATH") or "", "\\n")\n'
        f"        log:close()\n"
        f"    end\n"
        f"end\n"
    )


@dataclass(frozen=True)
class EessiPrefix:
    """A built EESSI-like tree; see the module docstring for its layout.

    ``accel`` maps a CPU target to the accelerator subdirectory built under it
    (``{"x86_64/intel/icelake": "accel/nvidia/cc80"}``). ``module_dir`` is what
    ``module use`` needs for ``EESSI/<version>`` to load; ``gpu_bin`` holds the fake
    ``nvidia-smi`` that must be on ``PATH`` of every node. Frozen; ``accel`` is read-only.
    """

    root: Path
    prefix: Path
    version: str
    init_prefix: Path
    module_dir: Path
    archdetect: Path
    gpu_bin: Path
    targets: tuple
    accel: Mapping[str, str]
    families: tuple = MACHINES

    @property
    def module(self) -> str:
        """``EESSI/<version>``, the name to load."""
        return f"EESSI/{self.version}"

    @property
    def init_bash(self) -> Path:
        """EESSI's start without its module: ``source <EESSI_PREFIX>/init/bash``."""
        return self.prefix / "init" / "bash"

    @property
    def init_lmod_bash(self) -> Path:
        """EESSI's start as Lmod's default module: ``source <root>/init/lmod/bash``."""
        return self.root / "init" / "lmod" / "bash"

    @property
    def login_path(self) -> str:
        """``PATH`` of every node's login shell: the fake ``nvidia-smi`` and the system dirs."""
        return f"{self.gpu_bin}:/usr/local/bin:/usr/bin:/bin"

    def layer(self, family: str) -> eessicompat.Layer:
        """The compatibility layer of ``family`` (``EPREFIX`` on a node of it)."""
        return eessicompat.Layer(family, self.prefix / "compat" / "linux" / family)

    def software_subdir_path(self, target: str) -> Path:
        """``$EESSI_PREFIX/software/linux/<target>`` (EESSI_SOFTWARE_PATH once selected)."""
        return self.prefix / "software" / "linux" / target

    def module_path(self, target: str, accel: str | None = None) -> Path:
        """The ``modules/all`` the EESSI module puts on ``MODULEPATH`` for ``target`` (and ``accel``)."""
        base = self.software_subdir_path(target)
        return (base / accel if accel else base) / "modules" / "all"

    def write_module(self, target: str, name: str, lua_text: str, accel: str | None = None) -> Path:
        """Write module ``name`` ("Tool/1.0") for ``target`` (its accelerator subtree if
        ``accel``) with the Lua text given; returns the file. The target need not be built
        yet, so a test can also give a target its first module."""
        if not _MODULE_NAME.match(name) or ".." in name.split("/"):
            raise EessiLikeError(f"module name {name!r} is not <Name>/<version>")
        return _write(self.module_path(target, accel) / f"{name}.lua", lua_text)

    @property
    def cpuinfo_dir(self) -> Path:
        """The prefix's copy of our cpuinfo fixtures, readable wherever the prefix is (a
        test user may not be able to enter this checkout)."""
        return self.root / "node-cpuinfo"

    def node_env(self, target: str, accel: str | None = None) -> dict:
        """``node_env(target, accel)`` with the cpuinfo copies of this prefix."""
        return node_env(target, accel, cpuinfo_dir=self.cpuinfo_dir)


def node_env(target: str, accel: str | None = None, cpuinfo_dir: Path = CPUINFO_DIR) -> dict:
    """Variables that make archdetect on "this node" answer ``target`` and ``accel``.

    ``EESSI_PROC_CPUINFO`` is our fixture for that CPU (``CPUINFO_FIXTURES``),
    ``EESSI_MACHINE_TYPE`` its machine, and ``EESSI_LIKE_GPU_COMPUTE_CAP`` the compute
    capability the fake ``nvidia-smi`` reports ("8.0" for accel/nvidia/cc80; empty = no
    GPU, so a GPU-less node also clears a GPU node's value when its vars are applied over an
    inherited environment). ``PATH`` is not here: it is the same on every node
    (``EessiPrefix.login_path``).
    """
    name = CPUINFO_FIXTURES.get(target)
    if name is None:
        raise EessiLikeError(f"no cpuinfo fixture for {target} in {cpuinfo_dir}")
    cap = ""
    if accel:
        found = _ACCEL.match(accel)
        if not found:
            raise EessiLikeError(f"accelerator {accel!r} is not accel/nvidia/ccNN")
        cap = f"{int(found.group(1))}.{found.group(2)}"
    return {
        "EESSI_PROC_CPUINFO": str(cpuinfo_dir / name),
        "EESSI_MACHINE_TYPE": target.split("/", 1)[0],
        GPU_VARIABLE: cap,
    }


def _check_request(targets: tuple, accel: Mapping[str, str], omit: Mapping[str, Iterable[str]]) -> None:
    for target in targets:
        if not _TARGET.match(target):
            raise EessiLikeError(
                f"target {target!r} is not <machine>/<name>[/<name>] for x86_64, aarch64 or riscv64"
            )
    for cpu, sub in accel.items():
        if cpu not in targets:
            raise EessiLikeError(f"accelerator {sub} is given for {cpu}, which is not among the targets")
        if not _ACCEL.match(sub):
            raise EessiLikeError(f"accelerator {sub!r} for {cpu} is not accel/nvidia/ccNN")
    known = set(USER_MODULES) | {GPU_MODULE[0]}
    for target, names in omit.items():
        if target not in targets:
            raise EessiLikeError(f"omit names {target}, which is not among the targets")
        unknown = sorted(set(names) - known)
        if unknown:
            raise EessiLikeError(f"omit for {target} names unknown modules {unknown}; known: {sorted(known)}")


def _install_init(prefix: Path, root: Path, version: str) -> None:
    init = prefix / "init"
    for name in _INIT_SCRIPTS:
        _write(init / name, (HERE / name).read_text(), 0o755 if name == "eessi_archdetect.sh" else 0o644)
    for machine in MACHINES:
        _write(init / "arch_specs" / machine, (HERE / "arch_specs" / machine).read_text())
    _write(init / "bash", INIT_BASH.read_text())
    _write(root / "init" / "modules" / "EESSI" / f"{version}.lua", MODULE_FILE.read_text())
    lmod_init = root / "init" / "lmod" / "bash"
    if not lmod_init.exists():  # the first version built under a root is its default
        _write(lmod_init, INIT_LMOD_BASH.read_text().replace("@EESSI_VERSION_DEFAULT@", version))
    _write(root / "node-bin" / "nvidia-smi", FAKE_NVIDIA_SMI.read_text(), 0o755)
    _write(
        prefix / "scripts" / "gpu_support" / "nvidia" / CUDA_DRIVER_SCRIPT.name,
        CUDA_DRIVER_SCRIPT.read_text(),
    )
    for name in CPUINFO_FIXTURES.values():
        _write(root / "node-cpuinfo" / name, (CPUINFO_DIR / name).read_text())


def _install_package(software: Path, modules: Path, name: str, command: str, says: str) -> None:
    """One package: ``software/<name>/bin/<command>`` printing ``says``, and its module."""
    root = software / name
    _write(root / "bin" / command, f"#!/bin/sh\necho {shlex.quote(says)}\n", 0o755)
    _write(modules / f"{name}.lua", user_module_lua(name, root))


def install_lmod_settings(software_path: Path) -> None:
    """``<software_path>/.lmod/``: the SitePackage.lua and lmodrc.lua that EESSI's module
    points ``LMOD_PACKAGE_PATH`` and ``LMOD_RC`` at (for a CPU target, or a site's tree)."""
    _write(software_path / ".lmod" / SITE_PACKAGE.name, SITE_PACKAGE.read_text())
    _write(software_path / ".lmod" / LMODRC.name, LMODRC.read_text())


def _install_target(prefix: Path, target: str, accel: str | None, omit: set) -> None:
    base = prefix / "software" / "linux" / target
    install_lmod_settings(base)
    (base / "software").mkdir(parents=True, exist_ok=True)
    (base / "modules" / "all").mkdir(parents=True, exist_ok=True)
    for name, command in USER_MODULES.items():
        if name not in omit:
            _install_package(base / "software", base / "modules" / "all", name, command, target)
    if accel:
        sub = base / accel
        (sub / "software").mkdir(parents=True, exist_ok=True)
        (sub / "modules" / "all").mkdir(parents=True, exist_ok=True)
        name, command = GPU_MODULE
        if name not in omit:
            _install_package(sub / "software", sub / "modules" / "all", name, command, f"{target} {accel}")


def build_prefix(
    root: Path,
    targets: Iterable[str] = DEFAULT_TARGETS,
    accel: Mapping[str, str] | None = None,
    version: str = DEFAULT_VERSION,
    omit: Mapping[str, Iterable[str]] | None = None,
    *,
    families: Iterable[str] = MACHINES,
    lmod: stackenv.Lmod | None = None,
) -> EessiPrefix:
    """Write an EESSI-like stack for ``version`` under ``root`` and return its description.

    Every target in ``targets`` gets ``UserA/1.0`` and ``UserB/2.0`` (command ``usera`` /
    ``userb`` prints the target); ``accel`` (default: icelake with accel/nvidia/cc80) adds
    the accelerator subtree with ``GpuKit/1.0`` (``gpukit`` prints "<target> <accel>");
    ``omit`` drops modules from targets (``{"x86_64/amd/zen3": ["UserB/2.0"]}``).
    ``families`` get a compatibility layer each, with a copy of ``lmod`` (default: this
    machine's) as EESSI's own Lmod (``testbed/eessicompat.py``). Several versions may share
    a root; building a version twice raises ``EessiLikeError``.
    """
    root = Path(root).absolute()
    targets = tuple(targets)
    accel = dict(DEFAULT_ACCEL if accel is None else accel)
    omit = {target: set(names) for target, names in (omit or {}).items()}
    _check_request(targets, accel, omit)
    prefix = root / "versions" / version
    if prefix.exists():
        raise EessiLikeError(f"EESSI-like prefix {prefix} exists already")
    _install_init(prefix, root, version)
    lmod = lmod or stackenv.find_lmod()
    families = tuple(families)
    for family in families:
        eessicompat.build_layer(prefix, family, lmod)
    for target in targets:
        _install_target(prefix, target, accel.get(target), omit.get(target, set()))
    return EessiPrefix(
        root=root,
        prefix=prefix,
        version=version,
        init_prefix=prefix / "init",
        module_dir=root / "init" / "modules",
        archdetect=prefix / "init" / "eessi_archdetect.sh",
        gpu_bin=root / "node-bin",
        targets=targets,
        accel=MappingProxyType(accel),
        families=tuple(families),
    )


# ---------------------------------------------------------------------------- shells


@dataclass(frozen=True)
class ShellRun:
    """A bash script's end: its status, its stderr, the environment it exported at the end
    (also after a failure), and what it printed on stdout (sent to ``stderr`` here, so
    stdout carries only the environment)."""

    returncode: int
    env: dict
    stderr: str


# EESSI's own archdetect test data (GPL-2.0, so never in this repository): real /proc/cpuinfo
# dumps, read where they lie, ``HPCSTACK_EESSI_ARCHDETECT_DATA`` or ``shared/data/archdetect``
# beside the checkout or one of its parents. The dump of each CPU the cross-family tests put
# a node on.
EESSI_DATA_VARIABLE = "HPCSTACK_EESSI_ARCHDETECT_DATA"
_EESSI_DATA_BESIDE = Path("shared", "data", "archdetect")
EESSI_DUMPS = {
    "x86_64/amd/zen3": "x86_64/amd/zen3/Azure-CentOS7-7V73X.cpuinfo",
    "x86_64/intel/icelake": "x86_64/intel/icelake/AWS-Rocky8-8375C.cpuinfo",
    "aarch64/neoverse_v1": "aarch64/neoverse_v1/AWS-awslinux-graviton3.cpuinfo",
    "aarch64/nvidia/grace": "aarch64/nvidia/grace/Jureca-Rocky95.cpuinfo",
    "riscv64/sifive/p550": "riscv64/sifive/premier-Ubuntu24.cpuinfo",
}


def eessi_data_dir() -> Path | None:
    """Where EESSI's archdetect test data lies, or None when it is not on this machine."""
    if os.environ.get(EESSI_DATA_VARIABLE):
        candidates = [Path(os.environ[EESSI_DATA_VARIABLE])]
    else:
        candidates = [parent / _EESSI_DATA_BESIDE for parent in HERE.parents[1:]]
    return next((data for data in candidates if data.is_dir()), None)


def real_node_env(target: str) -> dict:
    """``node_env(target)`` with EESSI's real dump of that CPU (``EESSI_DUMPS``) as
    ``EESSI_PROC_CPUINFO``; without EESSI's data on this machine, our own fixture of the
    same CPU (``testbed/check_archdetect.py --real-init`` holds the two to the same answer)."""
    env = node_env(target)
    data = eessi_data_dir()
    if data is not None and target in EESSI_DUMPS:
        env["EESSI_PROC_CPUINFO"] = str(data / EESSI_DUMPS[target])
    return env


def parse_env0(data: bytes) -> dict:
    """``env -0`` output as a dict; names and values decoded with ``os.fsdecode``. An entry
    without ``=`` (possible in a raw environment block) is no variable and is skipped."""
    env = {}
    for entry in data.split(b"\0"):
        if b"=" in entry:
            name, value = entry.split(b"=", 1)
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def run_shell(
    lmod: stackenv.Lmod,
    env: Mapping[str, str],
    script: str,
    timeout: int = SHELL_TIMEOUT,
    *,
    lmod_init: bool = True,
) -> ShellRun:
    """Run ``script`` in ``bash`` with ``module`` defined, starting from exactly ``env``.

    The script's own stdout goes to stderr; the exported environment at its end is read
    with ``env -0`` (it includes what bash itself exports: ``PWD``, ``SHLVL``, ``_``).
    ``lmod_init=False`` runs it as a job script does, with the ``module`` function and the
    ``LMOD_CMD`` it inherited, without sourcing this machine's Lmod first.
    """
    init = f". {shlex.quote(str(lmod.init))} || exit 97\n" if lmod_init else ""
    command = f"exec 3>&1 1>&2; {init}{{\n{script}\n}}\nstatus=$?; /usr/bin/env -0 >&3; exit $status"
    done = subprocess.run(
        [SYSTEM_BASH, "--noprofile", "--norc", "-c", command],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return ShellRun(done.returncode, parse_env0(done.stdout), os.fsdecode(done.stderr))


def login_base(prefix: EessiPrefix, lmod: stackenv.Lmod, base: Mapping[str, str] | None = None) -> dict:
    """A fresh login's environment, before any ``module`` command and before node variables.

    ``base=None`` starts from a few variables of this process (HOME, USER, LOGNAME, LANG,
    TMPDIR); a given ``base`` is kept. Either way module state and the variables of a node
    (``EESSI_*``) are dropped, ``MODULEPATH`` is empty and ``PATH`` is ``prefix.login_path``
    (with ``base``: the fake nvidia-smi's dir put first, the rest kept).
    """
    if base is None:
        env = {
            name: os.environ[name]
            for name in ("HOME", "USER", "LOGNAME", "LANG", "TMPDIR")
            if name in os.environ
        }
        env["PATH"] = prefix.login_path
    else:
        env = dict(base)
        rest = [part for part in env.get("PATH", "").split(":") if part and part != str(prefix.gpu_bin)]
        env["PATH"] = ":".join([str(prefix.gpu_bin), *rest])
    env = lmod.env((), base=env)
    for name in list(env):
        if name.startswith(_NODE_PREFIXES):
            del env[name]
    return env


def default_modules(prefix: EessiPrefix) -> tuple:
    """What a user's login loads: the EESSI module, then both user modules."""
    return (prefix.module, *USER_MODULES)


def load_script(prefix: EessiPrefix, modules: Iterable[str]) -> str:
    """``module use <module_dir>`` and one ``module load`` per module, stopping at a failure."""
    lines = [f"module use {shlex.quote(str(prefix.module_dir))}"]
    lines += [f"module load {shlex.quote(name)}" for name in modules]
    return " &&\n".join(lines)


def login_environment(
    lmod: stackenv.Lmod,
    prefix: EessiPrefix,
    node_vars: Mapping[str, str],
    modules: Iterable[str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict:
    """The environment a user's login shell exports on the node ``node_vars`` describes,
    after ``module use <module_dir>`` and ``module load`` of ``modules`` (default
    ``EESSI/<version> UserA/1.0 UserB/2.0``) from a clean ``login_base``. Real bash, real Lmod;
    a failing load raises ``EessiLikeError`` with Lmod's message."""
    modules = default_modules(prefix) if modules is None else tuple(modules)
    env = login_base(prefix, lmod, base)
    env.update(node_vars)
    ran = run_shell(lmod, env, load_script(prefix, modules))
    if ran.returncode != 0:
        message = " ".join(ran.stderr.split())
        raise EessiLikeError(f"module load {' '.join(modules)} failed (exit {ran.returncode}): {message}")
    return ran.env


# What loading modules from scratch on another node gives, the environment a repaired job
# should end up with, IS a login on that node: the name says what a test compares against.
fresh_load = login_environment


def job_shell(
    lmod: stackenv.Lmod, inherited: Mapping[str, str], node_vars: Mapping[str, str], script: str
) -> ShellRun:
    """Run ``script`` as a job on another node does: from the ``inherited`` environment
    (module state included) with that node's ``node_vars`` applied on top."""
    env = dict(inherited)
    env.update(node_vars)
    return run_shell(lmod, env, script)


def archdetect_env(node_vars: Mapping[str, str], path: str = "/usr/bin:/bin", **extra: str) -> dict:
    """A minimal environment for running archdetect directly: ``PATH``, ``node_vars`` and
    ``extra`` (e.g. ``EESSI_SOFTWARE_SUBDIR_OVERRIDE``). Put ``prefix.gpu_bin`` on ``path``
    for the fake nvidia-smi."""
    env = {"PATH": path, "LANG": "C"}
    env.update(node_vars)
    env.update(extra)
    return env


def run_archdetect(env: Mapping[str, str], *args: str, script: Path = STANDIN) -> subprocess.CompletedProcess:
    """Run archdetect ``script`` (default: our stand-in, ``STANDIN``) with ``args`` in exactly ``env``."""
    return subprocess.run(
        ["bash", str(script), *args],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT,
        check=False,
    )


def cpupath(node_vars: Mapping[str, str] | None = None) -> tuple:
    """archdetect's ``-a cpupath``: every CPU target this machine (or, with ``node_vars``, the
    simulated node) can use, most specific first. Raises ``EessiLikeError`` if it fails."""
    ran = run_archdetect(archdetect_env(node_vars or {}), "-a", "cpupath")
    targets = tuple(target for target in ran.stdout.strip().split(":") if target)
    if ran.returncode != 0 or not targets:
        raise EessiLikeError(f"archdetect -a cpupath failed (exit {ran.returncode}): {ran.stderr.strip()}")
    return targets


def target_elsewhere(compatible: Iterable[str], candidates: Iterable[str] = DEFAULT_TARGETS) -> str:
    """A CPU target that a node whose ``cpupath`` is ``compatible`` cannot use, for "a login node of
    another CPU" and "a repository with no software for this node".

    The first of ``candidates`` that archdetect does not list for the node, preferring the
    node's machine type and another vendor (compatibility stays within a vendor), then the
    node's machine type, then another machine type. Never a fixed name: an Intel host with
    AVX2 lists haswell, an AMD host does not.
    """
    compatible = tuple(compatible)
    machine, vendor = _machine_and_vendor(compatible[0])

    def preference(target: str) -> int:
        target_machine, target_vendor = _machine_and_vendor(target)
        if target_machine != machine:
            return 2
        return 0 if target_vendor != vendor else 1

    usable_elsewhere = [target for target in candidates if target not in compatible]
    if not usable_elsewhere:
        raise EessiLikeError(f"every candidate target is compatible with {compatible[0]}")
    return min(usable_elsewhere, key=preference)  # min keeps the first of equal preference


def _machine_and_vendor(target: str) -> tuple:
    """A target's machine type and vendor: ``x86_64/intel/haswell`` gives ``("x86_64", "intel")``,
    ``x86_64/generic`` gives ``("x86_64", "generic")``."""
    machine, _sep, rest = target.partition("/")
    return machine, rest.split("/", 1)[0]


def node_and_elsewhere(node_vars: Mapping[str, str] | None = None) -> tuple:
    """``(this node's target, a target it cannot use)``: the first of archdetect's ``cpupath``
    for this machine (or the node ``node_vars`` simulate) and ``target_elsewhere`` of it."""
    compatible = cpupath(node_vars)
    return compatible[0], target_elsewhere(compatible)


def copy_fake_nvidia_smi(dest_dir: Path) -> Path:
    """Put the fake nvidia-smi in ``dest_dir`` (created); returns the directory for ``PATH``."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / "nvidia-smi"
    shutil.copyfile(FAKE_NVIDIA_SMI, target)
    target.chmod(0o755)
    return dest_dir
