"""Real sites' trees, made with plain ``eb`` from EasyBuild's own test material (the toy
easyconfigs and the sandbox's easyblocks), rebuilt by ``eb-staged-rebuild`` with real
EasyBuild, and loaded afterwards with both module tools, Lmod and Environment Modules 5.

Module syntax: a staged rebuild keeps each live module file's syntax, whatever the site's
default (the harness's EasyBuild environment says ``EASYBUILD_MODULE_SYNTAX=Lua``, EasyBuild
5's own default); a run that asks for the other syntax is refused before EasyBuild starts.

Each live tree is built once per test module (``PristineSite``) and given back as built to
each test that rebuilds in it. Environment Modules 5 reads only Tcl module files, so the
cases that publish and roll back run on a Tcl tree, where both tools load each module; the
Lua cases are loaded by Lmod.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.integration.harness import toysite
from tests.integration.harness.ebsite import EbSite, result_json
from tests.support.module_runner import run_module

TOY = "toy/0.0"
LIBTOY = "libtoy/0.0"
TOY_APP = "toy-app/0.0"
TOY_EXT = "toy/0.0-gompi-2018a-test"  # the toy with extensions (bar, barbar, ...), gompi toolchain
TOY_SAYS = "I'm a toy, and very proud of it."
# Unpatched: its last extension is the toy itself, built again from the source without the patch.
TOY_EXT_SAYS = "I'm a toy, and proud of it."
TOY_APP_SAYS = "Hello from a toy function!"  # libtoy's, linked and loaded
BACKENDS = ["bwrap", "userns"]
# The module's tests run on one xdist worker (--dist loadgroup), which makes its live trees once:
# spread over both workers, each would make them.
pytestmark = pytest.mark.xdist_group("staged_site_layouts")


def _logs(site, module) -> set:
    return {path.name for path in (site.live(module) / "easybuild").glob("easybuild-*.log")}


def _with_toolchains(site, material) -> dict:
    """``MODULEPATH``: the live modules, then the material's fake toolchains (gompi/2018a)."""
    return {"MODULEPATH": f"{site.modules_all}:{toysite.fake_toolchain_modules(material)}"}


def _assert_loads(site, tool, module, command, expected, *, modulepath=()) -> None:
    for name, loaded in toysite.loads(site, tool, module, command, modulepath).items():
        assert (loaded.returncode, loaded.stdout.strip()) == (0, expected), (name, loaded.stderr[-2000:])


def _assert_published_and_rolled_back(
    site, material, tool, backend, checks, *, env=None, modulepath=(), own_sources=True
):
    """Rebuild the modules of ``checks`` (in that order) with ``backend``, then roll back.

    Published: each live install is a new one (its inode changed, only the new build's logs in
    it), its module file keeps its name and syntax, names the live path, and loads in each
    module tool that reads it (``checks``: module -> (command, expected output)). Rolled back:
    each module file's bytes and each install's inode as before, and each module loads again.
    ``own_sources``: EasyBuild's sources path is the material's (else ``env`` says where they are).
    """
    modules = list(checks)
    files = {module: toysite.live_module_file(site, module) for module in modules}
    before = {
        module: (files[module].read_bytes(), site.live(module).stat().st_ino, _logs(site, module))
        for module in modules
    }
    names = {module: sorted(os.listdir(files[module].parent)) for module in modules}
    env = dict(material.env(), **(env or {}))
    packages = material if own_sources else None

    done = site.run_tool(*site.rebuild_args(modules, material, backend=backend), packages=packages, env=env)

    result = result_json(done)
    assert (result["state"], result["backend"]) == ("published", backend)
    for module in modules:
        old_bytes, old_ino, old_logs = before[module]
        text = files[module].read_text()
        assert text.startswith("#%Module") == old_bytes.startswith(b"#%Module")  # the syntax kept
        assert str(site.live(module)) in text
        assert str(site.generation(result["run_id"])) not in text
        assert sorted(os.listdir(files[module].parent)) == names[module]  # no file of the other syntax
        assert site.live(module).stat().st_ino != old_ino
        assert _logs(site, module)
        assert _logs(site, module).isdisjoint(old_logs)  # the new build's log only
    for module, (command, expected) in checks.items():
        _assert_loads(site, tool, module, command, expected, modulepath=modulepath)

    back = site.run_tool("--json", "rollback", result["run_id"], packages=packages, env=env)

    assert back.returncode == 0, back.stderr[-2000:]
    for module in modules:
        assert (files[module].read_bytes(), site.live(module).stat().st_ino, _logs(site, module)) == before[
            module
        ]
    for module, (command, expected) in checks.items():
        _assert_loads(site, tool, module, command, expected, modulepath=modulepath)
    return result


