"""Two tiny self-contained EasyBuild packages, generated on demand.

``TinyLib/1.0`` ships a greeting; ``TinyApp/1.0`` depends on it and prints that greeting.
Both use toolchain SYSTEM and the ``Tarball`` easyblock, build offline in seconds, and carry
sanity checks, so a finished install looks like any real EasyBuild install (``easybuild/``
with the easyconfig, logs, devel file; a Lua module file with ``root`` and ``depends_on``).

The source tarballs are generated, never committed: ``write_packages(dest)`` writes the
tarballs into ``dest/sources`` and the easyconfigs (with their SHA-256 checksums) into
``dest/easyconfigs``. Used by the integration tests and by ``make demo``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

LIB = "TinyLib"
APP = "TinyApp"
VERSION = "1.0"
GREETING = "hello from TinyLib 1.0"


@dataclass(frozen=True)
class TinyPackages:
    sources: Path
    easyconfigs: Path

    def easyconfig(self, name: str, version: str = VERSION) -> Path:
        return self.easyconfigs / f"{name}-{version}.eb"


def _tarball(path: Path, files: dict[str, tuple[str, int]]) -> str:
    """Write a reproducible .tar.gz of ``{relative path: (text, mode)}``; return its SHA-256.

    EasyBuild descends into a tarball whose only entry is a directory, so every tarball
    here has at least two top-level entries.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    # A fixed gzip timestamp keeps the bytes, and so the easyconfig's checksum, the same on
    # every run.
    data = gzip.compress(buffer.getvalue(), mtime=0)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _lib_files(version: str, greeting: str) -> dict[str, tuple[str, int]]:
    return {
        "share/tinylib/greeting.txt": (greeting + "\n", 0o644),
        "bin/tinylib-version": (f"#!/bin/sh\necho {version}\n", 0o755),
    }


def _app_files(version: str) -> dict[str, tuple[str, int]]:
    script = (
        "#!/bin/sh\n"
        "# Prints the greeting of the TinyLib module loaded with it.\n"
        'exec cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"\n'
    )
    return {
        "bin/tinyapp": (script, 0o755),
        "share/tinyapp/VERSION": (version + "\n", 0o644),
    }


def _easyconfig(name: str, version: str, checksum: str, body: str) -> str:
    return (
        "easyblock = 'Tarball'\n\n"
        f"name = '{name}'\n"
        f"version = '{version}'\n\n"
        "homepage = 'https://example.org/tinypkgs'\n"
        f"description = 'A tiny self-contained test package ({name}).'\n\n"
        "toolchain = SYSTEM\n\n"
        "sources = [SOURCE_TAR_GZ]\n"
        f"checksums = ['{checksum}']\n\n" + body + "\nmoduleclass = 'tools'\n"
    )


def write_packages(dest: Path, version: str = VERSION, greeting: str = GREETING) -> TinyPackages:
    """Write both packages' sources and easyconfigs under ``dest``; return where they are.

    ``version`` and ``greeting`` let a test build a second, distinguishable generation.
    """
    packages = TinyPackages(sources=dest / "sources", easyconfigs=dest / "easyconfigs")
    for name, files in ((LIB, _lib_files(version, greeting)), (APP, _app_files(version))):
        # EasyBuild looks for sources in <sourcepath>/<first letter>/<name>/.
        source_dir = packages.sources / name[0].lower() / name
        source_dir.mkdir(parents=True, exist_ok=True)
        checksum = _tarball(source_dir / f"{name}-{version}.tar.gz", files)
        if name == LIB:
            body = (
                "sanity_check_paths = {\n"
                "    'files': ['share/tinylib/greeting.txt', 'bin/tinylib-version'],\n"
                "    'dirs': [],\n}\n"
                "sanity_check_commands = ['tinylib-version']\n"
            )
        else:
            body = (
                f"dependencies = [('{LIB}', '{version}')]\n\n"
                "sanity_check_paths = {'files': ['bin/tinyapp'], 'dirs': []}\n"
                "sanity_check_commands = ['tinyapp']\n"
            )
        packages.easyconfigs.mkdir(parents=True, exist_ok=True)
        packages.easyconfig(name, version).write_text(_easyconfig(name, version, checksum, body))
    return packages


# --- Variants for the failure and relocation tests of eb-staged-rebuild -------------------

BIN = "TinyBin"
# What the hooks below leave in a target directory they manage to write into.
INTRUDER = ".tinypkgs-hook-intruder"


def write_failing_sanity_check(packages: TinyPackages, name: str = LIB, version: str = VERSION) -> Path:
    """Make ``name``'s easyconfig in ``packages`` require a file its install never has.

    The build, install and module steps succeed; EasyBuild's sanity check then fails the
    build. Returns the easyconfig's path.
    """
    return _append(
        packages.easyconfig(name, version),
        "Fails on purpose: nothing installs this file.",
        "sanity_check_paths = {'files': ['share/never-installed.txt'], 'dirs': []}",
    )


def _append(easyconfig: Path, why: str, assignment: str) -> Path:
    """Add ``assignment`` to ``easyconfig`` after a comment saying ``why``. An easyconfig is
    Python: the later assignment wins."""
    easyconfig.write_text(easyconfig.read_text() + f"\n# {why}\n{assignment}\n")
    return easyconfig


