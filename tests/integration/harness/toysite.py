"""Live trees made from EasyBuild's own test material, and the two module tools that load them.

The material is the ``test/framework/`` of EasyBuild's source distribution of the pinned
version (the bootstrap fetches it into ``.venv/test-material``): the toy, libtoy and toy-app
easyconfigs, the sandbox's sources, and the sandbox's easyblocks (``EB_toy`` and friends),
which EasyBuild takes with ``--include-easyblocks``. ``ToyMaterial`` stands where the
``tinypkgs`` packages stand for ``EbSite`` (``sources``, ``easyconfigs``, ``easyconfig``).

Environment Modules 5 is the Debian package unpacked beside Lmod (it conflicts with lmod),
its ``modulecmd.tcl`` run by the system's ``tclsh``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import stackenv
from tests.integration.harness.ebsite import EbSite

MATERIAL_VARIABLE = "HPCSTACK_TEST_MATERIAL"
TCLSH = "/usr/bin/tclsh"
MODULE_TIMEOUT = 60
EB_TIMEOUT = 300


def material_dir() -> Path:
    """Where the bootstrap put the material: ``$HPCSTACK_TEST_MATERIAL``, else beside .venv's eb."""
    given = os.environ.get(MATERIAL_VARIABLE)
    return Path(given) if given else Path(stackenv.find_eb()).parent.parent / "test-material"


@dataclass(frozen=True)
class ToyMaterial:
    """EasyBuild's ``test/framework``: easyconfigs, sources and easyblocks of the toy packages."""

    framework: Path

    @property
    def sources(self) -> Path:
        return self.framework / "sandbox" / "sources"

    @property
    def easyconfigs(self) -> Path:
        return self.framework / "easyconfigs" / "test_ecs"

    def easyconfig(self, name: str, version: str = "0.0") -> Path:
        return self.easyconfigs / name[0].lower() / name / f"{name}-{version}.eb"

    @property
    def easyblocks(self) -> str:
        """``EASYBUILD_INCLUDE_EASYBLOCKS``: the sandbox's easyblocks (EB_toy is one of them)."""
        blocks = self.framework / "sandbox" / "easybuild" / "easyblocks"
        return f"{blocks}/*.py,{blocks}/*/*.py"

    def env(self) -> dict:
        return {"EASYBUILD_INCLUDE_EASYBLOCKS": self.easyblocks}


@dataclass(frozen=True)
class EnvironmentModules:
    """Environment Modules 5's ``modulecmd.tcl``, run with the system's tclsh."""

    modulecmd: Path

    def shell_command(self, script: str) -> list[str]:
        """``bash -c`` with a ``module`` function of Environment Modules, for a script that uses it."""
        define = f'module() {{ eval "$({TCLSH} {self.modulecmd} bash "$@")"; }}'
        return ["bash", "--noprofile", "--norc", "-c", f"{define}; {script}"]


@pytest.fixture(scope="session")
def toy_material() -> ToyMaterial:
    framework = material_dir() / "easybuild-framework" / "test" / "framework"
    if not (framework / "easyconfigs" / "test_ecs" / "t" / "toy" / "toy-0.0.eb").is_file():
        pytest.fail(f"EasyBuild's test material is missing at {framework}; run tools/bootstrap.sh test")
    return ToyMaterial(framework)


@pytest.fixture(scope="session")
def environment_modules() -> EnvironmentModules:
    found = sorted((material_dir() / "environment-modules").rglob("modulecmd.tcl"))
    if not found or not os.access(TCLSH, os.X_OK):
        pytest.fail(f"Environment Modules or {TCLSH} is missing; run tools/bootstrap.sh test")
    return EnvironmentModules(found[0])


def install(site, material: ToyMaterial, *modules: str, eb_args=()) -> None:
    """Build ``modules`` (``name/version``) straight into ``site``'s live tree with plain ``eb``."""
    easyconfigs = [material.easyconfig(*module.split("/")) for module in modules]
    install_easyconfigs(site, material, easyconfigs, eb_args)


def counting_eb(site) -> tuple[Path, Path]:
    """An ``eb`` that records each start in a file, then runs the real one: ``(eb, record)``.

    A refusal made before the build leaves the record absent.
    """
    record = site.root / "eb-started"
    wrapper = site.root / "counting-eb"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {record}\nexec {site.eb} "$@"\n')
    wrapper.chmod(0o755)
    site.give(wrapper)
    return wrapper, record


def load_with_lmod(site, module: str, command: str) -> subprocess.CompletedProcess:
    return site.module_shell(f"module load {module} && {command}")


def load_with_environment_modules(
    site, tool: EnvironmentModules, module: str, command: str
) -> subprocess.CompletedProcess:
    env = dict(site.base_env(), MODULEPATH=str(site.modules_all))
    return subprocess.run(
        site.as_owner(tool.shell_command(f"module load {module} && {command}")),
        cwd=site.root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=MODULE_TIMEOUT,
        check=False,
    )


