"""Real EasyBuild builds the tiny dependency chain, and real Lmod loads the result."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess

import tinypkgs
from tests.integration.harness.ebsite import BuiltTrees


def _module_shell(easybuild, installpath, script):
    env = easybuild.lmod.env([installpath / "modules" / "all"])
    return subprocess.run(
        easybuild.lmod.shell_command(script), env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_easybuild_builds_the_dependency_chain_and_module_load_runs_its_program(easybuild, tmp_path):
    live = tmp_path / "live"
    done = easybuild.build(live, str(easybuild.packages.easyconfig(tinypkgs.APP)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Build succeeded for 2 out of 2" in done.stdout

    for name in (tinypkgs.LIB, tinypkgs.APP):
        install = live / "software" / name / tinypkgs.VERSION
        assert (install / "easybuild" / f"{name}-{tinypkgs.VERSION}.eb").is_file()
        modulefile = live / "modules" / "all" / name / f"{tinypkgs.VERSION}.lua"
        assert f'local root = "{install}"' in modulefile.read_text()
    app_module = (live / "modules" / "all" / tinypkgs.APP / f"{tinypkgs.VERSION}.lua").read_text()
    assert f'depends_on("{tinypkgs.LIB}/{tinypkgs.VERSION}")' in app_module

    loaded = _module_shell(easybuild, live, f"module load {tinypkgs.APP}/{tinypkgs.VERSION} && tinyapp")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == tinypkgs.GREETING


def test_lmod_loads_the_dependency_with_the_module(easybuild, tmp_path):
    live = tmp_path / "live"
    assert easybuild.build(live, str(easybuild.packages.easyconfig(tinypkgs.APP))).returncode == 0

    listed = _module_shell(easybuild, live, f"module load {tinypkgs.APP} && echo $LOADEDMODULES")
    assert listed.stdout.strip().split(":") == [
        f"{tinypkgs.LIB}/{tinypkgs.VERSION}",
        f"{tinypkgs.APP}/{tinypkgs.VERSION}",
    ]


def test_lmod_refuses_a_module_that_is_not_installed(easybuild, tmp_path):
    (tmp_path / "modules" / "all").mkdir(parents=True)
    missing = _module_shell(easybuild, tmp_path, f"module load {tinypkgs.APP} && echo loaded")
    assert "loaded" not in missing.stdout
    assert "unknown" in missing.stderr.lower() or "not found" in missing.stderr.lower(), missing.stderr


def test_easybuild_refuses_a_source_whose_checksum_does_not_match(easybuild, tmp_path):
    easyconfig = tmp_path / f"{tinypkgs.LIB}-{tinypkgs.VERSION}.eb"
    original = easybuild.packages.easyconfig(tinypkgs.LIB).read_text()
    checksum = original.split("checksums = ['")[1].split("'")[0]
    easyconfig.write_text(original.replace(checksum, "0" * 64))
    live = tmp_path / "live"

    done = easybuild.build(live, str(easyconfig))

    assert done.returncode != 0
    assert "checksum" in (done.stdout + done.stderr).lower()
    # EasyBuild leaves the empty directories it created, but no module file and no install.
    assert not (live / "modules" / "all" / tinypkgs.LIB / f"{tinypkgs.VERSION}.lua").exists()
    assert not any((live / "software" / tinypkgs.LIB / tinypkgs.VERSION).iterdir())


# --- the live trees the staged tests copy instead of building again -----------------------

# What differs between two real builds of the same packages in the same place: the time in
# the names of EasyBuild's logs, and its records of the run (logs, test reports, the copy of
# the easyconfig with the build's statistics, the reproducibility files).
BUILD_TIME = re.compile(r"\d{8}\.\d{6}")
RUN_RECORDS = re.compile(r"(\.log|_test_report\.md)$|^eb-state/ebfiles_repo/|/easybuild/reprod/")


def _record(site) -> dict:
    """Every entry EasyBuild wrote in ``site``: type, mode, owner, modification time, and
    symlink target or bytes, by its path (the time in a log's name taken out)."""
    record = {}
    for tree in BuiltTrees.TREES:
        top = site.root / tree
        for path in [top, *sorted(top.rglob("*"))]:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                content = path.read_bytes()
            else:
                content = None
            name = BUILD_TIME.sub("<time>", str(path.relative_to(site.root)))
            record[name] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, content)
            record[name + " mtime"] = info.st_mtime_ns
    return record


def _start_again(site) -> None:
    for tree in BuiltTrees.TREES:
        shutil.rmtree(site.root / tree)


def test_a_live_tree_copied_into_a_later_site_is_what_eb_built_there(eb_site_factory, tmp_path):
    """The staged tests' sites get the live tree plain ``eb`` built in an earlier test's site
    at the same place, copied (``BuiltTrees``): every entry, its type, mode, owner, time and
    bytes as that build left them; it differs from a new build there only in EasyBuild's
    records of the run."""
    built = BuiltTrees(tmp_path)
    site = eb_site_factory("user")
    site.built = built
    packages = site.write_packages("gen1")
    site.install(packages, tinypkgs.APP)  # built, and kept
    kept = _record(site)
    _start_again(site)
    site.built = None
    site.install(packages, tinypkgs.APP)  # built again
    again = _record(site)
    _start_again(site)
    site.built = built
    site.install(packages, tinypkgs.APP)  # copied
    copied = _record(site)

    assert copied == kept
    assert sorted(again) == sorted(copied)
    differ = {name for name in copied if not name.endswith(" mtime") and again[name] != copied[name]}
    assert differ, "two builds of the same packages are expected to differ in their logs"
    assert [name for name in differ if not RUN_RECORDS.search(name)] == []
    shown = site.module_shell(f"module load {tinypkgs.APP}/{tinypkgs.VERSION} && tinyapp")
    assert (shown.returncode, shown.stdout.strip()) == (0, tinypkgs.GREETING), shown.stderr


def test_a_site_elsewhere_or_with_other_packages_gets_a_build_of_its_own(eb_site_factory, tmp_path):
    built = BuiltTrees(tmp_path)
    first = eb_site_factory("root")
    first.built = built
    first.install(first.write_packages("gen1"), tinypkgs.LIB)
    elsewhere = eb_site_factory("root")  # the first is still there: another directory
    elsewhere.built = built
    elsewhere.install(elsewhere.write_packages("gen1"), tinypkgs.LIB)
    _start_again(first)
    first.install(first.write_packages("other", greeting="another greeting"), tinypkgs.LIB)

    assert elsewhere.root != first.root
    assert len(built.kept) == 3
    for site, greeting in ((elsewhere, tinypkgs.GREETING), (first, "another greeting")):
        shown = site.module_shell(
            f'module load {tinypkgs.LIB} && cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"'
        )
        assert shown.stdout.strip() == greeting, shown.stderr
