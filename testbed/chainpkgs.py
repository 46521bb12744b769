"""A chain of tiny C packages built by the real EasyBuild, for rebuilds of a library and its dependants.

``ValLib/1.0`` compiles a value, given in its easyconfig (``buildopts = 'VAL=1'``), into a
header (``include/vallib.h``: ``#define VALLIB_VALUE 1``) and a shared library
(``lib/libvallib.so``: ``vallib_value()`` returns it). Its dependants compile the header's
value into a program and link the library:

- ``ValA/1.0`` and ``ValB/1.0`` depend on ValLib: ``vala`` prints ``vala <compiled> <linked>``,
  the header's value as it was when ValA was built and what the linked library returns now;
  ValA also ships ``lib/libvala.so``, whose ``vala_value()`` returns the header's value as
  it was when ValA was built.
- ``ValC/1.0`` depends on ValA only (a dependant of a dependant): ``valc`` prints
  ``valc <compiled> <vala_value()> <vallib_value()>``.
- ``ValSolo/1.0`` depends on nothing here: ``valsolo`` prints ``valsolo``.

So a dependant rebuilt against a new ValLib prints the new value everywhere, and one that was
not prints the old value where it compiled the header. Every package uses the ``MakeCp``
easyblock on the SYSTEM toolchain, builds offline in about a second, and links with
``-L$EBROOT<DEP>/lib`` only: with EasyBuild's ``--rpath`` its wrappers turn each into an
RPATH entry, which is how the programs find their libraries (their module files set no
library path that a test relies on).

``write_packages(dest, value, dependants)`` writes the tarballs into ``dest/sources`` and the
easyconfigs into ``dest/easyconfigs``; ``dependants`` > 3 adds ``ValD01`` ... (each like
ValB), for the benchmark's longer chains, and fewer leave out ValC, then ValB. The tarballs
are reproducible, so two generations written with different values have the same sources
and checksums and differ only in the library's easyconfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tinypkgs import _tarball

LIB = "ValLib"
VERSION = "1.0"
DIRECT = ("ValA", "ValB")  # ValLib's direct dependants
INDIRECT = "ValC"  # depends on ValA only
UNRELATED = "ValSolo"
# EasyBuild's RPATH wrappers: every -L<dir> of a link becomes an RPATH entry.
EB_ARGS = ("--rpath",)

_LIB_MAKEFILE = """\
VAL ?= 0
all: vallib.h libvallib.so
vallib.h:
\tprintf '#define VALLIB_VALUE %s\\n' '$(VAL)' > vallib.h
libvallib.so: vallib.c vallib.h
\t$(CC) -shared -fPIC -o $@ vallib.c
"""

_LIB_C = '#include "vallib.h"\nint vallib_value(void) { return VALLIB_VALUE; }\n'

_SOLO_MAKEFILE = "valsolo: valsolo.c\n\t$(CC) -o $@ valsolo.c\n"
_SOLO_C = '#include <stdio.h>\nint main(void) { puts("valsolo"); return 0; }\n'


def _dependant_files(name: str, with_library: bool, uses: str | None) -> dict:
    """The sources of a dependant ``name``: its program, and ``lib<name>.so`` if asked.

    ``uses``: the dependant whose library the program links too (ValC links ValA's).
    """
    program = name.lower()
    link = "-L$(EBROOTVALLIB)/lib -lvallib"
    include = "-I$(EBROOTVALLIB)/include"
    extern, values, args = "", "%d %d", "VALLIB_VALUE, vallib_value()"
    if uses:
        link = f"-L$(EBROOT{uses.upper()})/lib -l{uses.lower()} {link}"
        extern = f"int {uses.lower()}_value(void);\n"
        values, args = "%d %d %d", f"VALLIB_VALUE, {uses.lower()}_value(), vallib_value()"
    targets = [program]
    rules = f"{program}: {program}.c\n\t$(CC) {include} -o $@ {program}.c {link}\n"
    files = {
        f"{program}.c": (
            "#include <stdio.h>\n#include <vallib.h>\nint vallib_value(void);\n"
            f'{extern}int main(void) {{ printf("{program} {values}\\n", {args}); return 0; }}\n',
            0o644,
        )
    }
    if with_library:
        targets.append(f"lib{program}.so")
        rules += (
            f"lib{program}.so: {program}lib.c\n\t$(CC) {include} -shared -fPIC -o $@ {program}lib.c {link}\n"
        )
        files[f"{program}lib.c"] = (
            f"#include <vallib.h>\nint {program}_value(void) {{ return VALLIB_VALUE; }}\n",
            0o644,
        )
    files["Makefile"] = (f"all: {' '.join(targets)}\n{rules}", 0o644)
    return files


@dataclass(frozen=True)
class ChainPackages:
    sources: Path
    easyconfigs: Path
    dependants: tuple
    # ``-<toolchain>-<version>`` (empty on SYSTEM): EasyBuild's robot finds a dependency's
    # easyconfig by this name, and it ends each install's directory name.
    suffix: str = ""

    def easyconfig(self, name: str, version: str = VERSION) -> Path:
        return self.easyconfigs / f"{name}-{version}{self.suffix}.eb"

    def install(self, name: str) -> str:
        """``Name/dir``: where ``name``'s install is under ``software/``."""
        return f"{name}/{VERSION}{self.suffix}"

    @property
    def members(self) -> tuple:
        """The library and every dependant, as ``Name/1.0``."""
        return tuple(f"{name}/{VERSION}" for name in (LIB, *self.dependants))


def dependant_names(count: int) -> tuple:
    """The first ``count`` of ValA, ValB, ValC, ValD01, ValD02, ...: ValLib's dependants."""
    extra = tuple(f"ValD{index:02d}" for index in range(1, count - 2))
    return (*DIRECT, INDIRECT, *extra)[:count]


def _easyconfig(name, checksum, *, deps=(), buildopts="", files=(), toolchain=None):
    dependencies = "".join(f"    ('{dep}', '{VERSION}'),\n" for dep in deps)
    sanity = [f"{target}/{name}" for names, target in files for name in names]
    toolchain_line = f"{{'name': '{toolchain[0]}', 'version': '{toolchain[1]}'}}" if toolchain else "SYSTEM"
    return (
        "easyblock = 'MakeCp'\n\n"
        f"name = '{name}'\nversion = '{VERSION}'\n\n"
        "homepage = 'https://example.org/chainpkgs'\n"
        f"description = 'A tiny C package of a dependency chain ({name}).'\n\n"
        f"toolchain = {toolchain_line}\n\n"
        "sources = [SOURCE_TAR_GZ]\n"
        f"checksums = ['{checksum}']\n\n"
        + (f"dependencies = [\n{dependencies}]\n\n" if deps else "")
        + (f"buildopts = '{buildopts}'\n\n" if buildopts else "")
        + f"files_to_copy = {list(files)!r}\n\n"
        + f"sanity_check_paths = {{'files': {sanity!r}, 'dirs': []}}\n\n"
        + "moduleclass = 'lib'\n"
    )


def _write(packages: ChainPackages, name: str, sources: dict, **easyconfig) -> None:
    source_dir = packages.sources / name[0].lower() / name
    source_dir.mkdir(parents=True, exist_ok=True)
    checksum = _tarball(source_dir / f"{name}-{VERSION}.tar.gz", sources)
    packages.easyconfig(name).write_text(_easyconfig(name, checksum, **easyconfig))


def write_packages(dest: Path, value: int = 1, dependants: int = 3, toolchain=None) -> ChainPackages:
    """Write ValLib (compiling ``value``), its ``dependants`` and ValSolo under ``dest``.

    ``toolchain``: ``(name, version)`` of every package's toolchain (None: SYSTEM).
    """
    names = dependant_names(dependants)
    suffix = f"-{toolchain[0]}-{toolchain[1]}" if toolchain else ""
    packages = ChainPackages(dest / "sources", dest / "easyconfigs", names, suffix)
    packages.easyconfigs.mkdir(parents=True, exist_ok=True)
    _write(
        packages,
        LIB,
        {"Makefile": (_LIB_MAKEFILE, 0o644), "vallib.c": (_LIB_C, 0o644)},
        buildopts=f"VAL={value}",
        files=[(["vallib.h"], "include"), (["libvallib.so"], "lib")],
        toolchain=toolchain,
    )
    for name in names:
        program = name.lower()
        with_library = name == DIRECT[0]
        uses = DIRECT[0] if name == INDIRECT else None
        files = [([program], "bin")] + ([([f"lib{program}.so"], "lib")] if with_library else [])
        _write(
            packages,
            name,
            _dependant_files(name, with_library, uses),
            deps=[uses or LIB],
            files=files,
            toolchain=toolchain,
        )
    _write(
        packages,
        UNRELATED,
        {"Makefile": (_SOLO_MAKEFILE, 0o644), "valsolo.c": (_SOLO_C, 0o644)},
        files=[(["valsolo"], "bin")],
        toolchain=toolchain,
    )
    return packages


def write_failing_build(easyconfig: Path) -> Path:
    """Make ``easyconfig``'s build command fail (``false`` before ``make``): EasyBuild stops
    at the build step. Returns the path."""
    easyconfig.write_text(easyconfig.read_text() + "\n# Fails on purpose.\nprebuildopts = 'false && '\n")
    return easyconfig
