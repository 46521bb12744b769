"""The command a stack rebuild's rollback suggests to publish it again: the stack rebuild of
its named module, with the exclusions it was given, not its members named one by one (whose
easyconfigs EasyBuild would not be given)."""

from __future__ import annotations

import datetime
import shlex

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import dependants, text
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.support.staged import StagedSite
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal, trees_of

LIB, APP, TOP = "TinyLib/1.0", "TinyApp/1.0", "TinyTop/1.0"


def _undo(tmp_path, modules, **request_fields):
    site = StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=tmp_path)
    site.install(*modules)
    publish_journal(
        site.state_root / "runs",
        "run1",
        trees_of(site.installpath),
        modules=modules,
        state=RunState.ROLLED_BACK,
        **request_fields,
    )
    context = text.Context(state_root=str(site.state_root), now=datetime.datetime.now(datetime.timezone.utc))
    shown = text.rollback({"run_id": "run1", "changed": True, "state": "rolled_back"}, context)
    undo = shown.split("Undo (build and publish again):\n")[1]
    return site, shlex.split(undo.replace("\\\n", ""))


def test_a_chain_s_rollback_suggests_the_stack_rebuild_with_its_exclusions(tmp_path):
    chain = dependants.Plan(
        target=LIB,
        members=[
            dependants.Member(LIB, LIB, "TinyLib-1.0.eb", [LIB], "runtime"),
            dependants.Member(
                APP, APP, f"{tmp_path}/apps/software/{APP}/easybuild/TinyApp-1.0.eb", [APP, LIB], "runtime"
            ),
        ],
        excluded=[TOP],
    )

    site, words = _undo(tmp_path, (LIB, APP), chain=chain, with_dependants=True, exclude=[TOP])

    assert words == [
        "eb-staged-rebuild",
        "rebuild",
        f"--installpath={site.installpath}",
        f"--module={LIB}",
        "--with-dependants",
        f"--exclude={TOP}",
        "--",
        "TinyLib-1.0.eb",
        "TinyApp-1.0.eb",
    ]


def test_a_run_of_named_modules_suggests_them_by_name(tmp_path):
    site, words = _undo(tmp_path, (LIB, APP))

    assert words == [
        "eb-staged-rebuild",
        "rebuild",
        f"--installpath={site.installpath}",
        f"--module={LIB}",
        f"--module={APP}",
        "--",
        "TinyLib-1.0.eb",
        "TinyApp-1.0.eb",
    ]
