"""A live tree of a library and its dependants (``chainpkgs``), built by the real EasyBuild
with its RPATH wrappers, for the rebuilds of ``--with-dependants``.

The tree holds ``ValLib/1.0`` (built with ``VAL=1``), its direct dependants ``ValA`` and
``ValB``, ``ValC`` (a dependant of ValA) and the unrelated ``ValSolo``, all built by one
plain ``eb --rpath`` run. The rebuild's generation (``new``) differs in ValLib's easyconfig
alone (``VAL=2``); the dependants are rebuilt from their installs' own easyconfig copies.

Two layouts: flat (EasyBuild's default naming scheme, Lua module files), and hierarchical
(``HierarchicalMNS``, Tcl module files, every package on EasyBuild's fake ``GCC/6.4.0-2.28``
toolchain of its test material, whose modules are copied under ``modules/all/{Core,Compiler,
MPI}`` as ``test_staged_hierarchical.py`` does), so that each member's module file is
``Compiler/GCC/6.4.0-2.28/<Name>/1.0`` and its install ``<Name>/1.0-GCC-6.4.0-2.28``.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import chainpkgs
from tests.integration.harness import toysite
from tests.integration.harness.ebsite import EbSite

TOOLCHAIN = ("GCC", "6.4.0-2.28")
COMPILER_LEVEL = f"Compiler/{TOOLCHAIN[0]}/{TOOLCHAIN[1]}"
HMNS_ARGS = ("--module-naming-scheme=HierarchicalMNS", "--module-syntax=Tcl")
# What each program prints, built against a ValLib of ``value``.
_PROGRAMS = {"ValA": "vala", "ValB": "valb", "ValC": "valc"}
_RPATH = re.compile(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]")


def says(name: str, value: int) -> str:
    """What ``name``'s program prints when it was built against, and links, a ValLib of ``value``."""
    values = 3 if name == chainpkgs.INDIRECT else 2
    return " ".join([_PROGRAMS[name], *[str(value)] * values])


