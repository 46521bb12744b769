"""What the tests of ``arch_guard_info`` build: EESSI-like versions on one root, simulated
nodes, and the arch_guard role's install layout.

The versions are ``testbed/eessilike.py`` prefixes (our archdetect stand-in, our CPU tables),
chosen so that one simulated icelake node meets each case of the guard's target selection:

- ``FIRST`` has every default target (icelake with ``accel/nvidia/cc80``): the node's first
  candidate has a software directory;
- ``LATER`` has haswell only: a later candidate of the node's has one;
- ``NONE`` has an aarch64 target only: no candidate of an x86_64 node has one.

The install layout is the contract with the arch_guard role: the code in
``<prefix>/lib/current/hpcstack_ops/`` (``current`` a link to ``lib/<build>``),
``<prefix>/bin/eessi-arch-guard`` and
``<prefix>/release.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import eessilike

ICELAKE = "x86_64/intel/icelake"
HASWELL = "x86_64/intel/haswell"
ZEN3 = "x86_64/amd/zen3"
GPU = "accel/nvidia/cc80"
FIRST = "2023.06"
LATER = "2025.06"
NONE = "2021.12"
DIGEST = "0123456789abcdef" * 4
BUILD = "fedcba9876543210"
RELEASE = {"version": "0.1.0", "digest": DIGEST, "python": sys.executable}


def build_versions(root: Path) -> dict:
    """``FIRST``, ``LATER`` and ``NONE`` under ``root`` (an eessi_root); version -> EessiPrefix."""
    return {
        FIRST: eessilike.build_prefix(root, version=FIRST),
        LATER: eessilike.build_prefix(root, version=LATER, targets=(HASWELL,), accel={}),
        NONE: eessilike.build_prefix(root, version=NONE, targets=("aarch64/neoverse_v1",), accel={}),
    }


def node_job_env(prefix: eessilike.EessiPrefix, target: str, accel: str | None = None, **extra: str) -> dict:
    """``job_env`` for a simulated node: the login PATH (with the fake nvidia-smi) and the
    variables that make archdetect answer ``target`` and ``accel``."""
    return {"PATH": prefix.login_path, **prefix.node_env(target, accel), **extra}


_RELEASE_DEFAULT = object()


def install_guard(prefix: Path, release=_RELEASE_DEFAULT, *, launcher_mode: int = 0o755) -> Path:
    """Lay out an install of the guard as the arch_guard role does; ``release`` (default
    RELEASE) is written as JSON when it is a dict, as it is when ``str`` or ``bytes``, not at
    all when None. The code is in ``lib/<build>/hpcstack_ops`` with ``lib/current`` linked to
    the build."""
    if release is _RELEASE_DEFAULT:
        release = RELEASE
    lib = prefix / "lib" / BUILD / "hpcstack_ops"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (prefix / "lib" / "current").symlink_to(BUILD)
    launcher = prefix / "bin" / "eessi-arch-guard"
    launcher.parent.mkdir()
    launcher.write_text(f"#!{sys.executable} -IS\nraise SystemExit(0)\n")
    launcher.chmod(launcher_mode)
    release_file = prefix / "release.json"
    if isinstance(release, dict):
        release_file.write_text(json.dumps(release))
    elif isinstance(release, str):
        release_file.write_text(release)
    elif isinstance(release, bytes):
        release_file.write_bytes(release)
    return prefix
