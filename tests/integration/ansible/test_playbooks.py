"""The playbooks, run by their full names (``ansible-playbook hpcstack.ops.rebuild``) against
localhost on a live tree built by the real EasyBuild: what they change on disk, what a
second run reports, and what ``--check --diff`` shows without changing anything.

Each test has its own live tree (``eb_site_factory``, as root) with TinyLib and TinyApp
installed by plain ``eb`` from one generation of their easyconfigs; the playbooks rebuild
TinyApp from the next generation, with the userns backend.

A rebuild from an edited easyconfig and a second run that changes nothing, the rollback
that restores the previous inode and its second run, gc that removes the hidden trees and
then has nothing to do, and ``staged_rebuild_when=always`` rebuilding an install that is up
to date (TinyLib's stack run) are the how-to's (test_howto_rebuild_with_ansible.py, which
runs docs/howto/rebuild-with-ansible.md on the demo's tree).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tinypkgs
from localplay import LocalPlaybooks, Play
from tests.integration.harness.ebsite import APP, LIB
from tests.support.staged import snapshot


@pytest.fixture
def live(eb_site_factory, tmp_path):
    """A live tree with TinyLib and TinyApp from one easyconfig, a newer one, and a runner."""
    site = eb_site_factory("root")
    site.install(site.write_packages("gen1"), tinypkgs.APP)
    # The same TinyApp from an edited easyconfig, as a site changes one: the rebuild has work.
    packages = site.write_packages("gen2")
    easyconfig = packages.easyconfig(*APP.split("/"))
    easyconfig.write_text(easyconfig.read_text() + "# rebuilt with the site's new compiler flags\n")
    return Playbooks(site, packages, LocalPlaybooks(tmp_path, site.tool_env(packages)))


class Playbooks:
    """The playbooks on one site's live tree and state root."""

    def __init__(self, site, packages, playbooks: LocalPlaybooks) -> None:
        self.site, self.packages, self.playbooks = site, packages, playbooks

    def run(self, name: str, *extra: str) -> Play:
        return self.playbooks.run(
            name, "-e", "staged_hosts=localhost", "-e", f"staged_state_root={self.site.state_root}", *extra
        )

    def rebuild(self, *extra: str) -> Play:
        wanted = {
            "staged_modules": [APP],
            "staged_easyconfigs": [str(self.packages.easyconfig(*APP.split("/")))],
        }
        return self.run(
            "rebuild",
            "-e",
            f"staged_installpath={self.site.installpath}",
            "-e",
            json.dumps(wanted),
            "-e",
            "staged_backend=userns",
            "-e",
            f"staged_eb={self.site.eb}",
            *extra,
        )


def _inode(path: Path) -> int:
    return os.lstat(path).st_ino


def test_retire_moves_the_module_file_away_and_its_rollback_puts_it_back(live):
    module_file = live.site.module_file(LIB)
    content = module_file.read_bytes()
    retire_vars = ("-e", f"staged_module_file={module_file}", "-e", "staged_reason=replaced by 2.0")

    first = live.run("retire", *retire_vars)
    second = live.run("retire", *retire_vars)
    run_id = next(path.parent.name for path in live.site.journals() if path.parent.name.startswith("retire-"))
    back = live.run("rollback", "-e", f"staged_run_id={run_id}")

    assert (first.done.returncode, first.changed) == (0, 1), first.output
    assert (second.done.returncode, second.changed) == (0, 0), second.output
    assert (back.done.returncode, back.changed) == (0, 1), back.output
    assert module_file.read_bytes() == content


def test_rebuild_with_dependants_in_check_mode_names_the_chain_and_changes_nothing(live):
    """The playbook passes staged_with_dependants on: TinyApp, built on TinyLib, joins the run."""
    wanted = {
        "staged_modules": [LIB],
        "staged_easyconfigs": [str(live.packages.easyconfig(*LIB.split("/")))],
        "staged_with_dependants": True,
    }
    before = snapshot(live.site.root)

    play = live.run(
        "rebuild",
        "--check",
        "-e",
        f"staged_installpath={live.site.installpath}",
        "-e",
        json.dumps(wanted),
        "-e",
        "staged_backend=userns",
        "-e",
        f"staged_eb={live.site.eb}",
        "-e",
        "staged_rebuild_when=always",
    )

    assert (play.done.returncode, play.failed, play.changed) == (0, 0, 1), play.output
    assert f"localhost: would rebuild {LIB}, {APP} (check mode)" in play.stdout, play.output
    assert snapshot(live.site.root) == before


def test_check_and_diff_of_each_playbook_show_the_change_and_change_nothing(live):
    run_id = live.rebuild("-e", "staged_rebuild_when=always").published_run_id()
    module_file = live.site.module_file(LIB)
    before = snapshot(live.site.root)
    live_inode = _inode(live.site.live(APP))

    plays = {
        "rebuild": live.rebuild("--check", "--diff", "-e", "staged_rebuild_when=always"),
        "rollback": live.run("rollback", "--check", "--diff", "-e", f"staged_run_id={run_id}"),
        "retire": live.run(
            "retire", "--check", "--diff", "-e", f"staged_module_file={module_file}", "-e", "staged_reason=x"
        ),
        "gc": live.run("gc", "--check", "--diff", "-e", "staged_grace_hours=0"),
    }

    assert snapshot(live.site.root) == before
    for name, play in plays.items():
        assert (play.done.returncode, play.failed, play.changed) == (0, 0, 1), (name, play.output)
    for name in ("rebuild", "rollback"):
        assert f"-# {APP}: {live.site.live(APP)} inode {live_inode}" in plays[name].stdout, plays[name].output
        assert f"+# {APP}: {live.site.live(APP)} replaced by a new directory" in plays[name].stdout, plays[
            name
        ].output
    assert "+(no module file)" in plays["retire"].stdout
    assert f"localhost: would rebuild {APP} (check mode)" in plays["rebuild"].stdout
