"""The keys of each subcommand's ``--json`` document are the ones the JSON table of
docs/reference/eb-staged-rebuild.md lists for it: every key a run prints is in its row,
and every key of the row that the table does not give as conditional is printed.

Each subcommand that needs no Slurm job runs in-process on a site the test builder
(``tests/builders/fake-eb``) installs; ``rebuild --job``, ``publish`` and ``discard`` act on
runs of Slurm jobs, whose documents the job tests read.
"""

from __future__ import annotations

import json
import re

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli
from tests.support.staged import FAKE_EB, StagedSite

REFERENCE = checkout.REPO / "docs" / "reference" / "eb-staged-rebuild.md"
APP = "TinyApp/1.0"
# A cell's names are in backquotes; an option (`--dry-run`) names a case, not a key.
_NAME = re.compile(r"`([a-z_]+)`")


def json_table() -> dict:
    """Each row of the JSON table: ``{subcommand: (keys, conditional keys)}``. A key is
    conditional when the cell gives it after a ``;`` (``; with --dry-run, would_change``) or
    follows it with ``(only when``; what a parenthesis holds otherwise describes the key."""
    section = REFERENCE.read_text().split("\n## JSON\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        command, keys = cells[0].strip("`"), cells[1]
        conditional = (
            set(_NAME.findall(re.sub(r"\([^()]*\)", "", keys.split(";", 1)[1]))) if ";" in keys else set()
        )
        conditional |= set(re.findall(r"`([a-z_]+)` \(only when", keys))
        rows[command] = (set(_NAME.findall(re.sub(r"\([^()]*\)", "", keys))), conditional)
    return rows


@pytest.fixture(scope="module")
def table():
    return json_table()


@pytest.fixture
def site(tmp_path, monkeypatch):
    for name in ("EB_STAGED_REBUILD_STATE_ROOT", "EB_STAGED_REBUILD_EB", "EB_STAGED_REBUILD_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    site = StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=tmp_path)
    site.install(APP)
    return site


def _json(capsys, site, *args) -> dict:
    cli.main(["--state-root", str(site.state_root), "--json", *args])
    return json.loads(capsys.readouterr().out)


def _rebuild(site, *extra):
    return [
        "rebuild",
        f"--installpath={site.installpath}",
        f"--module={APP}",
        f"--eb={FAKE_EB}",
        "--run-id=run1",
        "--backend=installpath",
        *extra,
        "--",
        "TinyApp-1.0.eb",
    ]


def test_the_table_parses_into_a_row_per_subcommand(table):
    assert set(table) == {
        "status",
        "status RUN",
        "rebuild",
        "rebuild --dry-run",
        "rebuild --job",
        "rollback",
        "retire",
        "resume",
        "gc",
        "probe",
        "publish",
        "discard",
    }
    assert table["gc"][1] == {"would_change"}
    assert table["rebuild"][1] == {"warnings"}
    assert "target" not in table["rebuild --job"][0]  # a key of each job, not of the document


def test_each_subcommand_prints_the_keys_its_row_lists(site, capsys, table):
    printed = {
        "rebuild --dry-run": [_json(capsys, site, *_rebuild(site, "--dry-run"))],
        "rebuild": [_json(capsys, site, *_rebuild(site))],
        "status": [_json(capsys, site, "status")],
        "status RUN": [_json(capsys, site, "status", "run1")],
    }
    printed["rollback"] = [_json(capsys, site, "rollback", "run1")]
    module_file = site.installpath / "modules" / "all" / "TinyApp" / "1.0.lua"
    retired = _json(capsys, site, "retire", str(module_file), "--reason", "on CVMFS")
    printed["retire"] = [retired]
    printed["rollback"].append(_json(capsys, site, "rollback", retired["run_id"]))
    printed["resume"] = [_json(capsys, site, "resume")]
    printed["gc"] = [
        _json(capsys, site, "gc", "--no-squeue", "--dry-run"),
        _json(capsys, site, "gc", "--no-squeue", "--grace-hours", "0"),
    ]
    printed["probe"] = [_json(capsys, site, "probe", "--path", str(site.installpath / "software"))]

    for command, documents in printed.items():
        keys, conditional = table[command]
        seen = set().union(*documents)
        assert seen - keys == set(), f"{command}: printed but not in the table"
        assert keys - conditional - seen == set(), f"{command}: in the table but not printed"