# A Tcl tree: toy, libtoy and toy-app, and the toy with extensions, all with Tcl module files.


@pytest.fixture(scope="module")
def tcl_tree(lmod, toy_material, tmp_path_factory) -> toysite.PristineSite:
    site = toysite.new_site(lmod, tmp_path_factory, "tcl-site")
    tcl = ["--module-syntax=Tcl"]
    toysite.install_easyconfigs(
        site,
        toy_material,
        [toy_material.easyconfig("toy"), toy_material.easyconfig("toy-app")],
        [*tcl, "--robot"],
    )
    # Apart: the fake toolchains' directory has a toy/0.0 of its own, which --robot would take as installed.
    toysite.install_easyconfigs(
        site,
        toy_material,
        [toy_material.easyconfig(*TOY_EXT.split("/"))],
        tcl,
        _with_toolchains(site, toy_material),
    )
    for module in (TOY, LIBTOY, TOY_APP, TOY_EXT):
        assert (site.modules_all / module).read_text().startswith("#%Module")
    return toysite.PristineSite(site, tmp_path_factory.mktemp("tcl-site-as-built"))


@pytest.fixture
def tcl_site(tcl_tree) -> EbSite:
    return tcl_tree.fresh()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tcl_module_rebuilt_under_a_lua_default_is_published_as_tcl_that_both_module_tools_load(
    tcl_site, toy_material, environment_modules, backend
):
    result = _assert_published_and_rolled_back(
        tcl_site, toy_material, environment_modules, backend, {TOY: ("toy", TOY_SAYS)}
    )

    assert f"set root {tcl_site.live(TOY)}\n" in (tcl_site.modules_all / TOY).read_text()
    assert not (tcl_site.modules_all / "toy" / "0.0.lua").exists()
    assert result["modules"][0]["stable_path"] == str(tcl_site.live(TOY))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_toy_with_extensions_is_published_with_them_and_rolled_back(
    tcl_site, toy_material, environment_modules, backend
):
    live = tcl_site.live(TOY_EXT)
    says = f"{TOY_EXT_SAYS}\n{live}/bin/bar\n{live}/bin/barbar"  # two of its extensions' programs

    _assert_published_and_rolled_back(
        tcl_site,
        toy_material,
        environment_modules,
        backend,
        {TOY_EXT: ("toy && command -v bar barbar", says)},
        env=_with_toolchains(tcl_site, toy_material),
        modulepath=[toysite.fake_toolchain_modules(toy_material)],
    )


# Order: libtoy and toy-app in one run, in either order, without --robot.


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "order", [[TOY_APP, LIBTOY], [LIBTOY, TOY_APP]], ids=["dependent-first", "dependency-first"]
)
def test_libtoy_and_toy_app_in_either_order_are_rebuilt_published_and_rolled_back(
    tcl_site, toy_material, environment_modules, backend, order
):
    checks = {
        TOY_APP: ("toy-app", TOY_APP_SAYS),
        LIBTOY: ('echo "$EBROOTLIBTOY"', str(tcl_site.live(LIBTOY))),
    }

    _assert_published_and_rolled_back(
        tcl_site, toy_material, environment_modules, backend, {module: checks[module] for module in order}
    )


# A Lua tree: toy, rebuilt under a site whose default is Tcl, and with configuration files.


@pytest.fixture(scope="module")
def lua_tree(lmod, toy_material, tmp_path_factory) -> toysite.PristineSite:
    site = toysite.new_site(lmod, tmp_path_factory, "lua-site")
    toysite.install(site, toy_material, TOY)
    assert (site.modules_all / "toy" / "0.0.lua").is_file()
    return toysite.PristineSite(site, tmp_path_factory.mktemp("lua-site-as-built"))


@pytest.fixture
def lua_site(lua_tree) -> EbSite:
    return lua_tree.fresh()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lua_module_rebuilt_under_a_tcl_default_is_published_as_lua(
    lua_site, toy_material, environment_modules, backend
):
    _assert_published_and_rolled_back(
        lua_site,
        toy_material,
        environment_modules,
        backend,
        {TOY: ("toy", TOY_SAYS)},
        env={"EASYBUILD_MODULE_SYNTAX": "Tcl"},
    )

    assert not (lua_site.modules_all / "toy" / "0.0").exists()


