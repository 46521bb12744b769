"""What users pass to ``eb-staged-rebuild``: sealed installs, the option filter, dry runs, probe.

All with the real EasyBuild and Lmod. The option filter is proven where it matters: an
option (or its ``EASYBUILD_*`` twin) that tries to send the build elsewhere points at a
canary directory, and after a real rebuild the canary is still empty while the rebuild
published. EasyBuild's own state (build directories, the easyconfig repository) is left to
its defaults there, so a ``--prefix`` that got through would show up in the canary.
"""

from __future__ import annotations

import json
import os
import stat
from importlib import metadata

import pytest

import tinypkgs
from tests.integration.harness.ebsite import LIB, OWNERS, failure_cases, result_json
from tests.support.staged import snapshot

NEW_GREETING = "hello from TinyLib 1.0, second generation"
BACKENDS = ("bwrap", "userns", "installpath")
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
SEALED = "--read-only-installdir"
# The options the filter removes, each with a value that points at the canary (None: a flag).
REMOVED = {
    "--installpath": "{canary}",
    "--installpath-software": "{canary}/software",
    "--installpath-modules": "{canary}/modules",
    # A subdirectory that is absolute replaces the install path it is joined to.
    "--subdir-software": "{canary}/subdir-software",
    "--subdir-modules": "{canary}/subdir-modules",
    "--bwrap-installpath": "{canary}",
    "--remove-ghost-install-dirs": None,
}
# EasyBuild's build directories and easyconfig repository at their defaults (under the
# prefix), so that a prefix decides where they go.
EB_STATE_AT_DEFAULTS = {"EASYBUILD_BUILDPATH": None, "EASYBUILD_REPOSITORYPATH": None}
TOOL_DEFAULTS = ("EASYBUILD_INSTALLPATH_SOFTWARE", "EASYBUILD_INSTALLPATH_MODULES")
ENVIRONMENT = {
    "EASYBUILD_INSTALLPATH": "{canary}",
    "EASYBUILD_INSTALLPATH_SOFTWARE": "{canary}/software",
    "EASYBUILD_INSTALLPATH_MODULES": "{canary}/modules",
    "EASYBUILD_SUBDIR_SOFTWARE": "{canary}/subdir-software",
    "EASYBUILD_SUBDIR_MODULES": "{canary}/subdir-modules",
    "EASYBUILD_BWRAP_INSTALLPATH": "{canary}",
    "EASYBUILD_REMOVE_GHOST_INSTALL_DIRS": "1",
}


def _option_cases():
    cases = []
    for option, value in REMOVED.items():
        if value is None:
            cases.append(pytest.param((option,), id=option))
            continue
        cases.append(pytest.param((f"{option}={value}",), id=f"{option}=value"))
        cases.append(pytest.param((option, value), id=f"{option} value"))
    return cases


OPTION_CASES = _option_cases()


def _lib_site(eb_site_factory, owner, eb_args=()):
    """A site with TinyLib built live by plain eb (first generation) and a second generation written."""
    site = eb_site_factory(owner)
    old = site.write_packages("gen1")
    site.install(old, tinypkgs.LIB, eb_args=eb_args)
    return site, site.write_packages("gen2", greeting=NEW_GREETING)


def _greeting(site):
    return site.module_shell(f'module load {LIB} && cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"')


def _write_bits(root):
    """Every entry under ``root`` (itself included) that has a write bit, with its mode.

    EasyBuild writes its test report (``easybuild/*_test_report.md``) after it sealed the
    install, so even a plain ``eb --read-only-installdir`` leaves that one file writable.
    """
    found = []
    for path in [root, *root.rglob("*")]:
        info = os.lstat(path)
        if path.name.endswith("_test_report.md") and path.parent.name == "easybuild":
            continue
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & WRITE_BITS:
            found.append((str(path), oct(stat.S_IMODE(info.st_mode))))
    return found


