"""The EESSI-like prefix's compatibility layers: one per CPU family, each with its own Lmod.

EESSI runs its software on a compatibility layer per CPU family (a Gentoo Prefix under
``<version>/compat/linux/<family>``, the ``EPREFIX`` its module sets), and its own Lmod lives
there: ``init/lmod/bash`` sources ``$EPREFIX/usr/share/Lmod/init/bash``, so ``LMOD_CMD`` is a Lua
script whose first line names the layer's ``lua``. On a node of another family none of those
programs can run: the kernel refuses the ELF file of another machine with ENOEXEC.

One machine runs one family, so the layers are simulated (``build_layer``):

- every program of a layer (``PROGRAMS``, and ``usr/bin/lua``) is a launcher
  (``eessi_like/compat_launcher.sh``) that runs this machine's program on a node of the
  layer's family, and on a node of another family executes an ELF file of the layer's
  machine type (``foreign_elf``), which the kernel refuses with ENOEXEC: bash reports it as it
  reports a program of another machine, "cannot execute binary file: Exec format error",
  status 126. The node's family is what archdetect takes it to be: ``EESSI_MACHINE_TYPE``,
  else this machine's type;
- ``usr/share/Lmod`` is a copy of this machine's Lmod whose paths name the layer: its
  ``libexec/lmod`` starts with ``#!<layer>/usr/bin/lua``, its ``init/bash`` sets ``LMOD_CMD``
  and ``LMOD_DIR`` to the copy, and the Lua processes it starts itself (``source_sh``'s
  helpers) run the layer's ``lua``;
- with ``EESSI_LIKE_COMPAT_RUNLOG`` set, every start of a layer's program appends
  ``<node family> <program's family> <program>`` to that file (``runlog``), a refused one too:
  a test reads from it which family's programs a node started.
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import stackenv

HERE = Path(__file__).resolve().parent / "eessi_like"
LAUNCHER = HERE / "compat_launcher.sh"
# The launcher's first line, which the template leaves out (a file of the collection may only
# start with the interpreters Ansible's sanity test knows, and bash's -p is not among them).
SHEBANG = "#!/bin/bash -p\n"
RUNLOG_VARIABLE = "EESSI_LIKE_COMPAT_RUNLOG"
# ELF e_machine of each family (the kernel's include/uapi/linux/elf-em.h).
ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "riscv64": 243}
# A layer's programs, where a Gentoo Prefix puts them: those EESSI's init, its archdetect and
# Lmod's source_sh look up on PATH, which the EESSI module starts with $EPREFIX/usr/bin and
# $EPREFIX/bin.
PROGRAMS = (
    "bin/bash",
    "bin/sh",
    "bin/cat",
    "bin/grep",
    "bin/readlink",
    "bin/sed",
    "bin/uname",
    "usr/bin/dirname",
    "usr/bin/env",
)
LUA = "usr/bin/lua"
LMOD = "usr/share/Lmod"
FOREIGN_DIR = "usr/lib/eessi-like-elf"
_SYSTEM_PATH = "/usr/bin:/bin"


class CompatError(Exception):
    """A layer cannot be built on this machine (a program or Lmod is missing)."""


def foreign_elf(family: str) -> bytes:
    """The 64-byte header of an ELF executable of ``family``'s machine type and no program
    headers: the kernel refuses it with ENOEXEC on every machine (on another machine for its
    type, on its own for the missing program headers), as it refuses a program built for
    another machine."""
    ident = b"\x7fELF" + bytes((2, 1, 1)) + bytes(9)  # 64-bit, little-endian, version 1
    # e_type ET_EXEC, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
    # e_phentsize 0 (no program header the kernel could load), e_phnum, e_shentsize,
    # e_shnum, e_shstrndx.
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, ELF_MACHINES[family], 1, 0, 64, 0, 0, 64, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class Layer:
    """A built layer: ``eprefix`` (``<prefix>/compat/linux/<family>``) and its Lmod."""

    family: str
    eprefix: Path

    @property
    def lmod_pkg(self) -> Path:
        return self.eprefix / LMOD

    @property
    def lmod_cmd(self) -> Path:
        return self.lmod_pkg / "libexec" / "lmod"

    @property
    def lmod_init(self) -> Path:
        return self.lmod_pkg / "init" / "bash"


def lua_of(lmod: stackenv.Lmod) -> str:
    """The interpreter of this machine's Lmod, from the first line of ``$LMOD_CMD``."""
    with open(lmod.cmd, "rb") as script:
        first = script.readline().decode()
    if not first.startswith("#!"):
        raise CompatError(f"{lmod.cmd} does not start with #!")
    return first[2:].split()[0]