@dataclass
class ChainSite:
    """The live tree, the generation it was built from (``old``) and the rebuild's (``new``)."""

    site: EbSite
    old: chainpkgs.ChainPackages
    new: chainpkgs.ChainPackages
    material: toysite.ToyMaterial | None = None  # hierarchical only: the fake toolchain's

    @property
    def hierarchical(self) -> bool:
        return self.material is not None

    @property
    def dependants(self) -> tuple:
        return self.old.dependants

    @property
    def members(self) -> tuple:
        """The library and its dependants (by package name)."""
        return (chainpkgs.LIB, *self.dependants)

    def module(self, name: str) -> str:
        """``name``'s full live module name."""
        short = f"{name}/{chainpkgs.VERSION}"
        return f"{COMPILER_LEVEL}/{short}" if self.hierarchical else short

    def live(self, name: str) -> Path:
        return self.site.software / self.old.install(name)

    def module_file(self, name: str) -> Path:
        module = self.site.modules_all / self.module(name)
        return module if self.hierarchical else module.with_name(module.name + ".lua")

    def own_easyconfig(self, name: str) -> Path:
        """The easyconfig copy EasyBuild wrote into ``name``'s live install."""
        return self.live(name) / "easybuild" / self.old.easyconfig(name).name

    @property
    def eb_args(self) -> tuple:
        return (*chainpkgs.EB_ARGS, *(HMNS_ARGS if self.hierarchical else ()))

    def env(self, packages: chainpkgs.ChainPackages | None = None) -> dict:
        """EasyBuild's environment on top of the site's for ``packages`` (default: ``new``):
        hierarchical, the robot finds the fake toolchain's easyconfig (HierarchicalMNS names
        modules from it) and its easyblock, EB_toy (only that one: the test material's
        generic easyblocks are stubs)."""
        if not self.hierarchical:
            return {}
        packages = packages or self.new
        blocks = self.material.framework / "sandbox" / "easybuild" / "easyblocks"
        return {
            "EASYBUILD_ROBOT_PATHS": f"{packages.easyconfigs}:{self.material.easyconfigs}",
            "EASYBUILD_INCLUDE_EASYBLOCKS": str(blocks / "t" / "toy.py"),
        }

    # --- the tool -------------------------------------------------------------------------

    def rebuild_args(self, backend: str, extra=(), json_output=True) -> list:
        """``[--json] rebuild ... --module <ValLib> --with-dependants --backend B EXTRA --
        EB-ARGS <new ValLib's easyconfig>``."""
        site = self.site
        args = ["--json"] if json_output else []
        return [
            *args,
            "rebuild",
            f"--installpath={site.installpath}",
            f"--eb={site.eb}",
            "--module",
            self.module(chainpkgs.LIB),
            "--with-dependants",
            "--backend",
            backend,
            *extra,
            "--",
            *self.eb_args,
            str(self.new.easyconfig(chainpkgs.LIB)),
        ]

    def run_tool(self, *args: str, env=None) -> subprocess.CompletedProcess:
        return self.site.run_tool(*args, packages=self.new, env=dict(self.env(), **(env or {})))

    # --- what is live ---------------------------------------------------------------------

    def state_of(self, *names: str) -> tuple:
        """What a rollback gives back of ``names``: type, mode, owner, inode and bytes of every
        entry of their live installs, and their module files' bytes (a module file is
        written back, as a new file)."""
        installs = self.site.snapshot_of(*(self.live(name) for name in names))
        return installs, {name: self.module_file(name).read_bytes() for name in names}

    def untouched(self, *names: str) -> dict:
        """Type, mode, owner, inode and bytes of the live installs and module files of ``names``."""
        paths = []
        for name in names:
            paths += [self.live(name), self.module_file(name)]
        return self.site.snapshot_of(*paths)

    def load_and_run(self, name: str, tool: toysite.EnvironmentModules | None = None):
        """``module load <name> && <its program>`` in Lmod (``tool`` None) or Environment Modules."""
        site = self.site
        if self.hierarchical:
            path = [site.modules_all / "Core"]
            modules = f"{'/'.join(TOOLCHAIN)} {name}/{chainpkgs.VERSION}"
        else:
            path = [site.modules_all]
            modules = f"{name}/{chainpkgs.VERSION}"
        script = f"module load {modules} && {_PROGRAMS[name]}"
        if tool is None:
            env = site.lmod.env(path, base=site.base_env())
            argv = site.lmod.shell_command(script)
        else:
            env = dict(site.base_env(), MODULEPATH=":".join(map(str, path)))
            argv = tool.shell_command(script)
        return site.run_as_owner(argv, env, toysite.MODULE_TIMEOUT)

    def outputs(self, tool=None) -> dict:
        """What each dependant's program prints, its module loaded: ``{name: (exit, stdout)}``."""
        found = {}
        for name in self.dependants:
            done = self.load_and_run(name, tool)
            found[name] = (done.returncode, done.stdout.strip() or done.stderr.strip()[-500:])
        return found

    def expected_outputs(self, value: int) -> dict:
        return {name: (0, says(name, value)) for name in self.dependants}

    def rpaths(self, name: str) -> dict:
        """The RPATH/RUNPATH entries of every ELF file of ``name``'s live install
        (``bin/``, ``lib/``), by path relative to the install."""
        found = {}
        live = self.live(name)
        for directory in ("bin", "lib"):
            if not (live / directory).is_dir():
                continue
            for path in sorted((live / directory).iterdir()):
                if not path.is_file() or path.read_bytes()[:4] != b"\x7fELF":
                    continue
                shown = subprocess.run(
                    ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
                ).stdout
                entries = [entry for match in _RPATH.finditer(shown) for entry in match.group(1).split(":")]
                found[str(path.relative_to(live))] = entries
        return found


def build(site: EbSite, material: toysite.ToyMaterial | None = None) -> ChainSite:
    """Write both generations into ``site`` and build the first one live with plain ``eb``:
    flat, or hierarchical on the fake GCC toolchain with ``material``."""
    toolchain = TOOLCHAIN if material is not None else None
    old = chainpkgs.write_packages(site.root / "gen1", value=1, toolchain=toolchain)
    new = chainpkgs.write_packages(site.root / "gen2", value=2, toolchain=toolchain)
    site.give(site.root / "gen1")
    site.give(site.root / "gen2")
    chain = ChainSite(site, old, new, material)
    if material is not None:
        modules_all = site.modules_all
        toysite.install_fake_hierarchy(material, modules_all)
    names = (*chain.members, chainpkgs.UNRELATED)
    done = subprocess.run(
        site.as_owner(
            [str(site.eb), "--robot", *chain.eb_args, *(str(old.easyconfig(name)) for name in names)]
        ),
        cwd=site.root,
        env=site.eb_env(old, **chain.env(old)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=toysite.EB_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return chain