# --- a sealed install ---------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "owner"), failure_cases(BACKENDS))
def test_a_sealed_install_is_rebuilt_and_published_sealed(eb_site_factory, backend, owner):
    site, new = _lib_site(eb_site_factory, owner, eb_args=(SEALED,))
    assert _write_bits(site.live(LIB)) == []  # plain eb sealed the live install
    old_inode = site.live(LIB).stat().st_ino

    result = result_json(site.rebuild((LIB,), new, backend=backend, eb_args=(SEALED,)))

    assert result["state"] == "published"
    assert site.live(LIB).stat().st_ino != old_inode
    assert _greeting(site).stdout.strip() == NEW_GREETING
    assert _write_bits(site.live(LIB)) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sealed_rebuild_rolls_back_to_the_sealed_old_tree(eb_site_factory, backend):
    site, new = _lib_site(eb_site_factory, "user", eb_args=(SEALED,))
    old_inode = site.live(LIB).stat().st_ino
    old_tree = site.snapshot_of(site.live(LIB))
    old_module = site.module_file(LIB).read_bytes()
    published = result_json(site.rebuild((LIB,), new, backend=backend, eb_args=(SEALED,)))
    retired = published["modules"][0]["retired_path"]

    rolled_back = result_json(site.run_tool("--json", "rollback", published["run_id"], packages=new))

    assert rolled_back["changed"] is True
    assert site.live(LIB).stat().st_ino == old_inode
    assert site.snapshot_of(site.live(LIB)) == old_tree
    assert site.module_file(LIB).read_bytes() == old_module
    assert _greeting(site).stdout.strip() == tinypkgs.GREETING
    # The rebuilt tree went to the retired path, where it stays for gc.
    assert os.path.isfile(os.path.join(retired, "share", "tinylib", "greeting.txt"))


# --- the option filter with real EasyBuild ------------------------------------------------


def _canary(site):
    canary = site.scratch("canary")
    return canary, lambda text: text.format(canary=canary)


def _option_forms():
    """Every removed option in one run, each form of writing its value in a run of its own.

    Which option the filter removes, in each form, is the unit tests' (test_easybuild.py, a
    case per option and form); these show, with real EasyBuild, that what it removes cannot
    send the build elsewhere: any one that got through would write into the canary.
    """
    forms = {"OPTION=VALUE": [], "OPTION VALUE": []}
    for case in OPTION_CASES:
        args = case.values[0]
        forms["OPTION VALUE" if len(args) == 2 else "OPTION=VALUE"].append(args)
    # A flag has no value: it goes with both.
    flags = [args for args in forms["OPTION=VALUE"] if "=" not in args[0]]
    forms["OPTION VALUE"] += flags
    return [pytest.param([arg for args in cases for arg in args], id=form) for form, cases in forms.items()]


@pytest.mark.parametrize("user_args", _option_forms())
def test_the_removed_options_do_not_change_where_the_build_writes(eb_site_factory, user_args):
    site, new = _lib_site(eb_site_factory, "user")
    canary, at_canary = _canary(site)
    eb_args = [at_canary(arg) for arg in user_args]
    args = site.rebuild_args((LIB,), new, backend="userns", eb_args=eb_args)

    done = site.run_tool(*args, packages=new, env=EB_STATE_AT_DEFAULTS)

    result = result_json(done)
    assert result["state"] == "published"
    assert _greeting(site).stdout.strip() == NEW_GREETING
    assert sorted(os.listdir(canary)) == []


# The variables of the removed options: the tool's own defaults (which it sets) one at a time,
# the others together (which of them the filter removes is the unit tests').
VARIABLE_CASES = [
    *(pytest.param([name], id=name) for name in TOOL_DEFAULTS),
    pytest.param(sorted(set(ENVIRONMENT) - set(TOOL_DEFAULTS)), id="the-others"),
]


@pytest.mark.parametrize("variables", VARIABLE_CASES)
def test_the_easybuild_variables_of_removed_options_do_not_change_where_the_build_writes(
    eb_site_factory, variables
):
    site, new = _lib_site(eb_site_factory, "user")
    canary, at_canary = _canary(site)
    env = dict(EB_STATE_AT_DEFAULTS)
    env.update({variable: at_canary(ENVIRONMENT[variable]) for variable in variables})
    args = site.rebuild_args((LIB,), new, backend="userns")

    done = site.run_tool(*args, packages=new, env=env)

    result = result_json(done)
    assert result["state"] == "published"
    assert _greeting(site).stdout.strip() == NEW_GREETING
    assert sorted(os.listdir(canary)) == []


