"""``ansible-playbook hpcstack.ops.guard_rollout`` on this machine's real Slurm.

Two inventory hosts, both this machine, form the fleet: node-a is the canary batch, node-b
the next batch. The role owns the cluster's slurm.conf. The canary's test job is submitted
from a shell whose EESSI was loaded for another CPU target (EESSI_SOFTWARE_SUBDIR_OVERRIDE)
and must arrive with this node's. node-b's report looks at an EESSI-like repository that has
no software for this machine's CPU, so the fleet report lists it under no-software-dir.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import eessilike
from localplay import ADMIN_PATH, LocalPlaybooks
from tests.integration.harness.guard_slurm import readable_by_all
from tests.integration.harness.slurm import START_TIMEOUT, slurm_local

pytestmark = pytest.mark.slurm


@pytest.fixture
def fleet(job_root, tmp_path, unprivileged_user):
    """Slurm started, a second EESSI-like repository without this node's target, the
    inventory, and the runner."""
    targets = json.loads((job_root / "targets.json").read_text())
    eessilike.build_prefix(job_root / "eessi-elsewhere", targets=(targets["other"],), accel={})
    readable_by_all(job_root)
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
                "node-b": dict(common, guard_eessi_root=str(job_root / "eessi-elsewhere")),
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
def test_rollout_tests_the_canary_then_rolls_on_and_reports_the_fleet(fleet):
    playbooks, inventory, settings, targets = fleet

    play = playbooks.run("guard_rollout", "-e", json.dumps(settings), inventory=inventory)

    assert play.done.returncode == 0, play.output[-6000:]
    assert play.failed == 0
    # The canary's task came from the other target and got this node's.
    assert f"a task on node-a submitted from {targets['other']} got {targets['node']}" in play.stdout
    # node-b was the one batch after the canary's play, which did not run the role on node-a again.
    assert play.stdout.count("PLAY [Roll the guard out to the other nodes, in batches]") == 1
    batches = play.stdout.split("PLAY [Roll the guard out to the other nodes, in batches]", 1)[1]
    assert "[node-a]" not in batches.split("PLAY [Report what the guard sees on each node]", 1)[0]
    assert "eessi-arch-guard on 2 nodes: installed on 2" in play.stdout
    assert f"{targets['node']}: 1 node (node-a)" in play.stdout
    assert "no-software-dir: 1 node (node-b)" in play.stdout


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
