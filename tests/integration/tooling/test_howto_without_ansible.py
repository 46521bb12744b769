"""docs/howto/without-ansible.md, run top to bottom on the tree and Slurm `make demo` left.

The page's commands, as a reader types them: probe, a staged rebuild with real EasyBuild in
its sandbox, status, the rollback, gc asking the real Slurm, and a real batch job from a
login whose EESSI was loaded for another CPU, repaired by ``eval "$(eessi-arch-guard
--shell)"`` in its script. What they print is checked here, and the live tree afterwards:
the directory that was live before the page is live again, and nothing is left beside it.
"""

from __future__ import annotations

import re

from tests.integration.harness.demo import DEMO_TREE
from tests.support.howto import run_page


@DEMO_TREE
def test_the_commands_rebuild_roll_back_collect_and_guard_a_job_without_ansible(demo_run, tmp_path):
    assert demo_run.done.returncode == 0, demo_run.done.stdout
    live = demo_run.tree / "software" / "TinyApp" / "1.0"
    before = live.stat().st_ino
    here, other = demo_run.exported("DEMO_CPU_TARGET"), demo_run.exported("DEMO_OTHER_TARGET")

    ran = run_page("without-ansible.md", demo_run.tree, tmp_path / "work", tmp_path / "home")

    assert ran.done.returncode == 0, ran.output[-6000:]
    out = ran.done.stdout
    assert re.search(r"^Exchange: +works$", out, re.M)
    (run,) = re.findall(
        r"^Published run (tinyapp-\d{14}): 1 module swapped in \(backend \w+, sandboxed\)\.$", out, re.M
    )
    ((published, was),) = re.findall(r"^  Inode: +(\d+), was (\d+)$", out, re.M)
    assert int(was) == before != int(published)
    assert "\nhello from TinyLib 1.0\n" in out
    assert re.search(rf"^{run} +publish +published +", out, re.M)
    assert f"Rolled back run {run}: the previous trees are live again." in out
    assert re.search(rf"^  Inode: +{before} again, was {published}$", out, re.M)
    assert f"removed  {live.parent / ('.1.0.' + run)}\n" in out
    assert re.search(r"^Slurm: 0 running jobs;", out, re.M)
    assert re.search(r"^\d+ removed, 0 kept, 0 to remove by hand\.$", out, re.M)
    assert f"the login's EESSI is for {other}\n" in out
    job = out.split("Submitted batch job", 1)[1]
    assert f"eessi-arch-guard: reloaded EESSI for {here} (job environment was {other})\n" in job
    assert f"EESSI_SOFTWARE_SUBDIR={here}\nusera runs the build for {here}\n" in job
    assert live.stat().st_ino == before
    assert [path.name for path in live.parent.iterdir()] == ["1.0"]