# What the prefix places, at its defaults: EasyBuild's own state, never an install.
PREFIX_STATE = {"build", "ebfiles_repo"}


@pytest.mark.parametrize("given_as", ["option", "variable"])
def test_the_prefix_reaches_easybuild_for_its_state_but_installs_stay_staged(eb_site_factory, given_as):
    site, new = _lib_site(eb_site_factory, "user")
    canary, _at_canary = _canary(site)
    env = dict(EB_STATE_AT_DEFAULTS)
    eb_args = ()
    if given_as == "option":
        eb_args = (f"--prefix={canary}",)
    else:
        env["EASYBUILD_PREFIX"] = str(canary)
    args = site.rebuild_args((LIB,), new, backend="userns", eb_args=eb_args)

    done = site.run_tool(*args, packages=new, env=env)

    result = result_json(done)
    assert result["state"] == "published"
    assert _greeting(site).stdout.strip() == NEW_GREETING
    # The repository got the rebuilt easyconfig under the prefix; no install went there.
    assert set(os.listdir(canary)) <= PREFIX_STATE | {"tmp"}, os.listdir(canary)
    assert (canary / "ebfiles_repo" / tinypkgs.LIB).is_dir()


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_removed_options_and_variables_at_once_leave_the_canary_empty(eb_site_factory, backend):
    """Every option and variable together, for each backend.

    Not the tool's own defaults EASYBUILD_INSTALLPATH_SOFTWARE/_MODULES: they have cases of
    their own above, and here they would decide where the live tree is before any build.
    """
    site, new = _lib_site(eb_site_factory, "user")
    canary, at_canary = _canary(site)
    eb_args = [at_canary(arg) for case in OPTION_CASES for arg in case.values[0]]
    env = dict(EB_STATE_AT_DEFAULTS)
    env.update({name: at_canary(value) for name, value in ENVIRONMENT.items() if name not in TOOL_DEFAULTS})
    args = site.rebuild_args((LIB,), new, backend=backend, eb_args=eb_args)

    done = site.run_tool(*args, packages=new, env=env)

    assert result_json(done)["backend"] == backend
    assert _greeting(site).stdout.strip() == NEW_GREETING
    assert sorted(os.listdir(canary)) == []


# --- dry run ------------------------------------------------------------------------------


def _dry_run_state(site, canary):
    return snapshot(site.software, site.modules, site.state_root, canary)


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_dry_run_prints_the_filtered_command_and_writes_nothing(eb_site_factory, backend):
    site, new = _lib_site(eb_site_factory, "user")
    canary, at_canary = _canary(site)
    removed = [at_canary(arg) for case in OPTION_CASES for arg in case.values[0]]
    eb_args = ["--robot", *removed]
    before = _dry_run_state(site, canary)

    done = site.rebuild((LIB,), new, backend=backend, eb_args=eb_args, extra=("--dry-run",))

    result = result_json(done)
    command = result["command"]
    assert command[0] == str(site.eb)
    assert "--rebuild" in command
    assert "--robot" in command
    assert str(new.easyconfig(tinypkgs.LIB)) in command
    assert [arg for arg in command if str(canary) in arg] == []
    assert [arg for arg in removed if arg in command] == []
    assert (result["changed"], result["backend"]) == (False, "bwrap" if backend == "auto" else backend)
    assert _dry_run_state(site, canary) == before
    assert site.journals() == []


def test_dry_run_keeps_a_forcing_option_of_the_user_instead_of_adding_rebuild(eb_site_factory):
    site, new = _lib_site(eb_site_factory, "user")

    done = site.rebuild((LIB,), new, backend="userns", eb_args=("--force",), extra=("--dry-run",))

    command = result_json(done)["command"]
    assert "--force" in command
    assert "--rebuild" not in command