def build_layer(prefix: Path, family: str, lmod: stackenv.Lmod) -> Layer:
    """Write ``<prefix>/compat/linux/<family>``: its programs and its copy of Lmod."""
    if family not in ELF_MACHINES:
        raise CompatError(
            f"no compatibility layer for CPU family {family!r}; known: {', '.join(ELF_MACHINES)}"
        )
    layer = Layer(family, prefix / "compat" / "linux" / family)
    lua = lua_of(lmod)
    template = SHEBANG + LAUNCHER.read_text()
    for rel in (*PROGRAMS, LUA):
        name = rel.rsplit("/", 1)[1]
        program = lua if rel == LUA else shutil.which(name, path=_SYSTEM_PATH)
        if program is None:
            raise CompatError(f"no {name} in {_SYSTEM_PATH} for the {family} layer")
        foreign = layer.eprefix / FOREIGN_DIR / name
        _write_bytes(foreign, foreign_elf(family), 0o755)
        launcher = (
            template.replace("@FAMILY@", family)
            .replace("@FOREIGN@", str(foreign))
            .replace("@PROGRAM@", program)
        )
        _write_bytes(layer.eprefix / rel, launcher.encode(), 0o755)
    _copy_lmod(lmod, layer, lua)
    return layer


def _copy_lmod(lmod: stackenv.Lmod, layer: Layer, lua: str) -> None:
    """This machine's Lmod, copied to the layer with every path of it naming the copy."""
    source = lmod.cmd.parent.parent
    installed = source.resolve()
    # Longest first: /usr/share/lmod/lmod before /usr/share/lmod (LMOD_ROOT).
    replacements = [
        (str(source), str(layer.lmod_pkg)),
        (str(installed), str(layer.lmod_pkg)),
        (str(source.parent), str(layer.eprefix / "usr" / "share")),
        (lua, str(layer.eprefix / LUA)),
    ]
    for directory, subdirs, files in os.walk(installed):
        here = Path(directory)
        target_dir = layer.lmod_pkg / here.relative_to(installed)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in [*subdirs, *files]:
            path = here / name
            target = target_dir / name
            if path.is_symlink():
                # Lmod's lib/ is a relative link into /usr/lib: keep where it leads.
                target.symlink_to(path.resolve())
                if name in subdirs:
                    subdirs.remove(name)
                continue
            if name in subdirs:
                continue
            data = path.read_bytes()
            if b"\0" not in data:
                text = data.decode("utf-8", "surrogateescape")
                for old, new in replacements:
                    text = text.replace(old, new)
                data = text.encode("utf-8", "surrogateescape")
            _write_bytes(target, data, path.stat().st_mode & 0o777)


def _write_bytes(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def runlog(path: Path) -> list[tuple[str, str, str]]:
    """``(node family, program's family, program)`` of every start the log recorded."""
    if not path.exists():
        return []
    return [tuple(line.split(" ", 2)) for line in path.read_text().splitlines() if line]  # type: ignore[misc]


def foreign_starts(path: Path) -> list[tuple[str, str, str]]:
    """The starts of ``runlog`` in which a program ran on a node of another family."""
    return [start for start in runlog(path) if start[0] != start[1]]
