"""``molecule test -s arch_guard_<kind>``: the arch_guard role on this machine's real Slurm.

Each scenario's prepare starts a single-node Slurm of its own (``testbed/slurm-local.sh``) and
its cleanup stops it; this test stops it again whatever happened, by pid. What the jobs need
is made by the ``job_root`` fixture (``harness/guard_rollout.py``): an EESSI-like prefix
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

import pytest

import checkout
from localplay import molecule_test

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("kind", ["fresh", "chained", "removal"])
def test_arch_guard_scenario_converges_is_idempotent_and_jobs_get_this_node_s_eessi(
    kind, tmp_path, job_root, unprivileged_user
):
    collection = checkout.copy_to(tmp_path / "collection")

    done = molecule_test(
        f"arch_guard_{kind}",
        collection,
        tmp_path,
        MOLECULE_ARCH_GUARD_ROOT=str(job_root),
        MOLECULE_ARCH_GUARD_USER=unprivileged_user.name,
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
