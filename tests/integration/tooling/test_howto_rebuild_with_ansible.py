"""docs/howto/rebuild-with-ansible.md, run top to bottom on the tree and Slurm `make demo` left.

The page's commands, as a reader types them: the build_host role installs EasyBuild and the
command for the demo's tree (pip, the role's probe handler); the rebuild playbook, in check
and diff mode, then from an edited easyconfig with real EasyBuild, then again with nothing to
do; a stack rebuild of TinyLib that takes TinyApp in, in one run; the runs ad hoc through
staged_info; the rollback playbook for both runs, the second time with nothing to do; and the
gc playbook, asking the real Slurm, twice. What the playbooks print is checked here (each
recap's changed count, the published lines and their run ids), and the live tree afterwards:
the directories that were live before the page are live again, with their module files,
and nothing is left beside them.
"""

from __future__ import annotations

import re

from tests.integration.harness.demo import DEMO_TREE
from tests.support.howto import run_page

APP, LIB = "TinyApp/1.0", "TinyLib/1.0"
_RECAP = re.compile(r"^localhost\s*: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=(\d+)", re.M)


def _published(out: str, module: str) -> list[str]:
    """The run ids of the summary lines that say ``module`` was published."""
    return re.findall(rf'"localhost: {re.escape(module)} published at \S+ by run (\S+) \(previous tree', out)


@DEMO_TREE
def test_the_playbooks_prepare_the_host_rebuild_roll_back_and_collect(demo_run, tmp_path):
    assert demo_run.done.returncode == 0, demo_run.done.stdout
    software = demo_run.tree / "software"
    live = {module: software / module for module in (APP, LIB)}
    before = {module: path.stat().st_ino for module, path in live.items()}
    module_file = demo_run.tree / "modules" / "all" / f"{APP}.lua"
    module_text = module_file.read_text()

    ran = run_page("rebuild-with-ansible.md", demo_run.tree, tmp_path / "work", tmp_path / "home")

    assert ran.done.returncode == 0, ran.output[-6000:]
    out = ran.done.stdout
    recaps = [(int(changed), int(failed)) for changed, failed in _RECAP.findall(out)]
    # build_host; rebuild --check, rebuild, rebuild again; the stack; rollback of the stack,
    # again, of the first rebuild; gc, gc again.
    assert len(recaps) == 10, ran.output[-6000:]
    assert [failed for _changed, failed in recaps] == [0] * 10
    assert recaps[0][0] > 0
    assert [changed for changed, _failed in recaps[1:]] == [1, 1, 0, 1, 1, 0, 1, 1, 0], out[-6000:]
    assert f'"localhost: would rebuild {APP} (check mode)"' in out
    assert f"-# {APP}: {live[APP]} inode {before[APP]}\n" in out
    first, stack = _published(out, APP)
    assert f'"localhost: up to date, nothing rebuilt ({APP})"' in out
    assert "hello from TinyLib 1.0\nOMP_NUM_THREADS=1\n" in out
    # The stack run named both, in one run: the library and what is built on it.
    assert _published(out, LIB) == [stack] != [first]
    assert f'"run_id": "{first}"' in out
    assert f'"run_id": "{stack}"' in out
    # Both rolled back: the rebuilt trees wait hidden beside the live one, until gc.
    assert f"\n.1.0.{first}\n.1.0.{stack}\n1.0\n" in out
    assert out.endswith("hello from TinyLib 1.0\n")

    for module, path in live.items():
        assert path.stat().st_ino == before[module], module
        assert [entry.name for entry in path.parent.iterdir()] == ["1.0"], module
    assert module_file.read_text() == module_text
