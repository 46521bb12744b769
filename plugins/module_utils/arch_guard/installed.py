# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The arch_guard role's install under its prefix: the contract between the role, which
writes it (``arch_guard_role.install``), and what reads it on a node (the role's survey,
``arch_guard_info``'s report).

::

    <prefix>/bin/eessi-arch-guard      the launcher: #!<python> -IS, the site's settings
    <prefix>/bin/task-prolog           only with a TaskProlog to chain: it, then the launcher
    <prefix>/lib/<build>/hpcstack_ops  the code (common/ and arch_guard/), byte-compiled
    <prefix>/lib/current               a link to the build in use
    <prefix>/release.json              version, digest, python, build

Every directory of it is root's, mode 0755; nothing in it is writable by anyone else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from ..common import dirfd, errors

DEFAULT_PREFIX = "/opt/hpcstack/arch-guard"
# The package name the launcher imports: the collection's module_utils, as a node holds it.
PACKAGE = "hpcstack_ops"
BIN = "bin"
LIB = "lib"
CURRENT = "current"
LAUNCHER = os.path.join(BIN, "eessi-arch-guard")
WRAPPER = os.path.join(BIN, "task-prolog")
RELEASE_FILE = "release.json"
CODE_DIR = os.path.join(LIB, CURRENT, PACKAGE)
# The guard's own directories, the prefix first: root's, mode 0755.
DIRECTORIES = ("", BIN, LIB)
DIRECTORY_MODE = 0o755
FILE_MODE = 0o644
EXECUTABLE_MODE = 0o755
# release.json is a few lines; a bigger file is not one the role wrote.
RELEASE_MAX_BYTES = 64 * 1024
# The launcher's line when it cannot import the guard (it exits 0 then, as a TaskProlog must).
CANNOT_LOAD = "cannot load the guard"
# A build is named by the code's digest and the interpreter that compiled it: this many hex digits.
BUILD_DIGITS = 16

_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_BUILD = re.compile(r"[0-9a-f]{" + str(BUILD_DIGITS) + r"}\Z")


class ReleaseError(errors.UsageError):
    """release.json is missing or not one the role wrote; ``str(err)`` is the one line."""


def build_name(digest: str, python: str) -> str:
    """The build of the code ``digest`` compiled by ``python``: its directory under lib/."""
    return hashlib.sha256(f"{digest} {python}".encode()).hexdigest()[:BUILD_DIGITS]


def release_record(version: str, digest: str, python: str) -> dict:
    """What release.json records of an install."""
    return {"version": version, "digest": digest, "python": python, "build": build_name(digest, python)}


def release_bytes(release: dict) -> bytes:
    return (json.dumps(release, indent=4, sort_keys=True) + "\n").encode()


def read_release(path) -> dict:
    """``version``, ``digest``, ``python`` and ``build`` (None when it has none) of release.json.

    Read as every file of the install is read: no link followed, no FIFO waited on, the type
    checked on the open file, at most ``RELEASE_MAX_BYTES``. ReleaseError if unusable.
    """
    try:
        data = dirfd.read_regular(path, "", limit=RELEASE_MAX_BYTES)
    except FileNotFoundError:
        raise ReleaseError(f"{path} is missing") from None
    except errors.UsageError as err:
        raise ReleaseError(str(err)) from None
    except OSError as err:
        raise ReleaseError(f"cannot read {path}: {err.strerror}") from None
    return parse_release(data, path)


def parse_release(data: bytes, path) -> dict:
    """``read_release`` of the bytes ``data`` read from ``path``."""
    try:
        release = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and json's JSONDecodeError alike
        raise ReleaseError(f"{path} is not JSON ({len(data)} bytes)") from None
    if not isinstance(release, dict):
        raise ReleaseError(f"{path} is not a JSON object")
    checks = (
        ("version", lambda value: bool(value.strip()), "a version"),
        ("digest", _DIGEST.match, "a SHA-256 in hex"),
        ("python", os.path.isabs, "an absolute path"),
    )
    for key, check, what in checks:
        value = release.get(key)
        if not isinstance(value, str) or not check(value):
            raise ReleaseError(f"{path}: {key} is not {what} ({value!r})")
    build = release.get("build")
    if build is not None and not (isinstance(build, str) and _BUILD.match(build)):
        raise ReleaseError(f"{path}: build is not {BUILD_DIGITS} hex digits ({build!r})")
    return dict({key: release[key] for key, _check, _what in checks}, build=build)
