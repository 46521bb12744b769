"""What ``runs/`` holds besides runs is listed, never skipped without a word and never read.

A partial list never hides a run: ``status`` and ``gc`` once passed over a ``runs/<id>`` that
is a symbolic link and the ``.creating-*`` leftovers of an interrupted creation. Now each is
listed under ``incomplete`` with its ``kind`` (``unreadable``, ``leftover``) and what to do
(exit 1, a warning), no journal is read through the link, and ``status``/``resume`` of the
link's run id refuse in one line.

The entries are planted by a real process of another uid, in a state root whose ``runs/``
others may write (shared with a build group, say: the tool does not require it to be
root's alone). What the link points to is a journal that would load, of a run left
``publishing``: read through the link, ``resume`` would act on it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.harness.staged_checks import PREFIX, refusal_line, run_tool
from tests.support.staged import StagedSite

APP = "TinyApp/1.0"
LEFTOVER = ".creating-0badc0de"
# The attacker's script: a directory of its own holding run "r2" with the forged journal,
# a link runs/r2 to it, and a creation's leftover beside; argv: forged journal, runs/.
PLANT = r"""
set -e
own=$(mktemp -d /tmp/hpcstack-planted-XXXXXX)
chmod 755 "$own"
mkdir "$own/r2"
cp "$1" "$own/r2/journal.json"
ln -s "$own/r2" "$2/r2"
mkdir "$2/.creating-0badc0de"
echo "$own"
"""


@pytest.fixture
def scratch():
    """A directory under /tmp that every user may search (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="hpcstack-unlisted-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def planted(scratch, package_root, attacker_user):
    """A site with the published run ``r1``, then the attacker's link and leftover in ``runs/``."""
    site = StagedSite(installpath=scratch / "apps", state_root=scratch / "state", package_root=package_root)
    site.install(APP)
    published = run_tool(site, site.rebuild_args(APP, extra=("--run-id", "r1")))
    assert published.returncode == 0, published.stderr
    runs = site.state_root / "runs"
    site.state_root.chmod(0o755)
    runs.chmod(0o1777)
    forged = json.loads((runs / "r1" / "journal.json").read_text())
    forged.update(run_id="r2", state="publishing")
    (scratch / "forged.json").write_text(json.dumps(forged))
    (scratch / "forged.json").chmod(0o644)

    done = attacker_user.run(["sh", "-c", PLANT, "plant", str(scratch / "forged.json"), str(runs)])

    assert done.returncode == 0, done.stderr
    own = Path(done.stdout.strip())
    assert (runs / "r2").is_symlink()
    assert (runs / LEFTOVER).stat().st_uid == attacker_user.uid
    yield site
    shutil.rmtree(own, ignore_errors=True)


def _unlisted(result) -> dict:
    return {Path(entry["path"]).name: entry for entry in result["incomplete"]}


def test_status_lists_a_planted_link_as_unreadable_and_a_leftover_as_such(planted):
    runs = planted.state_root / "runs"

    done = run_tool(planted, ["--json", "status"])

    assert done.returncode == 1, done.stderr  # a warning: something there is not a run
    result = json.loads(done.stdout)
    assert [run["run_id"] for run in result["runs"]] == ["r1"]
    unlisted = _unlisted(result)
    assert sorted(unlisted) == [LEFTOVER, "r2"]
    link, leftover = unlisted["r2"], unlisted[LEFTOVER]
    assert (link["path"], link["run_id"], link["kind"]) == (str(runs / "r2"), "r2", "unreadable")
    assert "symbolic link" in link["why"]
    assert "remove the link by hand" in link["why"]
    assert (leftover["path"], leftover["run_id"], leftover["kind"]) == (
        str(runs / LEFTOVER),
        None,
        "leftover",
    )
    assert "interrupted" in leftover["why"]
    assert "remove it by hand" in leftover["why"]


def test_status_in_words_names_each_with_what_to_do(planted):
    done = run_tool(planted, ["status"])

    assert done.returncode == 1, done.stderr
    words = " ".join(done.stdout.split())
    assert f"unreadable: {planted.state_root / 'runs' / 'r2'}" in words
    assert f"leftover: {planted.state_root / 'runs' / LEFTOVER}" in words
    assert "remove the link by hand" in words
    assert "remove it by hand" in words


def test_gc_lists_them_and_removes_neither(planted):
    runs = planted.state_root / "runs"

    done = run_tool(planted, ["--json", "gc", "--grace-hours", "0", "--no-squeue"])

    assert done.returncode == 1, done.stderr
    unlisted = _unlisted(json.loads(done.stdout))
    assert {name: entry["kind"] for name, entry in unlisted.items()} == {
        "r2": "unreadable",
        LEFTOVER: "leftover",
    }
    assert (runs / "r2").is_symlink()
    assert (runs / LEFTOVER).is_dir()


@pytest.mark.parametrize("command", ["status", "resume"])
def test_the_link_s_run_id_is_refused_in_one_line_and_nothing_is_read_through_it(planted, command):
    link = planted.state_root / "runs" / "r2"
    target = os.readlink(link)
    before = (Path(target) / "journal.json").read_bytes()

    done = run_tool(planted, [command, "r2"])

    assert refusal_line(done).startswith(
        f"{PREFIX}run r2: {link} is a symbolic link where a run directory should be"
    )
    assert (Path(target) / "journal.json").read_bytes() == before
    assert planted.payload(APP) == "new build"


def test_resume_of_every_run_leaves_the_planted_interrupted_run_alone(planted):
    target = Path(os.readlink(planted.state_root / "runs" / "r2"))
    before = (target / "journal.json").read_bytes()

    done = run_tool(planted, ["--json", "resume"])

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed"] is False
    assert (target / "journal.json").read_bytes() == before
    assert planted.payload(APP) == "new build"
