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
