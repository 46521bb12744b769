"""Hierarchical module naming (EasyBuild's ``HierarchicalMNS``): a live tree built with plain
``eb`` from EasyBuild's own test material, as EasyBuild's ``test_toy_hierarchical`` builds it
(the fake toolchain modules of ``test/framework/modules`` copied under ``modules/all/{Core,
Compiler,MPI}``), rebuilt by ``eb-staged-rebuild`` with real EasyBuild, and loaded afterwards
with both module tools, Lmod and Environment Modules 5, from ``MODULEPATH=modules/all/Core``
as a hierarchical site sets it.

The tree is built once (Tcl module files, which both module tools read): toy at the Core level
(``Core/toy/0.0``, ``software/toy/0.0``) and at the Compiler level
(``Compiler/GCC/6.4.0-2.28/toy/0.0``, ``software/toy/0.0-GCC-6.4.0-2.28``), with a site's
``.modulerc`` beside each and a module-class link to the Core toy. Each case works on a fresh
copy of it at the same path (the module files name their absolute install directories).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import toysite
from tests.integration.harness.ebsite import result_json

CORE = "Core/toy/0.0"
COMPILER = "Compiler/GCC/6.4.0-2.28/toy/0.0"
GCC = "GCC/6.4.0-2.28"
HMNS = "--module-naming-scheme=HierarchicalMNS"
TRY_GCC = "--try-toolchain=GCC,6.4.0-2.28"
TOY_SAYS = "I'm a toy, and very proud of it."
INSTALLS = {CORE: "toy/0.0", COMPILER: "toy/0.0-GCC-6.4.0-2.28"}
# What loads each: the Compiler-level toy needs its compiler's module first, which extends
# MODULEPATH with the Compiler level (as HierarchicalMNS's compiler modules do).
LOADS = {CORE: "toy/0.0", COMPILER: f"{GCC} toy/0.0"}
MODULERC = "#%Module\nmodule-version toy/0.0 default\n"
CLASS_LINK = Path("tools") / "Core" / "toy" / "0.0"
# What EasyBuild may be asked before a build: none of these builds anything.
ASKED = ("--version", "--show-config", "--dry-run-short")
# The module's tests run on one xdist worker (--dist loadgroup), which makes its hierarchical site once:
# spread over both workers, each would make them.
pytestmark = pytest.mark.xdist_group("staged_hierarchical")


def _eb_args(module):
    return [HMNS, TRY_GCC] if module == COMPILER else [HMNS]


def _install(site, material, module):
    toysite.install(site, material, "toy/0.0", eb_args=["--module-syntax=Tcl", *_eb_args(module)])


@pytest.fixture(scope="module")
def hmns_site(lmod, toy_material, tmp_path_factory):
    """The hierarchical site, built once; ``pristine`` holds a copy of its trees."""
    site = toysite.new_site(lmod, tmp_path_factory, "hmns-site")
    root = site.root
    modules_all = site.modules_all
    toysite.install_fake_hierarchy(toy_material, modules_all)
    for module in (CORE, COMPILER):
        _install(site, toy_material, module)
        (modules_all / module).parent.joinpath(".modulerc").write_text(MODULERC)
    class_link = site.modules / CLASS_LINK
    class_link.parent.mkdir(parents=True)
    class_link.symlink_to(modules_all / CORE)
    shutil.copytree(site.installpath, root / "pristine", symlinks=True)
    return site


@pytest.fixture
def site(hmns_site):
    """The hierarchical site as it was built: its trees copied back, no journals."""
    shutil.rmtree(hmns_site.installpath)
    subprocess.run(["cp", "-a", str(hmns_site.root / "pristine"), str(hmns_site.installpath)], check=True)
    shutil.rmtree(hmns_site.state_root, ignore_errors=True)
    (hmns_site.root / "eb-started").unlink(missing_ok=True)  # toysite.counting_eb's record
    return hmns_site


def _args(site, material, module, backend, eb_args=(), *, spelled=None):
    """The rebuild command of ``module`` (given as ``spelled``) with toy's easyconfig."""
    args = site.rebuild_args(["toy/0.0"], material, backend=backend, eb_args=eb_args)
    args[args.index("toy/0.0")] = spelled or module
    return args


