"""``molecule test -s arch_guard_<kind>``: the arch_guard role on this machine's real Slurm.

The three scenarios run on one single-node Slurm (``testbed/slurm-local.sh``), started once
for the module and stopped by pid whatever happened; the scenarios are told to keep it
(``MOLECULE_ARCH_GUARD_KEEP_SLURM``), so their prepare does not start one and their cleanup
does not stop it. Before each scenario, slurm.conf is put back as the cluster started with it
and the role's prefix and state are removed: each scenario starts from the node as it was,
and its prepare still writes the site's side (no TaskProlog, or the site's) and has Slurm read
it. What the jobs need is made once too (``harness/guard_rollout.py``): an EESSI-like prefix
whose targets are this machine's real CPU and another, and the environment a login shell on
a node of the other target exports after loading EESSI and two modules. ``verify.yml`` runs
a real ``srun`` from that environment.

- fresh: the role owns slurm.conf, which had no TaskProlog; the tasks get this node's EESSI.
- chained: slurm.conf names a TaskProlog of the site's, which exports a variable and prints a
  line; both effects still reach the tasks, before the guard's, whose repair also arrives.
- removal: the guard is installed over that TaskProlog in prepare; converge removes it, and
  slurm.conf is the site's again byte for byte, its TaskProlog alone running.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Iterator

import pytest

import checkout
from localplay import molecule_test
from tests.integration.harness.guard_rollout import job_inputs
from tests.integration.harness.slurm import START_TIMEOUT, slurm_local

# One worker runs the three, on the one Slurm (where pytest-xdist honours the group).
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("molecule_arch_guard")]

# What a scenario writes under the root, beside slurm.conf: the role's prefix and state, and
# the site's side that prepare makes.
SCENARIO_LEFTOVERS = ("opt", "state", "site", "slurm.conf.before")


@pytest.fixture(scope="module")
def slurm_node(lmod) -> Iterator[tuple[Path, bytes]]:
    """The job's inputs and a running Slurm under ``slurm/``; slurm.conf as it started."""
    with job_inputs(lmod) as root:
        started = slurm_local("start", root / "slurm", START_TIMEOUT)
        if started.returncode != 0:
            pytest.fail(f"testbed/slurm-local.sh start:\n{started.stdout}{started.stderr}")
        yield root, (root / "slurm" / "slurm.conf").read_bytes()


@pytest.fixture
def job_root(slurm_node) -> Path:
    """The shared node, put back as it started: slurm.conf and no scenario's leftovers."""
    root, conf = slurm_node
    (root / "slurm" / "slurm.conf").write_bytes(conf)
    for name in SCENARIO_LEFTOVERS:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    return root


@pytest.mark.parametrize("kind", ["fresh", "chained", "removal"])
def test_arch_guard_scenario_converges_is_idempotent_and_jobs_get_this_node_s_eessi(
    kind, tmp_path, job_root, unprivileged_user
):
    daemons = (job_root / "slurm" / "pids").read_text()
    collection = checkout.copy_to(tmp_path / "collection")

    done = molecule_test(
        f"arch_guard_{kind}",
        collection,
        tmp_path,
        MOLECULE_ARCH_GUARD_ROOT=str(job_root),
        MOLECULE_ARCH_GUARD_USER=unprivileged_user.name,
        MOLECULE_ARCH_GUARD_KEEP_SLURM="true",
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    # prepare, converge (which changed something), idempotence (which found nothing to
    # change), verify (whose assertions passed), cleanup.
    recaps = re.findall(r"^slurm-node\s*:\s*ok=\d+\s+changed=(\d+).*failed=(\d+)", done.stdout, re.M)
    assert len(recaps) == 5, output[-8000:]
    changed = [int(count) for count, _failed in recaps]
    assert changed[1] > 0
    assert changed[2] == 0
    assert [int(count) for _changed, count in recaps] == [0] * 5
    assert "Each task has the EESSI of the node it ran on" in output
    # The scenario ran on the shared Slurm and left it for the next: the same daemons.
    assert (job_root / "slurm" / "pids").read_text() == daemons
