"""docs/howto/ad-hoc.md, run top to bottom on the tree `make demo` left.

One-line ``ansible`` runs of the collection's modules against the demo's machine as the one
build host: a rebuild to undo (real EasyBuild), its rollback and the rollback again (no
change), a retire that takes the module off MODULEPATH and its undo, and gc in check mode
and for real, asking the demo's Slurm. Checked here from their results and from the tree:
the directory live before the page is live again, the module loads, nothing is left beside it.
"""

from __future__ import annotations

import re

from tests.integration.harness.demo import DEMO_TREE
from tests.support.howto import run_page


@DEMO_TREE
def test_ad_hoc_runs_roll_back_retire_undo_and_collect(demo_run, tmp_path):
    assert demo_run.done.returncode == 0, demo_run.done.stdout
    live = demo_run.tree / "software" / "TinyApp" / "1.0"
    module_file = demo_run.tree / "modules" / "all" / "TinyApp" / "1.0.lua"
    before = live.stat().st_ino

    ran = run_page("ad-hoc.md", demo_run.tree, tmp_path / "work", tmp_path / "home")

    assert ran.done.returncode == 0, ran.output[-6000:]
    out = ran.done.stdout
    (run,) = set(re.findall(r'"run_id": "(adhoc-\d{14})"', out))
    assert f'localhost | CHANGED => {{\n    "run_id": "{run}",\n    "state": "published"\n' in out
    # Every other result whole: its verdict and its body (the run's state at the top level).
    results = re.findall(r"^localhost \| (CHANGED|SUCCESS) => \{\n((?:    .*\n)*)\}$", out, re.M)
    states = [
        (verdict, state[1])
        for verdict, body in results
        if (state := re.search(r'^    "state": "(\w+)"', body, re.M))
    ]
    assert states == [
        ("CHANGED", "rolled_back"),
        ("SUCCESS", "rolled_back"),
        ("CHANGED", "retired"),
        ("CHANGED", "rolled_back"),
    ]
    (info,) = (body for verdict, body in results if body.startswith('    "changed": false,\n    "run": {'))
    assert f'\n        "run_id": "{run}",\n' in info
    assert '\n        "state": "published",\n' in info
    assert out.count("\nhello from TinyLib 1.0\n") == 2
    assert "TinyApp/1.0 is not on MODULEPATH any more\n" in out
    gc_check, gc = [body for verdict, body in results if '"candidates"' in body]
    previous = live.parent / f".1.0.{run}"
    assert '"dry_run": true' in gc_check
    assert f'"path": "{previous}"' in gc_check
    assert '"dry_run": false' in gc
    assert f'"path": "{previous}"' in gc
    assert '"answered": true' in gc
    assert live.stat().st_ino == before
    assert module_file.is_file()
    assert [path.name for path in live.parent.iterdir()] == ["1.0"]
