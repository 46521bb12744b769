"""The staged_rebuild module with the real EasyBuild: ``rebuild: changed`` against real installs.

What ``rebuild: changed`` compares is what EasyBuild itself records in an install (the copy of
the easyconfig and the version in its log), so it is checked here on installs that the real
EasyBuild made: plain ``eb`` first, then the module's own staged build (userns backend). The
module runs in this process with the build environment of the site as the host's
environment, so the install path and ``eb`` come from there (EASYBUILD_INSTALLPATH, PATH), as
they would on a build host.
"""

from __future__ import annotations

import os

import tinypkgs
from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.integration.harness.ebsite import LIB
from tests.support.module_runner import run_module

NEW_GREETING = "hello from TinyLib 1.0, second generation"
GREETING_SCRIPT = f'module load {LIB} && cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"'


def use_environment(monkeypatch, env):
    """Make ``env`` the whole environment of this process for the test."""
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_rebuild_changed_compares_with_what_the_real_easybuild_recorded(eb_site_factory, monkeypatch, capsys):
    site = eb_site_factory("root")
    first = site.write_packages("gen1")
    site.install(first, tinypkgs.LIB)
    old_inode = site.live(LIB).stat().st_ino
    use_environment(monkeypatch, site.eb_env(first))
    args = {
        "state_root": str(site.state_root),
        "modules": [LIB],
        "easyconfigs": [str(first.easyconfig(tinypkgs.LIB))],
        "backend": "userns",
    }

    same = run_module(capsys, staged_rebuild, args)

    assert (same["changed"], same["state"]) == (False, "up_to_date")
    assert same["up_to_date"] == [{"module": LIB, "up_to_date": True, "why": "same easyconfig and EasyBuild"}]
    assert site.live(LIB).stat().st_ino == old_inode

    second = site.write_packages("gen2", greeting=NEW_GREETING)
    use_environment(monkeypatch, site.eb_env(second))  # its sources
    args["easyconfigs"] = [str(second.easyconfig(tinypkgs.LIB))]
    predicted = run_module(capsys, staged_rebuild, args, check_mode=True)
    rebuilt = run_module(capsys, staged_rebuild, args)
    again = run_module(capsys, staged_rebuild, args)

    assert predicted["changed"] is True
    assert (rebuilt["changed"], rebuilt["state"], rebuilt["backend"]) == (True, "published", "userns")
    assert rebuilt["up_to_date"][0]["why"].endswith("differs from the requested easyconfig")
    assert rebuilt["modules"][0]["stable_path"] == str(site.live(LIB))
    assert any(line.startswith("== COMPLETED") for line in rebuilt["progress"])
    assert site.live(LIB).stat().st_ino != old_inode
    assert site.module_shell(GREETING_SCRIPT).stdout.strip() == NEW_GREETING
    assert (again["changed"], again["state"]) == (False, "up_to_date")
