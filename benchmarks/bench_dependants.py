"""Finding the dependants of a library in a tree of 2,000 installs, beside a plain read of it.

``rebuild --with-dependants`` reads the live tree once before anything else (``dependants.scan``:
every install's easyconfig copy, parsed without running it, and every live module file), then
builds the graph and the plan (``dependants.plan``). The goal is at most 2 s for 2,000 installs.
The baseline is the least any discovery does: a walk of the same trees that reads every file
once (``os.walk``, ``open``, ``read``), parsing nothing.

The tree is made once per run and both sides read it from the page cache after the first
round. Its shape is a site's: a few toolchain installs (GCCcore, GCC) and, in layers, packages
built with them, each depending on a few of the layers below (at run time through its
``dependencies`` and its module file's ``depends_on``, some only at build time), their
easyconfigs written as EasyBuild's are (``local_`` variables, templates, a toolchain dict).
The library rebuilt is in the bottom layer, so that its dependants are a good part of the tree.
"""

from __future__ import annotations

import hashlib
import os
import random

from benchlib import Case
from hpcstack_ops.staged_rebuild import dependants, paths

INSTALLS = 2000
SMALLEST_INSTALLS = 40
ROUNDS = 5
SEED = 37
LAYERS = 8
TOOLCHAIN = ("GCC", "13.2.0")
TARGET = "zlib/1.3.1-GCCcore-13.2.0"


def _easyconfig(name, version, toolchain, runtime, build):
    """An easyconfig as EasyBuild's are written, templates and ``local_`` variables included."""

    def tuples(deps):
        return ", ".join(f"('{dep_name}', '{dep_version}')" for dep_name, dep_version in deps)

    return (
        "easyblock = 'ConfigureMake'\n\n"
        f"name = '{name}'\nversion = '{version}'\n\n"
        "homepage = 'https://example.org/%(namelower)s'\n"
        'description = """A package of the benchmark\'s tree."""\n\n'
        f"toolchain = {{'name': '{toolchain[0]}', 'version': '{toolchain[1]}'}}\n"
        "toolchainopts = {'pic': True}\n\n"
        "source_urls = ['https://example.org/download/']\n"
        "sources = [SOURCELOWER_TAR_GZ]\n"
        f"checksums = ['{hashlib.sha256(name.encode()).hexdigest()}']\n\n"
        f"local_deps = [{tuples(runtime)}]\n"
        "dependencies = local_deps\n"
        f"builddependencies = [{tuples(build)}]\n\n"
        "sanity_check_paths = {'files': ['bin/%(namelower)s'], 'dirs': ['lib']}\n\n"
        "moduleclass = 'lib'\n"
    )


def _module_file(root, name, version, loads):
    lines = [
        "help([==[",
        f"Description: {name} {version}, module load nothing from here",
        "]==])",
        f'whatis("Description: {name}")',
        f'local root = "{root}"',
        'conflict("' + name + '")',
        *(f'depends_on("{load}")' for load in loads),
        'prepend_path("PATH", pathJoin(root, "bin"))',
        'prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib"))',
        f'setenv("EBROOT{name.upper()}", root)',
    ]
    return "\n".join(lines) + "\n"


def _write(installpath, name, version, toolchain, runtime=(), build=()):  # noqa: PLR0917
    """One install, its easyconfig copy and its Lua module file. ``runtime`` and ``build`` are
    ``(name, version, install_dir)``: the easyconfig names each by name and version (its
    toolchain inherited, as EasyBuild's do), the module file loads the full module name."""
    install_dir = version if toolchain[0] == "system" else f"{version}-{toolchain[0]}-{toolchain[1]}"
    install = os.path.join(installpath, "software", name, install_dir)
    os.makedirs(os.path.join(install, "easybuild"))
    pairs = [(dep_name, dep_version) for dep_name, dep_version, _dir in runtime]
    built_with = [(dep_name, dep_version) for dep_name, dep_version, _dir in build]
    with open(os.path.join(install, "easybuild", f"{name}-{install_dir}.eb"), "w") as handle:
        handle.write(_easyconfig(name, version, toolchain, pairs, built_with))
    modules = os.path.join(installpath, "modules", "all", name)
    os.makedirs(modules, exist_ok=True)
    loads = [f"{dep_name}/{dep_dir}" for dep_name, _version, dep_dir in runtime]
    with open(os.path.join(modules, install_dir + ".lua"), "w") as handle:
        handle.write(_module_file(install, name, version, loads))
    return (name, version, install_dir)


def make_tree(installpath, installs=INSTALLS):
    """Write the benchmark's live tree under ``installpath`` (``installs`` installs)."""
    rng = random.Random(SEED)  # noqa: S311 - a reproducible tree, not secrets
    system = ("system", "system")
    _write(installpath, "GCCcore", "13.2.0", system)
    _write(installpath, "GCC", "13.2.0", system)
    layers = [[_write(installpath, "zlib", "1.3.1", ("GCCcore", "13.2.0"))]]
    packages = installs - 3
    for number in range(packages):
        layer = 1 + number * LAYERS // max(packages, 1)
        below = [package for lower in layers[:layer] for package in lower]
        picked = rng.sample(below, min(len(below), rng.randint(1, 3)))
        build = [package for package in picked if rng.random() < 0.2]
        runtime = [package for package in picked if package not in build]
        version = f"{1 + number % 3}.{number % 7}"
        if len(layers) <= layer:
            layers.append([])
        layers[layer].append(_write(installpath, f"pkg{number}", version, TOOLCHAIN, runtime, build))
    return installpath


def _shared_tree(scratch, installs=INSTALLS):
    return make_tree(str(scratch / "apps"), installs)


def _smallest_tree(scratch):
    return _shared_tree(scratch, SMALLEST_INSTALLS)


def discover(_scratch, installpath):
    trees = paths.Trees.from_installpath(installpath)

    def run():
        plan = dependants.plan(dependants.scan(trees), TARGET, TARGET, "zlib-1.3.1-GCCcore-13.2.0.eb", [])
        if len(plan.members) < 2:
            raise RuntimeError(f"the benchmark's tree gave {TARGET} no dependants")

    return run


def read_every_file(_scratch, installpath):
    def run():
        for top in ("software", "modules"):
            for directory, _dirs, files in os.walk(os.path.join(installpath, top)):
                for name in files:
                    with open(os.path.join(directory, name), "rb") as handle:
                        handle.read()

    return run


CASES = [
    Case(
        f"dependants: scan and plan, {INSTALLS} installs (goal <= 2 s)",
        discover,
        "walk reading every file",
        read_every_file,
        rounds=ROUNDS,
        setup=_shared_tree,
        smallest={
            "name": f"dependants: scan and plan, {SMALLEST_INSTALLS} installs",
            "setup": _smallest_tree,
        },
    )
]