def _load(site, tool, modules, command):
    """``module load MODULES && COMMAND`` with ``MODULEPATH=modules/all/Core``, by ``tool``
    (None: Lmod; else Environment Modules 5)."""
    core = site.modules_all / "Core"
    if tool is None:
        env = site.lmod.env([core], base=site.base_env())
        argv = site.lmod.shell_command(f"module load {modules} && {command}")
    else:
        env = dict(site.base_env(), MODULEPATH=str(core))
        argv = tool.shell_command(f"module load {modules} && {command}")
    return subprocess.run(
        argv,
        cwd=site.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=toysite.MODULE_TIMEOUT,
        check=False,
    )


def _loads(site, tool, module, install):
    loaded = _load(site, tool, LOADS[module], 'echo "$EBROOTTOY" && toy')
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.splitlines() == [str(install), TOY_SAYS]


def _logs(install) -> set:
    return {path.name for path in (install / "easybuild").glob("easybuild-*.log")}


def _site_files(site):
    """The files the site keeps beside the modules: each .modulerc's bytes and the class link."""
    rcs = {path: path.read_bytes() for path in site.modules_all.rglob(".modulerc*")}
    return rcs, os.readlink(site.modules / CLASS_LINK)


# Publish and rollback, at both levels, in both sandboxes. The scheme is given each way a
# site gives it: the run's option, EasyBuild's variable, a configuration file.


@pytest.mark.parametrize(
    ("backend", "module", "given"),
    [
        ("bwrap", CORE, "variable"),
        ("userns", CORE, "configfile"),
        ("bwrap", COMPILER, "option"),
        ("userns", COMPILER, "option"),
    ],
)
def test_a_hierarchical_module_is_published_loads_in_both_tools_and_rolls_back(  # noqa: PLR0917 - fixtures
    site, toy_material, environment_modules, backend, module, given
):
    install = site.software / INSTALLS[module]
    module_file = site.modules_all / module
    old_bytes, old_ino, old_logs = module_file.read_bytes(), install.stat().st_ino, _logs(install)
    kept = _site_files(site)
    env = dict(toy_material.env())
    eb_args = _eb_args(module)
    if given != "option":
        eb_args = [arg for arg in eb_args if arg != HMNS]
    if given == "variable":
        env["EASYBUILD_MODULE_NAMING_SCHEME"] = "HierarchicalMNS"
    if given == "configfile":
        config = site.root / "eb-config.cfg"
        config.write_text("[config]\nmodule-naming-scheme = HierarchicalMNS\n")
        env["EASYBUILD_CONFIGFILES"] = str(config)

    done = site.run_tool(*_args(site, toy_material, module, backend, eb_args), packages=toy_material, env=env)

    result = result_json(done)
    assert (result["backend"], result["state"]) == (backend, "published")
    assert [entry["module"] for entry in result["modules"]] == [module]
    assert result["modules"][0]["stable_path"] == str(install)
    assert install.stat().st_ino != old_ino
    assert _logs(install)
    assert _logs(install).isdisjoint(old_logs)
    new_text = module_file.read_text()
    assert new_text.startswith("#%Module")
    assert re.search(rf"^set root\s+{re.escape(str(install))}$", new_text, re.M)
    assert not module_file.with_name("0.0.lua").exists()
    assert _site_files(site) == kept
    for tool in (None, environment_modules):
        _loads(site, tool, module, install)
    through_class = site.lmod.env([site.modules / "tools" / "Core"], base=site.base_env())
    loaded = subprocess.run(
        site.lmod.shell_command('module load toy/0.0 && echo "$EBROOTTOY"'),
        env=through_class,
        capture_output=True,
        text=True,
        timeout=toysite.MODULE_TIMEOUT,
        check=False,
    )
    assert (loaded.returncode, loaded.stdout.strip()) == (0, str(site.software / "toy" / "0.0"))

    back = site.run_tool("--json", "rollback", result["run_id"], packages=toy_material)

    assert back.returncode == 0, back.stderr[-2000:]
    assert module_file.read_bytes() == old_bytes
    assert install.stat().st_ino == old_ino
    assert _logs(install) == old_logs
    assert _site_files(site) == kept
    for tool in (None, environment_modules):
        _loads(site, tool, module, install)


def test_migrate_from_eb_to_hmns_rebuilds_the_core_module(site, toy_material, environment_modules):
    install = site.software / "toy" / "0.0"
    old_ino = install.stat().st_ino

    done = site.run_tool(
        *_args(site, toy_material, CORE, "userns", ["--module-naming-scheme=MigrateFromEBToHMNS"]),
        packages=toy_material,
        env=toy_material.env(),
    )

    assert result_json(done)["state"] == "published"
    assert install.stat().st_ino != old_ino
    _loads(site, environment_modules, CORE, install)


