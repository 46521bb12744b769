"""What `make demo` leaves running for the how-tos in docs/howto/: the commands, Slurm, demo.env.

- ``<demo>/bin/eb-staged-rebuild`` and ``<demo>/bin/eessi-arch-guard``: the two commands, run
  from a copy of ``plugins/module_utils`` (``<demo>/.hpcstack/lib``) the way a node without
  an installation runs them (``python -IS``, no Ansible).
- A single-node Slurm (``testbed/slurm-local.sh``, as the tests start it) in a directory under
  /tmp named after the demo's path, so a second ``make demo`` finds it running and
  ``make demo-stop`` finds it to stop. Its sockets need a short path, hence not ``<demo>``.
- ``<demo>/demo.env``: ``export`` lines for ``.``: ``PATH`` with the commands, ``eb`` and
  ``ansible-playbook``; Lmod's ``module``; the EasyBuild configuration the demo built with;
  the collection for Ansible; ``SLURM_CONF``; and the EESSI-like stack's paths.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import checkout
import slurmjobs

SLURM_START_TIMEOUT = 240  # the script waits up to 180 s for its port lock, then 60 s for idle
SLURM_STOP_TIMEOUT = 90
COMMANDS = {"eb-staged-rebuild": "staged_rebuild.cli", "eessi-arch-guard": "arch_guard.cli"}


class DemoSiteError(Exception):
    """The demo cannot set its site up; the message says why, in one line."""


def slurm_root(demo: Path) -> Path:
    """The demo's Slurm directory: under /tmp, named after the demo's absolute path."""
    digest = hashlib.sha256(os.fsencode(demo.absolute())).hexdigest()[:12]
    # A fixed, predictable name on purpose (make demo-stop finds it): make_slurm_root checks
    # what it finds there.
    return Path("/tmp") / f"hpcstack-demo-{digest}"  # noqa: S108


def make_slurm_root(demo: Path) -> Path:
    """Create the Slurm directory, or take the one a previous demo made.

    Its name in /tmp is predictable, so an existing one is taken only if it is a real
    directory of this user's that no one else can write: another user could have made it
    first, or left a symlink there, to have root write where they choose.
    """
    root = slurm_root(demo)
    try:
        os.mkdir(root, 0o755)
    except FileExistsError:
        if not _ours(root):
            raise DemoSiteError(
                f"{root} exists and is not a directory of this user's that only it can write; remove it"
            ) from None
    # slurm-local.sh wants every directory above the cluster searchable by all users.
    os.chmod(root, 0o755)  # noqa: S103
    return root / "slurm"


def _ours(root: Path) -> bool:
    """``root`` is a directory (not a link) of this user's that no one else can write."""
    try:
        found = os.lstat(root)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid() and not found.st_mode & 0o022


def stop_slurm(demo: Path) -> subprocess.CompletedProcess | None:
    """Stop the demo's Slurm and remove its directory; None when there was none. A
    directory of that name that is not one the demo could have made is left alone: its
    pid file would name the processes to kill."""
    root = slurm_root(demo)
    if not _ours(root):
        return None
    stopped = slurmjobs.slurm_local("stop", root / "slurm", SLURM_STOP_TIMEOUT)
    if stopped.returncode == 0:
        shutil.rmtree(root)
    return stopped


def install_commands(demo: Path) -> Path:
    """``<demo>/bin`` with both commands, run from a fresh copy of the package."""
    lib = demo / ".hpcstack" / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    checkout.copy_package(lib)
    bin_dir = demo / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, cli in COMMANDS.items():
        launcher = bin_dir / name
        launcher.write_text(checkout.launcher(sys.executable, lib, cli))
        launcher.chmod(0o755)
    return bin_dir


def write_env_file(demo: Path, variables: dict, lmod_init: Path) -> Path:
    """``<demo>/demo.env``: ``variables`` as ``export`` lines, ``PATH`` prepended to the
    caller's, and Lmod's ``module`` defined."""
    lines = [
        "# Written by make demo: the demo site's environment, for `. demo/demo.env`.",
        f". {shlex.quote(str(lmod_init))}",
    ]
    for name, value in sorted(variables.items()):
        if name == "PATH":
            lines.append(f'export PATH={shlex.quote(value)}:"$PATH"')
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    path = demo / "demo.env"
    path.write_text("\n".join(lines) + "\n")
    return path