def test_dry_run_without_json_prints_the_command_in_text(eb_site_factory):
    site, new = _lib_site(eb_site_factory, "user")
    before = site.snapshot()

    done = site.rebuild((LIB,), new, backend="userns", extra=("--dry-run",), json_output=False)

    assert done.returncode == 0, done.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)
    assert str(site.eb) in done.stdout
    assert "--rebuild" in done.stdout
    assert site.snapshot() == before
    assert site.journals() == []


# --- probe --------------------------------------------------------------------------------


def _probe(site, path, json_output=False):
    """``eb-staged-rebuild [--json] probe --path PATH`` as the site's user."""
    args = ["--json"] if json_output else []
    return site.run_tool(*args, "probe", "--path", str(path), f"--eb={site.eb}", packages=None)


def _listing(path):
    return sorted(os.listdir(path))


@pytest.mark.parametrize("owner", OWNERS)
def test_probe_reports_the_exchange_and_bwrap_as_the_auto_backend(eb_site_factory, tmp_path, owner):
    site = eb_site_factory(owner)
    where = tmp_path if owner == "root" else site.scratch("probed")
    before = _listing(where)

    report = result_json(_probe(site, where, json_output=True))

    assert report["path"] == str(where)
    assert (report["exchange"], report["exchange_errno"]) == (True, None)
    assert (report["bwrap"], report["userns"], report["auto_backend"]) == (True, True, "bwrap")
    assert isinstance(report["max_user_namespaces"], int)
    assert report["max_user_namespaces"] > 0
    assert report["easybuild_version"] == metadata.version("easybuild-framework")
    assert isinstance(report["filesystem"], str)
    assert report["filesystem"]
    assert report["changed"] is False
    assert isinstance(report["recommendations"], list)
    assert not any("directory exchange" in line for line in report["recommendations"])
    assert _listing(where) == before


def test_probe_reports_no_exchange_with_einval_on_a_fuse_mount(eb_site_factory, fuse_dir):
    site = eb_site_factory("root")

    report = result_json(_probe(site, fuse_dir, json_output=True))

    assert report["path"] == str(fuse_dir)
    assert (report["exchange"], report["exchange_errno"]) == (False, "EINVAL")
    assert report["filesystem"].startswith("fuse")
    assert report["auto_backend"] == "bwrap"
    assert any("EINVAL" in line for line in report["recommendations"]), report["recommendations"]
    assert _listing(fuse_dir) == []


def test_probe_recommends_a_validated_easybuild_when_this_one_is_older(eb_site_factory, tmp_path):
    site = eb_site_factory("root")

    report = result_json(_probe(site, tmp_path, json_output=True))

    version = tuple(int(part) for part in metadata.version("easybuild-framework").split("."))
    pinned = [line for line in report["recommendations"] if line.startswith("EasyBuild")]
    assert len(pinned) == (1 if version < (5, 4, 1) else 0), report["recommendations"]


@pytest.mark.parametrize("mount", ["tmp", "fuse"])
def test_probe_prints_text_without_json(eb_site_factory, tmp_path, fuse_dir, mount):
    site = eb_site_factory("root")
    where = tmp_path if mount == "tmp" else fuse_dir

    done = _probe(site, where)

    assert done.returncode == 0, done.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)
    assert str(where) in done.stdout
    exchange = "works" if mount == "tmp" else "fails (EINVAL)"
    assert f"\nExchange:    {exchange}\n" in done.stdout, done.stdout
    assert "\nBackend:     auto picks bwrap\n" in done.stdout, done.stdout


def test_probe_takes_json_after_its_path_as_documented(eb_site_factory, tmp_path):
    """The command surface documents ``eb-staged-rebuild probe --path DIR [--json]``."""
    site = eb_site_factory("root")

    done = site.run_tool("probe", "--path", str(tmp_path), f"--eb={site.eb}", "--json", packages=None)

    report = result_json(done)
    assert (report["path"], report["exchange"]) == (str(tmp_path), True)
