"""The staged_rebuild module's stack rebuild: ``with_dependants`` and ``exclude``.

The live tree, built by the test builder, holds TinyLib, TinyApp built on it, TinyTop built
on TinyApp (each install's easyconfig copy lists its dependency, its module file loads it)
and TinyOther, built on nothing. Check mode returns the plan, compared here with the
expected text, and changes nothing: no build runs (``FAKE_EB_ARGS_LOG``), the live tree and
the state root are as they were. A chain needs a sandbox that shows the new builds at their
live paths: the test builder runs in the userns one.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.support.module_runner import assert_failed_with, disk, run_module, warnings_of
from tests.support.staged import FAKE_EB
from tests.unit.plugins.modules import test_staged_rebuild as versioned_eb

LIB, APP, TOP, OTHER = "TinyLib/1.0", "TinyApp/1.0", "TinyTop/1.0", "TinyOther/1.0"
DEPENDS = f"{TOP}:{APP},{APP}:{LIB}"


@pytest.fixture
def chain(empty_site, tmp_path, monkeypatch):
    """The chain and TinyOther live; TinyLib's new easyconfig outside the live tree."""
    monkeypatch.setenv("FAKE_EB_DEPENDS", DEPENDS)
    empty_site.install(LIB, APP, TOP, OTHER, depends=DEPENDS)
    easyconfig = tmp_path / "easyconfigs" / "TinyLib-1.0.eb"
    easyconfig.parent.mkdir()
    easyconfig.write_text("name = 'TinyLib'\nversion = '1.0'\ntoolchain = SYSTEM\n# the fix\n")
    calls_log = tmp_path / "eb-calls.jsonl"
    monkeypatch.setenv("FAKE_EB_ARGS_LOG", str(calls_log))
    monkeypatch.delenv("EB_STAGED_REBUILD_BACKEND", raising=False)
    return empty_site, easyconfig, calls_log


def _args(site, easyconfig, **options):
    return {
        "state_root": str(site.state_root),
        "installpath": str(site.installpath),
        "modules": [LIB],
        "easyconfigs": [str(easyconfig)],
        "eb": str(FAKE_EB),
        "backend": "userns",
        "with_dependants": True,
        "rebuild": "always",
        **options,
    }


def _text(plan, site, easyconfig) -> str:
    """The plan as indented JSON, the site's paths shown as ``<apps>`` and ``<easyconfigs>``."""
    text = json.dumps(plan, indent=2, sort_keys=True)
    return text.replace(str(easyconfig.parent), "<easyconfigs>").replace(str(site.installpath), "<apps>")


EXPECTED_PLAN = """{
  "excluded": [],
  "members": [
    {
      "easyconfig": "<easyconfigs>/TinyLib-1.0.eb",
      "install": "TinyLib/1.0",
      "kind": "runtime",
      "module": "TinyLib/1.0",
      "reason": [
        "TinyLib/1.0"
      ]
    },
    {
      "easyconfig": "<apps>/software/TinyApp/1.0/easybuild/TinyApp-1.0.eb",
      "install": "TinyApp/1.0",
      "kind": "runtime",
      "module": "TinyApp/1.0",
      "reason": [
        "TinyApp/1.0",
        "TinyLib/1.0"
      ]
    },
    {
      "easyconfig": "<apps>/software/TinyTop/1.0/easybuild/TinyTop-1.0.eb",
      "install": "TinyTop/1.0",
      "kind": "runtime",
      "module": "TinyTop/1.0",
      "reason": [
        "TinyTop/1.0",
        "TinyApp/1.0",
        "TinyLib/1.0"
      ]
    }
  ],
  "target": "TinyLib/1.0"
}"""


def test_check_mode_returns_the_plan_and_changes_nothing(chain, capsys):
    site, easyconfig, calls_log = chain
    before = disk(site)

    result = run_module(capsys, staged_rebuild, _args(site, easyconfig), check_mode=True)

    assert result["changed"] is True
    assert _text(result["plan"], site, easyconfig) == EXPECTED_PLAN
    assert result["modules"] == [LIB, APP, TOP]
    assert disk(site) == before
    assert not calls_log.exists(), "check mode ran a build"


EXPECTED_EXCLUDED_PLAN = """{
  "excluded": [
    "TinyApp/1.0",
    "TinyTop/1.0"
  ],
  "members": [
    {
      "easyconfig": "<easyconfigs>/TinyLib-1.0.eb",
      "install": "TinyLib/1.0",
      "kind": "runtime",
      "module": "TinyLib/1.0",
      "reason": [
        "TinyLib/1.0"
      ]
    }
  ],
  "target": "TinyLib/1.0"
}"""


def test_exclude_leaves_out_a_dependant_and_what_depends_on_it_with_a_warning_each(chain, capsys):
    site, easyconfig, calls_log = chain
    before = disk(site)

    result = run_module(capsys, staged_rebuild, _args(site, easyconfig, exclude=[APP]), check_mode=True)

    assert _text(result["plan"], site, easyconfig) == EXPECTED_EXCLUDED_PLAN
    assert result["modules"] == [LIB]
    assert warnings_of(result) == [
        f"{APP} is left out (--exclude): it keeps linking the old {LIB}",
        f"{TOP} is left out: it depends on {LIB} only through {APP}, and keeps linking the old {LIB}",
    ]
    assert disk(site) == before
    assert not calls_log.exists()


