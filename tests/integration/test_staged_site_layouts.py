"""Real sites' trees, made with plain ``eb`` from EasyBuild's own test material (the toy
easyconfigs and the sandbox's easyblocks), rebuilt by ``eb-staged-rebuild`` with real
EasyBuild, and loaded afterwards with both module tools, Lmod and Environment Modules 5.

Module syntax: a staged rebuild keeps each live module file's syntax, whatever the site's
default (the harness's EasyBuild environment says ``EASYBUILD_MODULE_SYNTAX=Lua``, EasyBuild
5's own default); a run that asks for the other syntax is refused before EasyBuild starts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import toysite
from tests.integration.harness.ebsite import EbSite, result_json

TOY = "toy/0.0"
LIBTOY = "libtoy/0.0"
TOY_APP = "toy-app/0.0"
TOY_SAYS = "I'm a toy, and very proud of it."


def _logs(site, module) -> set:
    return {path.name for path in (site.live(module) / "easybuild").glob("easybuild-*.log")}


@pytest.fixture
def tcl_toy_site(eb_site_factory, toy_material) -> EbSite:
    """A live toy whose module file plain ``eb --module-syntax=Tcl`` wrote (``modules/all/toy/0.0``)."""
    site = eb_site_factory("root")
    toysite.install(site, toy_material, TOY, eb_args=["--module-syntax=Tcl"])
    assert (site.modules_all / "toy" / "0.0").read_text().startswith("#%Module")
    return site


@pytest.mark.parametrize("backend", ["bwrap", "userns"])
def test_a_tcl_module_rebuilt_under_a_lua_default_is_published_as_tcl_that_both_module_tools_load(
    tcl_toy_site, toy_material, environment_modules, backend
):
    site = tcl_toy_site
    module_file = site.modules_all / "toy" / "0.0"
    old_bytes, old_logs = module_file.read_bytes(), _logs(site, TOY)
    old_ino = site.live(TOY).stat().st_ino

    done = site.rebuild([TOY], toy_material, backend=backend, env=toy_material.env())

    result = result_json(done)
    assert result["backend"] == backend
    new_text = module_file.read_text()
    assert new_text.startswith("#%Module")
    assert f"set root {site.live(TOY)}\n" in new_text
    assert not (site.modules_all / "toy" / "0.0.lua").exists()
    assert site.live(TOY).stat().st_ino != old_ino
    assert _logs(site, TOY)
    assert _logs(site, TOY).isdisjoint(old_logs)  # the new build's log only
    for loaded in (
        toysite.load_with_lmod(site, TOY, "toy"),
        toysite.load_with_environment_modules(site, environment_modules, TOY, "toy"),
    ):
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        assert loaded.stdout.strip() == TOY_SAYS

    back = site.run_tool("--json", "rollback", result["run_id"], packages=toy_material)

    assert back.returncode == 0, back.stderr[-2000:]
    assert module_file.read_bytes() == old_bytes
    assert site.live(TOY).stat().st_ino == old_ino
    assert _logs(site, TOY) == old_logs
    loaded = toysite.load_with_environment_modules(site, environment_modules, TOY, "toy")
    assert (loaded.returncode, loaded.stdout.strip()) == (0, TOY_SAYS), loaded.stderr[-2000:]


# Refusals: each before EasyBuild starts, on one live tree that none of them changes.


@pytest.fixture(scope="module")
def mixed_site(lmod, toy_material, tmp_path_factory):
    """toy with a Tcl module file and libtoy with a Lua one, built once for the refusals."""
    import checkout  # noqa: PLC0415 - the integration conftest puts testbed/ on sys.path
    import stackenv  # noqa: PLC0415

    root = tmp_path_factory.mktemp("mixed-site")
    site = EbSite(root=root, user=None, lmod=lmod, eb=stackenv.find_eb())
    for name in ("home", "tmp"):
        (root / name).mkdir()
    checkout.link_package(site.package_root)
    toysite.install(site, toy_material, TOY, eb_args=["--module-syntax=Tcl"])
    toysite.install(site, toy_material, LIBTOY, eb_args=["--module-syntax=Lua"])
    return site


def _refused_before_easybuild(site, material, modules, eb_args, env=None):
    eb, started = toysite.counting_eb(site)
    before = site.snapshot()
    args = site.rebuild_args(modules, material, backend="userns", eb_args=eb_args)
    args = [arg if not arg.startswith("--eb=") else f"--eb={eb}" for arg in args]

    done = site.run_tool(*args, packages=material, env=dict(material.env(), **(env or {})))

    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("eb-staged-rebuild: ")
    assert not started.exists()  # EasyBuild never ran
    assert site.snapshot() == before
    assert not site.journals()
    return lines[0]


def test_an_explicit_lua_syntax_for_a_tcl_module_is_refused_before_easybuild_runs(mixed_site, toy_material):
    line = _refused_before_easybuild(mixed_site, toy_material, [TOY], ["--module-syntax=Lua"])

    assert line == (
        f"eb-staged-rebuild: toy/0.0's live module file {mixed_site.modules_all}/toy/0.0 is Tcl, and the "
        "EasyBuild arguments ask for --module-syntax=Lua: a staged rebuild keeps each module's syntax "
        "(give --module-syntax=Tcl or leave the option out)"
    )


def test_an_explicit_tcl_syntax_for_a_lua_module_is_refused_before_easybuild_runs(mixed_site, toy_material):
    line = _refused_before_easybuild(mixed_site, toy_material, [LIBTOY], ["--module-syntax", "Tcl"])

    assert f"{mixed_site.modules_all}/libtoy/0.0.lua is Lua, and the EasyBuild arguments ask for" in line
    assert line.endswith("(give --module-syntax=Lua or leave the option out)")


def test_a_tcl_and_a_lua_module_in_one_run_are_refused_before_easybuild_runs(mixed_site, toy_material):
    line = _refused_before_easybuild(mixed_site, toy_material, [LIBTOY, TOY], [])

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


# EasyBuild's own reason for a failed build reaches --json.


def test_a_failing_sanity_check_fails_with_easybuild_s_reason_in_json_and_leaves_the_live_tree(
    tcl_toy_site, toy_material, environment_modules
):
    site = tcl_toy_site
    broken = site.scratch("broken") / "toy-0.0.eb"
    text = toy_material.easyconfig("toy").read_text()
    broken.write_text(text.replace("('bin/yot', 'bin/toy')", "('bin/yot', 'bin/nothere')"))
    site.give(broken)
    before = site.snapshot()
    args = site.rebuild_args([TOY], toy_material, backend="userns")
    args[-1] = str(broken)

    done = site.run_tool(*args, packages=toy_material, env=toy_material.env())

    assert done.returncode == 2, done.stderr[-2000:]
    failure = json.loads(done.stdout)
    assert failure["failed"] is True
    assert failure["error"] == "publish_failed"
    assert failure["easybuild_reason"].startswith("Installation of toy-0.0.eb failed: Sanity check failed: ")
    assert "'bin/nothere'" in failure["easybuild_reason"]
    assert Path(failure["build_log"]).is_file()
    line = done.stderr.splitlines()[-1]
    assert line == f"eb-staged-rebuild: {failure['msg']}"
    assert f": {failure['easybuild_reason']}; nothing was swapped; its log is {failure['build_log']}" in line
    assert site.snapshot() == before
    loaded = toysite.load_with_environment_modules(site, environment_modules, TOY, "toy")
    assert (loaded.returncode, loaded.stdout.strip()) == (0, TOY_SAYS), loaded.stderr[-2000:]


# A site configured by EASYBUILD_PREFIX: sources, build path and repository under the prefix.


def test_a_site_configured_by_its_prefix_rebuilds_with_the_sources_under_that_prefix(
    eb_site_factory, toy_material
):
    site = eb_site_factory("root")
    prefix = site.scratch("eb-prefix")
    shutil.copytree(toy_material.sources, prefix / "sources")
    by_prefix = {
        "EASYBUILD_PREFIX": prefix,
        "EASYBUILD_SOURCEPATH": None,
        "EASYBUILD_BUILDPATH": None,
        "EASYBUILD_REPOSITORYPATH": None,
        "EASYBUILD_TMPDIR": None,
    }
    env = dict(toy_material.env(), **by_prefix)
    install = subprocess.run(
        [str(site.eb), str(toy_material.easyconfig("toy"))],
        cwd=site.root,
        env=site.eb_env(None, **env),
        capture_output=True,
        text=True,
        timeout=toysite.EB_TIMEOUT,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:]
    old_ino = site.live(TOY).stat().st_ino
    repository = prefix / "ebfiles_repo"
    shutil.rmtree(repository)  # plain eb's copy: the rebuild must write its own there
    args = site.rebuild_args([TOY], toy_material, backend="userns")

    done = site.run_tool(*args, packages=None, env=env)

    result = result_json(done)  # the sources were found under the prefix
    assert result["state"] == "published"
    assert site.live(TOY).stat().st_ino != old_ino
    assert (repository / "toy" / "toy-0.0.eb").is_file()
    loaded = toysite.load_with_lmod(site, TOY, "toy")
    assert (loaded.returncode, loaded.stdout.strip()) == (0, TOY_SAYS), loaded.stderr[-2000:]


# Order: a dependency given after its dependent, without --robot, is still built first.


@pytest.mark.parametrize("backend", ["bwrap", "userns"])
def test_libtoy_and_toy_app_given_dependent_first_are_rebuilt_and_published(
    eb_site_factory, toy_material, backend
):
    site = eb_site_factory("root")
    toysite.install(site, toy_material, TOY_APP, eb_args=["--robot"])  # libtoy with it
    old = {module: site.live(module).stat().st_ino for module in (LIBTOY, TOY_APP)}

    done = site.rebuild([TOY_APP, LIBTOY], toy_material, backend=backend, env=toy_material.env())

    result = result_json(done)
    assert result["state"] == "published"
    assert all(site.live(module).stat().st_ino != old[module] for module in old)
    loaded = toysite.load_with_lmod(site, TOY_APP, "toy-app")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "Hello from a toy function!"  # libtoy's, linked and loaded
