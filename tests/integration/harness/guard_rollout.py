"""What a job on this node needs, for the arch_guard role's tests in real Slurm.

One world-readable directory under /tmp (jobs run as the unprivileged test user, and
``testbed/slurm-local.sh`` wants a short path for its sockets) holding:

- ``eessi/``: an EESSI-like prefix whose targets are this machine's real CPU and one that CPU
  cannot use (``eessilike.target_elsewhere``: another vendor, or another machine type);
- ``login.env``: what a login shell on a node of the other target exports after loading EESSI
  and two modules (``export`` lines, for ``.``);
- ``setup.sh``: a clean login's environment and the ``module`` commands that load EESSI, for
  a test job that sets EESSI up itself (``EESSI_SOFTWARE_SUBDIR_OVERRIDE`` picks the target);
- ``targets.json``: ``{"node": <this machine's target>, "other": <the one it cannot use>}``.

Slurm is started under ``slurm/`` by whoever needs it, and stopped by the fixture, by pid,
whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import eessilike
from tests.integration.harness.guard_slurm import readable_by_all, write_env_file
from tests.integration.harness.slurm import STOP_TIMEOUT, slurm_local


def write_job_inputs(root: Path, lmod) -> dict:
    """The prefix, ``login.env``, ``setup.sh`` and ``targets.json`` in ``root``; the targets."""
    node, other = eessilike.node_and_elsewhere()
    prefix = eessilike.build_prefix(root / "eessi", targets=(node, other), accel={})
    login = eessilike.login_environment(lmod, prefix, prefix.node_env(other))
    for name in eessilike.NODE_VARIABLES:
        login.pop(name, None)
    write_env_file(root / "login.env", login)
    setup = write_env_file(root / "setup.sh", eessilike.login_base(prefix, lmod))
    load = eessilike.load_script(prefix, eessilike.default_modules(prefix))
    with setup.open("a") as handle:
        handle.write(f". {shlex.quote(str(lmod.init))} && {load}\n")
    targets = {"node": node, "other": other}
    (root / "targets.json").write_text(json.dumps(targets))
    return targets


@contextlib.contextmanager
def job_inputs(lmod) -> Iterator[Path]:
    """A fresh root holding the job's inputs; on the way out, its Slurm (if any) is stopped
    and the root removed."""
    root = Path(tempfile.mkdtemp(prefix="hpcstack-mol-", dir="/tmp"))
    root.chmod(0o755)
    try:
        write_job_inputs(root, lmod)
        readable_by_all(root)
        yield root
    finally:
        slurm_local("stop", root / "slurm", STOP_TIMEOUT)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def job_root(lmod) -> Iterator[Path]:
    with job_inputs(lmod) as root:
        yield root