def test_a_chain_rebuild_publishes_every_member_and_returns_the_plan(chain, capsys):
    site, easyconfig, calls_log = chain
    inodes = {module: site.live(module).stat().st_ino for module in (LIB, APP, TOP, OTHER)}

    result = run_module(capsys, staged_rebuild, _args(site, easyconfig))

    assert (result["changed"], result["state"]) == (True, "published")
    assert _text(result["plan"], site, easyconfig) == EXPECTED_PLAN
    assert [entry["module"] for entry in result["modules"]] == [LIB, APP, TOP]
    assert len([json.loads(line) for line in calls_log.read_text().splitlines()]) == 1
    for module in (LIB, APP, TOP):
        assert site.live(module).stat().st_ino != inodes[module]
        assert site.payload(module) == "new build"
    assert site.live(OTHER).stat().st_ino == inodes[OTHER]
    assert site.payload(OTHER) == "old"


# Refusals: failed with the one line, nothing built, nothing changed.
REFUSALS = {
    "installpath backend": (
        {"backend": "installpath"},
        "with_dependants needs the bwrap or userns backend: each dependant is built against the new "
        "builds at their live paths, which only a sandbox shows (backend installpath builds elsewhere)",
    ),
    "two modules": (
        {"modules": [LIB, OTHER]},
        "with_dependants takes exactly one modules (the package whose dependants are rebuilt), not 2",
    ),
    "exclude of a package built on nothing of it": (
        {"exclude": [OTHER]},
        f"exclude {OTHER} is not a dependant of {LIB}; a dry run shows the plan and its members",
    ),
    "exclude of the named module": (
        {"exclude": [LIB]},
        f"exclude {LIB} is the module named by modules; rebuild without it instead",
    ),
    "exclude without with_dependants": (
        {"with_dependants": False, "exclude": [APP]},
        "exclude goes with with_dependants",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_a_refused_chain_request_fails_with_one_line_and_changes_nothing(chain, capsys, case, check_mode):
    site, easyconfig, calls_log = chain
    options, message = REFUSALS[case]
    before = disk(site)

    result = run_module(capsys, staged_rebuild, _args(site, easyconfig, **options), check_mode=check_mode)

    assert_failed_with(result, message, "usage")
    assert disk(site) == before
    assert not calls_log.exists()


# rebuild: changed


def test_rebuild_changed_rebuilds_the_chain_when_the_named_module_changed_and_not_again(
    chain, capsys, tmp_path
):
    site, easyconfig, calls_log = chain
    # The chain live as this EasyBuild built it (each install's log records it), TinyLib from
    # this easyconfig.
    eb = versioned_eb.make_eb(tmp_path, versioned_eb.EB_VERSION)
    built = subprocess.run(
        [str(eb), f"--installpath={site.installpath}", "TinyLib-1.0.eb", "TinyApp-1.0.eb", "TinyTop-1.0.eb"],
        env={**os.environ, "FAKE_EB_PAYLOAD": "old", "FAKE_EB_ARGS_LOG": os.devnull},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    easyconfig.write_bytes((site.live(LIB) / "easybuild" / "TinyLib-1.0.eb").read_bytes())
    args = _args(site, easyconfig, eb=str(eb), rebuild="changed")
    before = disk(site)
    inodes = {module: site.live(module).stat().st_ino for module in (LIB, APP, TOP, OTHER)}

    same = run_module(capsys, staged_rebuild, args)
    same_predicted = run_module(capsys, staged_rebuild, args, check_mode=True)
    assert disk(site) == before
    easyconfig.write_text(easyconfig.read_text() + "# the fix\n")
    predicted = run_module(capsys, staged_rebuild, args, check_mode=True)
    rebuilt = run_module(capsys, staged_rebuild, args)

    for result in (same, same_predicted):
        assert (result["changed"], result["state"]) == (False, "up_to_date")
        assert result["up_to_date"] == [
            {"module": module, "up_to_date": True, "why": "same easyconfig and EasyBuild"}
            for module in (LIB, APP, TOP)
        ]
    assert predicted["changed"] is True
    assert _text(predicted["plan"], site, easyconfig) == EXPECTED_PLAN
    assert (rebuilt["changed"], rebuilt["state"]) == (True, "published")
    assert [entry["up_to_date"] for entry in rebuilt["up_to_date"]] == [False, True, True]
    assert rebuilt["up_to_date"][0]["why"].endswith("differs from the requested easyconfig")
    assert [entry["module"] for entry in rebuilt["modules"]] == [LIB, APP, TOP]
    for module in (LIB, APP, TOP):
        assert site.live(module).stat().st_ino != inodes[module]
    assert site.live(OTHER).stat().st_ino == inodes[OTHER]
    assert len(calls_log.read_text().splitlines()) == 1
