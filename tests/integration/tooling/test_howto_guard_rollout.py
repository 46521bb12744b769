"""docs/howto/guard-rollout.md, run top to bottom on the Slurm and the EESSI-like stack that
`make demo` left.

The page's commands, as a reader types them: ``guard_rollout`` over two inventory names, this
machine (the canary) and node-b (a second install on it, with its own copy of slurm.conf and
an EESSI without this CPU's software), takes the per-node order by itself: the canary's real
test job, submitted from an EESSI loaded for another target, arrives with this node's; node-b
follows in the next batch; the fleet report lists this node under its target and node-b
under no-software-dir. A job submitted afterwards from the other target is repaired. The
removal puts both slurm.conf files back byte for byte and leaves no guard files. Then the
layouts: both names reading one file are found ``shared`` and the line is set once, on the
owner (check mode); ``configless``, with the controller named, installs on the controller's
file, repairs a real job and is removed; and with slurm.conf left to the site, the role only
names the wrapper. slurm.conf is as it was at the end.
"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.integration.harness.demo import DEMO_TREE
from tests.support.howto import run_page


@DEMO_TREE
def test_the_rollout_tests_the_canary_rolls_on_reports_repairs_a_job_and_is_removed_for_each_layout(
    demo_run, tmp_path
):
    assert demo_run.done.returncode == 0, demo_run.done.stdout
    here, other = demo_run.exported("DEMO_CPU_TARGET"), demo_run.exported("DEMO_OTHER_TARGET")
    slurm_conf = Path(demo_run.exported("SLURM_CONF"))
    before = slurm_conf.read_bytes()
    node = socket.gethostname().split(".")[0]
    work = demo_run.tree / "howto-guard"

    ran = run_page("guard-rollout.md", demo_run.tree, tmp_path / "work", tmp_path / "home")

    assert ran.done.returncode == 0, ran.output[-6000:]
    out = ran.done.stdout
    # The canary: its test job came from the other target and got this node's.
    assert f"a task on {node} submitted from {other} got {here} ({other}->{here})" in out
    # node-b was the one batch after the canary; the canary was not in it.
    batches = out.split("PLAY [Roll the guard out to the other nodes, in batches]", 1)[1]
    batches = batches.split("PLAY [Report what the guard sees on each node]", 1)[0]
    assert "[node-b]" in batches
    assert f"[{node}]" not in batches
    # The fleet report.
    assert '"eessi-arch-guard on 2 nodes: installed on 2"' in out
    assert '"  no-software-dir: 1 node (node-b)"' in out
    assert f'"  {here}: 1 node ({node})"' in out
    # The job after the rollout, and again under configless: repaired both times.
    job = (
        f"submitted from {other}\n"
        f"eessi-arch-guard: reloaded EESSI for {here} (job environment was {other})\n"
        f"EESSI_SOFTWARE_SUBDIR={here}\n"
        f"EESSI_ARCH_GUARD_RELOADED={other}->{here}\n"
    )
    assert out.count(job) == 2, out[-6000:]
    # The demo's TaskProlog was chained, and its line kept as it was.
    assert f"\n{slurm_conf.parent / 'task_prolog'}\nstatus=$?\n" in out
    assert f'"line": "TaskProlog={slurm_conf.parent / "task_prolog"}"' in out
    # The layouts each run found, and what TaskProlog= named.
    prolog = work / "arch-guard" / "bin" / "task-prolog"
    assert "slurm.conf is as it was, and the guard's files are gone\n" in out
    for shown in (
        '"msg": "layout per_node, TaskProlog=(the guard is removed)"',
        f'"msg": "layout shared, TaskProlog={prolog}"',
        f'"msg": "layout configless, TaskProlog={prolog}"',
        '"msg": "layout configless, TaskProlog=(the guard is removed)"',
        f'"msg": "layout per_node, TaskProlog={prolog}"',
    ):
        assert shown in out, shown
    # Slurm as the page found it, and no guard left under either prefix.
    assert slurm_conf.read_bytes() == before
    assert not (work / "arch-guard").exists()
    assert not (work / "node-b" / "arch-guard").exists()