# Refusals: each before EasyBuild starts, on one live tree that none of them changes.


@pytest.fixture(scope="module")
def mixed_site(lmod, toy_material, tmp_path_factory):
    """toy with a Tcl module file and libtoy with a Lua one, built once for the refusals."""
    site = toysite.new_site(lmod, tmp_path_factory, "mixed-site")
    toysite.install(site, toy_material, TOY, eb_args=["--module-syntax=Tcl"])
    toysite.install(site, toy_material, LIBTOY, eb_args=["--module-syntax=Lua"])
    return site


def _refused_before_easybuild(site, material, modules, eb_args, env=None, backend="userns"):  # noqa: PLR0917
    args = site.rebuild_args(modules, material, backend=backend, eb_args=eb_args)
    line, calls = toysite.assert_refused(site, material, args, env)
    assert calls == []  # EasyBuild never ran
    return line


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_explicit_lua_syntax_for_a_tcl_module_is_refused_before_easybuild_runs(
    mixed_site, toy_material, backend
):
    line = _refused_before_easybuild(
        mixed_site, toy_material, [TOY], ["--module-syntax=Lua"], backend=backend
    )

    assert line == (
        f"eb-staged-rebuild: toy/0.0's live module file {mixed_site.modules_all}/toy/0.0 is Tcl, and the "
        "EasyBuild arguments ask for --module-syntax=Lua: a staged rebuild keeps each module's syntax "
        "(give --module-syntax=Tcl or leave the option out)"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_explicit_tcl_syntax_for_a_lua_module_is_refused_before_easybuild_runs(
    mixed_site, toy_material, backend
):
    line = _refused_before_easybuild(
        mixed_site, toy_material, [LIBTOY], ["--module-syntax", "Tcl"], backend=backend
    )

    assert f"{mixed_site.modules_all}/libtoy/0.0.lua is Lua, and the EasyBuild arguments ask for" in line
    assert line.endswith("(give --module-syntax=Lua or leave the option out)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tcl_and_a_lua_module_in_one_run_are_refused_before_easybuild_runs(
    mixed_site, toy_material, backend
):
    line = _refused_before_easybuild(mixed_site, toy_material, [LIBTOY, TOY], [], backend=backend)

    assert line == (
        "eb-staged-rebuild: toy/0.0 has a Tcl module file and libtoy/0.0 a Lua one; EasyBuild writes one "
        "module syntax per run: rebuild them in separate runs"
    )


def test_a_hierarchical_module_name_absent_from_a_flat_tree_is_refused_before_easybuild_runs(
    mixed_site, toy_material
):
    args = mixed_site.rebuild_args([TOY], toy_material, backend="userns")
    args[args.index(TOY)] = "Core/toy/0.0"
    eb, started = toysite.counting_eb(mixed_site)
    args = [arg if not arg.startswith("--eb=") else f"--eb={eb}" for arg in args]
    before = mixed_site.snapshot()

    done = mixed_site.run_tool(*args, packages=toy_material, env=toy_material.env())

    assert done.returncode == 2
    assert done.stderr == (
        "eb-staged-rebuild: --module Core/toy/0.0 matches no live module file under "
        f"{mixed_site.modules_all}\n"
    )
    assert not started.exists()
    assert mixed_site.snapshot() == before


def test_a_flat_module_under_a_hierarchical_scheme_is_refused_before_easybuild_runs(mixed_site, toy_material):
    line = _refused_before_easybuild(
        mixed_site, toy_material, [TOY], [], env={"EASYBUILD_MODULE_NAMING_SCHEME": "HierarchicalMNS"}
    )

    assert line == (
        "eb-staged-rebuild: toy/0.0 is not a hierarchical name (Core/..., Compiler/..., MPI/...), but "
        "EasyBuild would build it under EASYBUILD_MODULE_NAMING_SCHEME=HierarchicalMNS, and write its "
        "module file elsewhere: name the module as HierarchicalMNS does"
    )


def test_the_refusals_tree_is_one_that_both_module_tools_load(mixed_site, environment_modules):
    tcl = toysite.load_with_environment_modules(mixed_site, environment_modules, TOY, "toy")
    assert (tcl.returncode, tcl.stdout.strip()) == (0, TOY_SAYS), tcl.stderr[-2000:]
    lua = toysite.load_with_lmod(mixed_site, LIBTOY, 'echo "$EBROOTLIBTOY"')
    assert (lua.returncode, lua.stdout.strip()) == (0, str(mixed_site.live(LIBTOY))), lua.stderr[-2000:]


# EasyBuild's own reason for a failed build reaches --json and the Ansible module's result.


def _broken_toy(site, material):
    """toy's easyconfig with a sanity check that cannot pass (``bin/nothere``)."""
    broken = site.scratch("broken") / "toy-0.0.eb"
    text = material.easyconfig("toy").read_text()
    broken.write_text(text.replace("('bin/yot', 'bin/toy')", "('bin/yot', 'bin/nothere')"))
    site.give(broken)
    return broken


def _assert_sanity_reason(reason):
    assert reason.startswith("Installation of toy-0.0.eb failed: Sanity check failed: ")
    assert "'bin/nothere'" in reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failing_sanity_check_fails_with_easybuild_s_reason_in_json_and_leaves_the_live_tree(
    tcl_site, toy_material, environment_modules, backend
):
    site = tcl_site
    broken = _broken_toy(site, toy_material)
    before = site.snapshot()
    args = site.rebuild_args([TOY], toy_material, backend=backend)
    args[-1] = str(broken)

    done = site.run_tool(*args, packages=toy_material, env=toy_material.env())

    assert done.returncode == 2, done.stderr[-2000:]
    failure = json.loads(done.stdout)
    assert failure["failed"] is True
    assert failure["error"] == "publish_failed"
    _assert_sanity_reason(failure["easybuild_reason"])
    assert os.path.isfile(failure["build_log"])
    line = done.stderr.splitlines()[-1]
    assert line == f"eb-staged-rebuild: {failure['msg']}"
    assert f": {failure['easybuild_reason']}; nothing was swapped; its log is {failure['build_log']}" in line
    assert site.snapshot() == before
    _assert_loads(site, environment_modules, TOY, "toy", TOY_SAYS)


def _use_environment(monkeypatch, env):
    """Make ``env`` the whole environment of this process (the module runs in it, as on a build host)."""
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_the_staged_rebuild_module_fails_a_failing_sanity_check_with_easybuild_s_reason(
    tcl_site, toy_material, monkeypatch, capsys
):
    site = tcl_site
    broken = _broken_toy(site, toy_material)
    before = site.snapshot()
    _use_environment(monkeypatch, site.eb_env(toy_material, **toy_material.env()))
    args = {
        "state_root": str(site.state_root),
        "modules": [TOY],
        "easyconfigs": [str(broken)],
        "backend": "userns",
        "rebuild": "always",
    }

    result = run_module(capsys, staged_rebuild, args)

    assert result["failed"] is True
    assert result["error"] == "publish_failed"
    _assert_sanity_reason(result["easybuild_reason"])
    assert os.path.isfile(result["build_log"])
    assert (
        f": {result['easybuild_reason']}; nothing was swapped; its log is {result['build_log']}"
        in result["msg"]
    )
    assert "\n" not in result["msg"]
    assert site.snapshot() == before


# A site configured by EASYBUILD_PREFIX: sources, build path and repository under the prefix.

_BY_PREFIX = {
    "EASYBUILD_SOURCEPATH": None,
    "EASYBUILD_BUILDPATH": None,
    "EASYBUILD_REPOSITORYPATH": None,
    "EASYBUILD_TMPDIR": None,
}


def _prefix_env(site) -> dict:
    return dict(_BY_PREFIX, EASYBUILD_PREFIX=site.root / "eb-prefix")


@pytest.fixture(scope="module")
def prefix_tree(lmod, toy_material, tmp_path_factory) -> toysite.PristineSite:
    site = toysite.new_site(lmod, tmp_path_factory, "prefix-site")
    prefix = site.root / "eb-prefix"
    shutil.copytree(toy_material.sources, prefix / "sources", symlinks=True)
    toysite.install_easyconfigs(site, toy_material, [toy_material.easyconfig("toy")], env=_prefix_env(site))
    return toysite.PristineSite(site, tmp_path_factory.mktemp("prefix-site-as-built"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_site_configured_by_its_prefix_rebuilds_with_the_sources_under_that_prefix(
    prefix_tree, toy_material, environment_modules, backend
):
    site = prefix_tree.fresh()
    repository = site.root / "eb-prefix" / "ebfiles_repo"
    shutil.rmtree(repository)  # plain eb's copy: the rebuild must write its own there

    # The sources are found under the prefix: EasyBuild is given no other sources path.
    _assert_published_and_rolled_back(
        site,
        toy_material,
        environment_modules,
        backend,
        {TOY: ("toy", TOY_SAYS)},
        env=_prefix_env(site),
        own_sources=False,
    )

    assert (repository / "toy" / "toy-0.0.eb").is_file()


# EasyBuild's configuration files: what they say reaches EasyBuild, but their install paths do not.


def _site_config(site, material) -> str:
    """A site's ``config.cfg``: its sources path, install paths that name another tree
    (``decoy``, which a staged build must not write into), and the settings that would make
    EasyBuild write elsewhere than the stage or remove what it finds there (``SITE_REDIRECTS``)."""
    decoy = site.root / "decoy"
    return (
        "[config]\n"
        f"sourcepath = {material.sources}\n"
        f"installpath = {decoy}\n"
        f"installpath-software = {decoy}/software\n"
        f"installpath-modules = {decoy}/modules\n"
        + "".join(f"{name} = {value}\n" for name, value in SITE_REDIRECTS.items())
    )


# A module path suffix other than ``all`` (module files elsewhere than the live ones),
# EasyBuild's own bubblewrap mode (a second sandbox around the userns one) and the removal of
# install directories without a module file: each would make the staged build write or remove
# elsewhere than the stage.
SITE_REDIRECTS = {"suffix-modules-path": "site-modules", "bwrap": "True", "remove-ghost-install-dirs": "True"}
# What the staged command gives for each, overriding the file.
STAGED_VALUES = {"suffix-modules-path": "all", "remove-ghost-install-dirs": "False"}


def _configured_by_file(site, material, where) -> dict:
    """Write the site's configuration file ``where`` EasyBuild looks for it; the environment
    that leaves sources and install path to it."""
    (site.root / "decoy").mkdir()
    env = {"EASYBUILD_SOURCEPATH": None, "EASYBUILD_INSTALLPATH": None}
    if where == "EASYBUILD_CONFIGFILES":
        config = site.root / "site.cfg"
        env["EASYBUILD_CONFIGFILES"] = config
    else:  # EasyBuild's default: ~/.config/easybuild/config.cfg
        config = site.root / "home" / ".config" / "easybuild" / "config.cfg"
        config.parent.mkdir(parents=True)
    config.write_text(_site_config(site, material))
    return env


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["EASYBUILD_CONFIGFILES", "~/.config/easybuild/config.cfg"])
def test_a_site_configured_by_a_configuration_file_rebuilds_with_its_sources_but_not_its_install_paths(
    lua_site, toy_material, environment_modules, backend, where
):
    env = _configured_by_file(lua_site, toy_material, where)

    # Published: the sources were found where the file says (EasyBuild was given no other path).
    _assert_published_and_rolled_back(
        lua_site,
        toy_material,
        environment_modules,
        backend,
        {TOY: ("toy", TOY_SAYS)},
        env=env,
        own_sources=False,
    )

    assert list((lua_site.root / "decoy").rglob("*")) == []


_SHOWN = re.compile(r"^(?P<name>[a-z-]+)\s+\((?P<origin>[CDEF])\) = (?P<value>.*)$")


def test_the_dry_run_shows_the_configuration_file_s_sources_and_the_staged_install_paths(
    lua_site, toy_material
):
    env = _configured_by_file(lua_site, toy_material, "EASYBUILD_CONFIGFILES")
    args = lua_site.rebuild_args([TOY], toy_material, backend="userns", extra=["--dry-run"])

    done = lua_site.run_tool(*args, packages=None, env=dict(toy_material.env(), **env))

    result = result_json(done)
    shown = result["easybuild_configuration"]
    assert shown["error"] is None
    settings = {}
    for line in shown["text"].splitlines():
        found = _SHOWN.match(line)
        if found:
            settings[found["name"]] = (found["origin"], found["value"])
    assert settings["sourcepath"] == ("F", str(toy_material.sources))
    generation = result["generation"]
    assert settings["installpath-modules"] == ("C", os.path.join(generation, "modules"))
    assert settings["installpath-software"] == (
        "C",
        str(lua_site.software),
    )  # where the sandbox shows the stage
    assert settings["installpath-data"] == ("C", os.path.join(generation, "data"))
    # The file's installpath is still listed; EasyBuild derives nothing from it, all three are given.
    assert settings["installpath"] == ("F", str(lua_site.root / "decoy"))
    # The file's redirecting settings are overridden: EasyBuild lists a setting only while it
    # differs from its default, and the staged values are the defaults.
    for name, value in dict(STAGED_VALUES, bwrap="False").items():
        assert settings.get(name, ("D", value))[1] == value, name
    assert list((lua_site.root / "decoy").rglob("*")) == []