# Refusals: each before EasyBuild builds anything, with one line, the trees unchanged.


def _refused(site, material, module, eb_args=(), *, env=None, spelled=None):
    args = _args(site, material, module, "userns", eb_args, spelled=spelled)
    line, calls = toysite.assert_refused(site, material, args, env)
    # EasyBuild built nothing: it ran at most to say its version, its configuration or its
    # dry run. Returned: how often it showed each of the last two.
    assert all(call.endswith(ASKED) for call in calls), calls
    return line, [asked for asked in ASKED[1:] for call in calls if call.endswith(asked)]


def test_an_ambiguous_short_name_is_refused_listing_both_levels(site, toy_material):
    line, calls = _refused(site, toy_material, CORE, [HMNS], spelled="toy/0.0")

    assert line == (
        f"eb-staged-rebuild: --module toy/0.0 is ambiguous: the live tree has {COMPILER}, {CORE}; "
        "give the full module name"
    )
    assert calls == []


def test_a_name_that_matches_no_live_module_is_refused(site, toy_material):
    line, calls = _refused(site, toy_material, CORE, [HMNS], spelled="Compiler/GCC/7.3.0-2.30/toy/0.0")

    assert line == (
        "eb-staged-rebuild: --module Compiler/GCC/7.3.0-2.30/toy/0.0 matches no live module file under "
        f"{site.modules_all}"
    )
    assert calls == []


def test_a_hierarchical_module_under_easybuild_s_flat_default_is_refused(site, toy_material):
    line, calls = _refused(site, toy_material, CORE)

    assert line == (
        f"eb-staged-rebuild: {CORE} is not a flat name, but EasyBuild would build it under the module "
        "naming scheme EasyBuildMNS, and write its module file elsewhere: give "
        "--module-naming-scheme=HierarchicalMNS to EasyBuild"
    )
    # No configuration file anywhere: EasyBuild's default scheme, known without starting it.
    assert calls == []


def test_a_scheme_set_in_a_configuration_file_that_the_tool_cannot_place_is_refused(site, toy_material):
    config = site.root / "categorized.cfg"
    config.write_text("[config]\nmodule-naming-scheme = CategorizedHMNS\n")

    line, calls = _refused(site, toy_material, CORE, env={"EASYBUILD_CONFIGFILES": str(config)})

    assert line == (
        "eb-staged-rebuild: module-naming-scheme=CategorizedHMNS (from a configuration file) is not a naming "
        "scheme staged rebuilds handle (EasyBuildMNS, HierarchicalMNS, MigrateFromEBToHMNS): rebuild these "
        "modules with plain eb, or under one of those schemes"
    )
    assert calls == ["--show-config"]


def test_a_compiler_level_module_given_an_easyconfig_that_builds_the_core_one_is_refused(site, toy_material):
    # Without --try-toolchain toy-0.0.eb is toy at the Core level: EasyBuild would write
    # Core/toy/0.0 into software/toy/0.0, not the live Compiler-level module.
    line, calls = _refused(site, toy_material, COMPILER, [HMNS])

    assert line == (
        f"eb-staged-rebuild: EasyBuild would build {CORE} (its dry run), not the live {COMPILER} that "
        "--module names: give the easyconfigs and toolchain options that build the live module; "
        "nothing was built"
    )
    assert calls == ["--dry-run-short"]


# Retire: a hierarchical module file leaves the tree, and its rollback puts it back.


def test_a_hierarchical_module_is_retired_and_its_rollback_puts_the_file_back(site, toy_material):
    module_file = site.modules_all / COMPILER
    before = module_file.read_bytes()

    retired = result_json(
        site.run_tool("--json", "retire", str(module_file), "--reason", "superseded", packages=toy_material)
    )

    assert (retired["state"], module_file.exists()) == ("retired", False)
    # toy/0.0 now resolves to the Core level's (the Compiler level's file is gone).
    after_retire = _load(site, None, LOADS[COMPILER], 'echo "$EBROOTTOY"')
    assert after_retire.stdout.split() == [str(site.software / INSTALLS[CORE])], after_retire.stderr[-2000:]
    back = result_json(site.run_tool("--json", "rollback", retired["run_id"], packages=toy_material))
    assert back["state"] == "rolled_back"
    assert module_file.read_bytes() == before
    _loads(site, None, COMPILER, site.software / INSTALLS[COMPILER])