def fake_toolchain_modules(material: ToyMaterial) -> Path:
    """The material's fake toolchain modules (``gompi/2018a`` and what it loads), which
    easyconfigs of a toolchain other than SYSTEM (the toy with extensions) build against."""
    return material.framework / "modules"


def install_fake_hierarchy(material: ToyMaterial, modules_all: Path) -> None:
    """The material's fake hierarchy modules (``Core``, ``Compiler``, ``MPI`` levels: GCC,
    gompi and what they load) copied under ``modules_all``, as EasyBuild's own tests do: the
    compiler modules then extend ``MODULEPATH`` under this tree, not under ``/tmp``."""
    for level in ("Core", "Compiler", "MPI"):
        shutil.copytree(material.framework / "modules" / level, modules_all / level, symlinks=True)
    for module_file in modules_all.rglob("*"):
        if module_file.is_file() and "/tmp/modules/all" in module_file.read_text():
            module_file.write_text(module_file.read_text().replace("/tmp/modules/all", str(modules_all)))


def install_easyconfigs(site, material: ToyMaterial, easyconfigs, eb_args=(), env=None) -> None:
    """Build ``easyconfigs`` (paths) into ``site``'s live tree with plain ``eb``, in EasyBuild's
    environment for ``material`` with ``env`` on top (None removes a variable)."""
    done = subprocess.run(
        site.as_owner([str(site.eb), *eb_args, *map(str, easyconfigs)]),
        cwd=site.root,
        env=site.eb_env(material, **dict(material.env(), **(env or {}))),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EB_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def live_module_file(site, module: str) -> Path:
    """The live module file of ``module``: ``<version>.lua`` (Lua) where there is one, else the
    Tcl ``<version>``."""
    lua = site.modules_all / (module + ".lua")
    return lua if lua.exists() else site.modules_all / module


def loads(site, tool: EnvironmentModules, module: str, command: str, modulepath=()) -> dict:
    """``module load MODULE && COMMAND`` in each module tool that reads ``module``'s file:
    ``{"Lmod": done, "Environment Modules": done}`` for a Tcl file, Lmod alone for a Lua one
    (Environment Modules 5 reads only Tcl). ``modulepath``: directories after the live one."""
    path = [site.modules_all, *modulepath]
    script = f"module load {module} && {command}"
    found = {
        "Lmod": subprocess.run(
            site.as_owner(site.lmod.shell_command(script)),
            cwd=site.root,
            env=site.lmod.env(path, base=site.base_env()),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=MODULE_TIMEOUT,
            check=False,
        )
    }
    if live_module_file(site, module).name.endswith(".lua"):
        return found
    env = dict(site.base_env(), MODULEPATH=":".join(map(str, path)))
    found["Environment Modules"] = subprocess.run(
        site.as_owner(tool.shell_command(script)),
        cwd=site.root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=MODULE_TIMEOUT,
        check=False,
    )
    return found


class PristineSite:
    """A live tree built once per test module, and given back as built to each test.

    The whole site directory is copied aside (``cp -a``) once; ``fresh()`` puts the copy back
    at the same path, so module files and EasyBuild's records still name the paths they were
    built with, and drops what a test left (the tool's state root, scratch directories).
    """

    def __init__(self, site, keep: Path):
        self.site = site
        self.keep = keep
        subprocess.run(["cp", "-a", f"{site.root}/.", str(keep)], check=True)

    def fresh(self):
        for entry in list(self.site.root.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                subprocess.run(["rm", "-rf", "--one-file-system", str(entry)], check=True)
            else:
                entry.unlink()
        subprocess.run(["cp", "-a", f"{self.keep}/.", str(self.site.root)], check=True)
        return self.site


def new_site(lmod, tmp_path_factory, label) -> EbSite:
    """An empty site of the root user in a new temporary directory named after ``label``,
    with the collection's package linked in."""
    import checkout  # noqa: PLC0415 - the integration conftest puts testbed/ on sys.path

    root = tmp_path_factory.mktemp(label)
    site = EbSite(root=root, user=None, lmod=lmod, eb=stackenv.find_eb())
    for name in ("home", "tmp"):
        (root / name).mkdir()
    checkout.link_package(site.package_root)
    return site


def assert_refused(site, material, args, env=None) -> tuple[str, list]:
    """Run the rebuild ``args`` with a counting ``eb`` (``counting_eb``) and assert a refusal:
    exit 2, nothing on stdout, one ``eb-staged-rebuild:`` line, the trees as before and no
    journal. Returns the line and the arguments' last words of each start of EasyBuild."""
    eb, started = counting_eb(site)
    before = site.snapshot()
    args = [arg if not arg.startswith("--eb=") else f"--eb={eb}" for arg in args]

    done = site.run_tool(*args, packages=material, env=dict(material.env(), **(env or {})))

    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("eb-staged-rebuild: ")
    assert site.snapshot() == before
    assert not site.journals()
    return lines[0], started.read_text().splitlines() if started.exists() else []