def write_sibling_probe(packages: TinyPackages, name: str, sibling: Path, version: str = VERSION) -> Path:
    """Make ``name``'s install record what it sees of ``sibling`` (another live version of it).

    After the install, ``sibling-probe`` in the install directory holds the sibling's
    ``PAYLOAD`` and then the error of a write into the sibling (``Read-only file system`` in a
    sandbox), or ``written`` if the write went through. Returns the easyconfig's path.
    """
    probe = "%(installdir)s/sibling-probe"
    write = f"{sibling}/written-by-build"
    command = (
        f"cat {sibling}/PAYLOAD > {probe} && "
        f"{{ (: > {write}) 2>&1 | sed 's/.*: //' | grep . >> {probe} || echo written >> {probe}; }}"
    )
    return _append(
        packages.easyconfig(name, version),
        "What the build sees of another version.",
        f"postinstallcmds = [{command!r}]",
    )


def write_binary_package(dest: Path, version: str = VERSION) -> TinyPackages:
    """``TinyBin/<version>``: installs files that name its own install directory.

    ``share/tinybin/prefix.bin`` is binary (NUL bytes around the install path), as a linker
    writes an RPATH; ``bin/tinybin-prefix`` is a script that prints the install path. Both
    are written after the install (``postinstallcmds``) from EasyBuild's ``%(installdir)s``,
    so they name wherever EasyBuild built the package.
    """
    packages = TinyPackages(sources=dest / "sources", easyconfigs=dest / "easyconfigs")
    source_dir = packages.sources / BIN[0].lower() / BIN
    source_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "share/tinybin/README": ("TinyBin: files that name their install directory.\n", 0o644),
        "bin/tinybin-hello": ("#!/bin/sh\necho hello from TinyBin\n", 0o755),
    }
    checksum = _tarball(source_dir / f"{BIN}-{version}.tar.gz", files)
    # The .eb file is Python: '\\000' there reaches the shell's printf as '\000' (a NUL byte).
    body = r"""postinstallcmds = [
    "printf 'TinyBin\\000%(installdir)s\\000' > %(installdir)s/share/tinybin/prefix.bin",
    "printf '#!/bin/sh\\necho %(installdir)s\\n' > %(installdir)s/bin/tinybin-prefix",
    "chmod 755 %(installdir)s/bin/tinybin-prefix",
]

sanity_check_paths = {
    'files': ['share/tinybin/prefix.bin', 'bin/tinybin-prefix', 'bin/tinybin-hello'],
    'dirs': [],
}
sanity_check_commands = ['tinybin-prefix']
"""
    packages.easyconfigs.mkdir(parents=True, exist_ok=True)
    packages.easyconfig(BIN, version).write_text(_easyconfig(BIN, version, checksum, body))
    return packages


_WRITER_HOOKS = '''"""EasyBuild hooks (--hooks) that try to write into the live tree, for isolation tests.

Before the install step of every package, each target gets a write: a directory gets a new
file ({intruder!r}), a file is opened for appending. Every outcome goes to the report
({report!r}), one line each; the first error is raised again, so the build fails.
"""

import os

TARGETS = {targets!r}
REPORT = {report!r}
INTRUDER = {intruder!r}


def _write(target):
    if os.path.isdir(target):
        with open(os.path.join(target, INTRUDER), "x") as handle:
            handle.write("written by a hook\\n")
    else:
        with open(target, "a") as handle:
            handle.write("-- written by a hook\\n")


def pre_install_hook(self, *args, **kwargs):
    first_error = None
    for target in TARGETS:
        try:
            _write(target)
            outcome = "written"
        except OSError as err:
            outcome = "%s %s" % (err.errno, err.strerror)
            first_error = first_error or err
        with open(REPORT, "a") as report:
            report.write("%s\\t%s\\n" % (target, outcome))
    if first_error is not None:
        raise first_error
'''


def write_live_writer_hooks(path: Path, targets, report: Path) -> Path:
    """Write a hooks file whose ``pre_install_hook`` writes into each of ``targets``.

    A directory target gets the file ``INTRUDER``; a file target is appended to. Each
    attempt is recorded in ``report`` as ``<target>\\t<"written" or "<errno> <strerror>">``;
    the first failure is raised again, so the build fails where a write was refused.
    Returns ``path``.
    """
    path.write_text(
        _WRITER_HOOKS.format(
            targets=[str(target) for target in targets], report=str(report), intruder=INTRUDER
        )
    )
    return path


_HALFWAY_HOOKS = '''"""EasyBuild hooks (--hooks): the first build to finish its install step stops there.

By then EasyBuild has emptied the install directory (--rebuild) and installed into it.

It writes its pid and process group to {marker!r} and sleeps; a later build finds the
marker and carries on, so the same run can be started again after it was killed.
"""

import os
import time

MARKER = {marker!r}
SECONDS = {seconds!r}


def post_install_hook(self, *args, **kwargs):
    if os.path.exists(MARKER):
        return
    with open(MARKER + ".tmp", "w") as handle:
        handle.write("%d %d\\n" % (os.getpid(), os.getpgid(0)))
    os.rename(MARKER + ".tmp", MARKER)
    time.sleep(SECONDS)
'''


def write_halfway_hooks(path: Path, marker: Path, seconds: int = 600) -> Path:
    """Write a hooks file that marks "halfway" (``marker``: ``<pid> <pgid>``), then sleeps.

    The hook runs after the install step, when EasyBuild has emptied the install directory
    and installed into it. Only the first build that gets there sleeps; once ``marker``
    exists, builds run through. Returns ``path``.
    """
    path.write_text(_HALFWAY_HOOKS.format(marker=str(marker), seconds=seconds))
    return path
