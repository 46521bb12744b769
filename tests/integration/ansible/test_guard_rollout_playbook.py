"""``ansible-playbook hpcstack.ops.guard_rollout`` on this machine's real Slurm, for what the
how-to (docs/howto/guard-rollout.md, run by tooling/test_howto_guard_rollout.py: the canary's
test job, the batches, the fleet report with a no-software-dir node, removal, each layout)
does not show: the test job submitted as ``guard_test_user``, an unprivileged account, and a
mismatch target that the canary is itself, refused before any other node is touched.

Two inventory hosts, both this machine, form the fleet: node-a is the canary batch, node-b
the next batch. The role owns the cluster's slurm.conf.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from localplay import ADMIN_PATH, LocalPlaybooks
from tests.integration.harness.slurm import START_TIMEOUT, slurm_local

pytestmark = pytest.mark.slurm


@pytest.fixture
def fleet(job_root, tmp_path, unprivileged_user):
    """Slurm started, the inventory, and the runner."""
    targets = json.loads((job_root / "targets.json").read_text())
    started = slurm_local("start", job_root / "slurm", START_TIMEOUT)
    assert started.returncode == 0, started.stderr
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    common = {
        "ansible_connection": "local",
        "guard_slurm_node": node,
        "arch_guard_prefix": str(job_root / "opt" / "arch-guard"),
        "arch_guard_manage_slurm_conf": True,
        # Both hosts are this machine and read its one slurm.conf: named per-node files, so
        # that the fleet takes the per-node order (canary, then batches).
        "arch_guard_slurm_conf_layout": "per_node",
        "arch_guard_slurm_conf": str(job_root / "slurm" / "slurm.conf"),
        "arch_guard_state_dir": str(job_root / "state"),
        "guard_eessi_root": str(job_root / "eessi"),
    }
    inventory = {
        "slurm_compute": {
            "hosts": {
                "node-a": dict(common),
                "node-b": dict(common),
            }
        }
    }
    inventory_file = tmp_path / "inventory.json"
    inventory_file.write_text(json.dumps(inventory))
    settings = {
        "guard_batch": 1,
        "guard_mismatch_target": targets["other"],
        "guard_eessi_setup": f". {job_root / 'setup.sh'}",
        "guard_test_user": unprivileged_user.name,
        "guard_srun_args": ["--overcommit"],
        "guard_test_environment": {"SLURM_CONF": str(job_root / "slurm" / "slurm.conf")},
    }
    playbooks = LocalPlaybooks(tmp_path / "ansible", {"PATH": ADMIN_PATH})
    return playbooks, str(inventory_file), settings, targets


@pytest.mark.host_cpu
def test_the_canary_s_test_job_submitted_as_guard_test_user_gets_this_node_s_target(fleet, unprivileged_user):
    playbooks, inventory, settings, targets = fleet
    # The job's shell stops (exit 3) unless it runs as that account: it is runuser's.
    whoami = f'[ "$(id -un)" = {unprivileged_user.name} ] && {settings["guard_eessi_setup"]}'

    play = playbooks.run(
        "guard_rollout",
        "-e",
        json.dumps(dict(settings, guard_eessi_setup=whoami)),
        "--limit",
        "node-a",
        inventory=inventory,
    )

    assert play.done.returncode == 0, play.output[-6000:]
    assert play.failed == 0
    assert f"a task on node-a submitted from {targets['other']} got {targets['node']}" in play.stdout


def test_a_mismatch_target_that_the_canary_is_stops_the_rollout(fleet):
    playbooks, inventory, settings, targets = fleet

    play = playbooks.run(
        "guard_rollout",
        "-e",
        json.dumps(dict(settings, guard_mismatch_target=targets["node"])),
        inventory=inventory,
    )

    assert play.done.returncode == 2, play.output[-6000:]
    assert f"node-a is {targets['node']} itself: name another target" in play.stdout
    # any_errors_fatal: nothing after the canary ran.
    assert "PLAY [Roll the guard out to the other nodes, in batches]" not in play.stdout
