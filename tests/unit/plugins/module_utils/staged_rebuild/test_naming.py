"""Module names resolved in a live tree: full and short names, the install a root names, the
naming schemes a build may use, and the scheme EasyBuild's --show-config reports.

Each tree is real, under ``tmp_path``: module files with real root lines, links and
``.modulerc`` files where a site has them.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    easybuild,
    modulefile,
    naming,
    paths,
    rebuild,
    wouldbuild,
)

CORE = "Core/toy/0.0"
COMPILER = "Compiler/GCC/6.4.0-2.28/toy/0.0"
MPI = "MPI/GCC/6.4.0-2.28/OpenMPI/2.1.2/toy/0.0"


@pytest.fixture
def trees(tmp_path):
    trees = paths.Trees.from_installpath(str(tmp_path / "apps"))
    os.makedirs(trees.modules_all)
    os.makedirs(trees.software)
    return trees


def _module(trees, module, root, tcl=False):
    path = os.path.join(trees.modules_all, module + ("" if tcl else ".lua"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"#%Module\nset root    {root}\n" if tcl else f'local root = "{root}"\n')
    return path


def _install(trees, subdir):
    return os.path.join(trees.software, subdir)


# locate: the live module file and the install its root names


@pytest.mark.parametrize(
    ("module", "subdir", "tcl"),
    [
        ("toy/0.0", "toy/0.0", False),
        (CORE, "toy/0.0", False),
        (COMPILER, "toy/0.0-GCC-6.4.0-2.28", True),
        (MPI, "toy/0.0-gompi-2018a", False),
    ],
)
def test_locate_takes_the_install_from_the_root_line_in_lua_and_tcl(trees, module, subdir, tcl):
    _module(trees, module, _install(trees, subdir), tcl=tcl)

    assert naming.locate(trees, module) == naming.Located(module, subdir)


def test_locate_resolves_a_short_name_that_one_live_module_ends_with(trees):
    _module(trees, COMPILER, _install(trees, "toy/0.0-GCC-6.4.0-2.28"), tcl=True)
    _module(trees, "Core/GCC/6.4.0-2.28", _install(trees, "GCC/6.4.0-2.28"), tcl=True)

    assert naming.locate(trees, "toy/0.0") == naming.Located(COMPILER, "toy/0.0-GCC-6.4.0-2.28")


def test_locate_refuses_an_ambiguous_short_name_listing_every_candidate(trees):
    for module in (CORE, COMPILER, MPI):
        _module(trees, module, _install(trees, "toy/0.0"))

    with pytest.raises(errors.UsageError) as raised:
        naming.locate(trees, "toy/0.0")

    assert str(raised.value).endswith(
        f"toy/0.0 is ambiguous: the live tree has {COMPILER}, {CORE}, {MPI}; give the full module name"
    )


def test_a_flat_name_in_the_tree_is_not_ambiguous_with_a_longer_one(trees):
    _module(trees, "toy/0.0", _install(trees, "toy/0.0"))
    _module(trees, CORE, _install(trees, "toy/0.0"))

    assert naming.locate(trees, "toy/0.0").module == "toy/0.0"


def test_candidates_skip_links_hidden_files_and_directories_of_the_name(trees):
    _module(trees, CORE, _install(trees, "toy/0.0"))
    os.makedirs(os.path.join(trees.modules_all, "Compiler", "toy", "0.0"))  # a directory, not a file
    os.makedirs(os.path.join(trees.modules_all, "Other", "toy"))
    os.symlink(
        os.path.join(trees.modules_all, CORE + ".lua"), os.path.join(trees.modules_all, "Other/toy/0.0.lua")
    )
    hidden = os.path.join(trees.modules_all, ".hidden", "toy")
    os.makedirs(hidden)
    with open(os.path.join(hidden, "0.0.lua"), "w", encoding="utf-8") as handle:
        handle.write('local root = "/x"\n')
    with open(
        os.path.join(trees.modules_all, "Core", "toy", ".modulerc.lua"), "w", encoding="utf-8"
    ) as handle:
        handle.write('module_version("toy/0.0", "default")\n')

    assert naming.candidates(trees.modules_all, "toy/0.0") == [CORE]


def test_a_hierarchical_name_without_a_live_module_file_is_refused(trees):
    with pytest.raises(errors.UsageError) as raised:
        naming.locate(trees, CORE)

    assert str(raised.value).endswith(f" {CORE} matches no live module file under {trees.modules_all}")


def test_a_flat_name_without_a_live_module_file_keeps_the_flat_place(trees):
    assert naming.locate(trees, "toy/0.0") == naming.Located("toy/0.0", "toy/0.0")


@pytest.mark.parametrize(
    "root",
    [
        "/opt/elsewhere/toy/0.0",
        "{software}/toy",
        "{software}/toy/0.0/bin",
        "{software}/../x/toy/0.0",
        "relative/x",
    ],
)
def test_a_hierarchical_module_whose_root_is_not_an_install_directory_is_refused(trees, root):
    root = root.format(software=trees.software)
    module_file = _module(trees, CORE, root)

    with pytest.raises(errors.UsageError) as raised:
        naming.locate(trees, CORE)

    assert str(raised.value) == (
        f"{CORE}'s live module file {module_file} names root {root}, which is not <Name>/<version> under "
        f"the software tree {trees.software}; a staged rebuild finds the install by it"
    )


def test_a_hierarchical_module_without_a_root_line_is_refused(trees):
    module_file = _module(trees, CORE, "x")
    with open(module_file, "w", encoding="utf-8") as handle:
        handle.write('setenv("EBROOTTOY", "/x")\n')

    with pytest.raises(errors.UsageError) as raised:
        naming.locate(trees, CORE)

    assert "has no root assignment naming <Name>/<version> under the software tree" in str(raised.value)


@pytest.mark.parametrize("value", ["../toy/0.0", "Core/../toy/0.0", "Core/toy/.0.0", "toy", "/Core/toy/0.0"])
def test_locate_refuses_a_name_that_could_leave_the_tree(trees, value):
    with pytest.raises(errors.UsageError) as raised:
        naming.locate(trees, value)

    assert "is not NAME/VERSION of plain names" in str(raised.value)


# ModulePaths of a hierarchical module


def test_module_paths_of_a_compiler_level_module(trees):
    entry = paths.ModulePaths(trees, COMPILER, "toy/0.0-GCC-6.4.0-2.28", "run1")

    assert entry.stable_path == os.path.join(trees.software, "toy", "0.0-GCC-6.4.0-2.28")
    assert entry.retired_path == os.path.join(trees.software, "toy", ".0.0-GCC-6.4.0-2.28.run1")
    assert entry.module_file() == os.path.join(trees.modules_all, COMPILER + ".lua")
    assert entry.staged_build("/gen") == (
        "/gen/software/toy/0.0-GCC-6.4.0-2.28",
        "/gen/modules/all/Compiler/GCC/6.4.0-2.28/toy/0.0.lua",
    )
    assert not entry.is_flat


# the naming schemes


@pytest.mark.parametrize(
    ("scheme", "module"),
    [
        (None, "toy/0.0"),
        ("EasyBuildMNS", "toy/0.0"),
        ("HierarchicalMNS", CORE),
        ("HierarchicalMNS", COMPILER),
        ("MigrateFromEBToHMNS", MPI),
    ],
)
def test_a_module_of_the_build_s_scheme_is_accepted(scheme, module):
    assert naming.check_scheme(scheme, None, [module]) is None  # no refusal raised


@pytest.mark.parametrize(
    ("scheme", "module", "end"),
    [
        (None, CORE, "give --module-naming-scheme=HierarchicalMNS to EasyBuild"),
        ("HierarchicalMNS", "toy/0.0", "name the module as HierarchicalMNS does"),
        ("HierarchicalMNS", "Core/GCC/6.4.0/toy/0.0", "name the module as HierarchicalMNS does"),
        ("HierarchicalMNS", "Site/toy/0.0", "name the module as HierarchicalMNS does"),
    ],
)
def test_a_module_of_another_layout_than_the_build_s_scheme_is_refused(scheme, module, end):
    with pytest.raises(errors.UsageError) as raised:
        naming.check_scheme(scheme, None, [module])

    assert str(raised.value).startswith(f"{module} is not a ")
    assert str(raised.value).endswith(end)


# the scheme EasyBuild's configuration reports (a configuration file's, too)

SHOWN = """#
# Current EasyBuild configuration
# (C: command line argument, D: default value, E: environment variable, F: configuration file)
#
buildpath                      (E) = /tmp/build
module-naming-scheme           (F) = MigrateFromEBToHMNS
modules-tool                   (E) = Lmod
"""


def test_the_configured_scheme_is_read_from_show_config_with_its_source():
    assert easybuild.configured_scheme(SHOWN) == (
        "MigrateFromEBToHMNS",
        "module-naming-scheme=MigrateFromEBToHMNS (from a configuration file)",
    )
    assert easybuild.configured_scheme(SHOWN.replace("module-naming-scheme", "module-syntax")) == (None, None)


def _request(modules):
    class Request:  # only what refuse_configured_scheme reads
        modules_requested = modules

    return Request()


def test_a_scheme_only_a_configuration_file_sets_is_refused_in_one_line():
    text = SHOWN.replace("MigrateFromEBToHMNS", "CategorizedModuleNamingScheme")

    with pytest.raises(errors.UsageError) as raised:
        rebuild.refuse_configured_scheme(_request(["toy/0.0"]), {"text": text, "error": None})

    assert str(raised.value) == (
        "module-naming-scheme=CategorizedModuleNamingScheme (from a configuration file) is not a naming "
        "scheme staged rebuilds handle (EasyBuildMNS, HierarchicalMNS, MigrateFromEBToHMNS): rebuild these "
        "modules with plain eb, or under one of those schemes"
    )


def test_a_hierarchical_name_under_easybuild_s_default_scheme_is_refused():
    with pytest.raises(errors.UsageError) as raised:
        rebuild.refuse_configured_scheme(_request([CORE]), {"text": "#\n", "error": None})

    assert str(raised.value) == (
        f"{CORE} is not a flat name, but EasyBuild would build it under the module naming scheme "
        "EasyBuildMNS, and write its module file elsewhere: give --module-naming-scheme=HierarchicalMNS "
        "to EasyBuild"
    )


def test_a_configuration_easybuild_could_not_show_refuses_nothing():
    shown = {"text": None, "error": "eb --show-config failed"}
    assert rebuild.refuse_configured_scheme(_request([CORE]), shown) is None  # no refusal raised


# several hierarchical modules in one run: dependencies first


def test_hierarchical_modules_are_ordered_by_the_short_names_their_files_load():
    texts = {
        "Core/toy-app/0.0": 'local root = "/x"\ndepends_on("libtoy/0.0")\n',
        "Core/libtoy/0.0": 'local root = "/y"\n',
    }

    assert modulefile.publish_order(texts) == ["Core/libtoy/0.0", "Core/toy-app/0.0"]
    assert easybuild.in_dependency_order(
        ["--robot", "toy-app-0.0.eb", "libtoy-0.0.eb"], ["Core/libtoy/0.0", "Core/toy-app/0.0"]
    ) == ["--robot", "libtoy-0.0.eb", "toy-app-0.0.eb"]


# wouldbuild: EasyBuild's dry run, asked where a hierarchical build would write

# As EasyBuild prints it: wrapped at 80 columns, the space before each break kept.
DRY_RUN = (
    "Dry run: printing build status of easyconfigs\n"
    "CFGS=/tmp/eb-x/tweaked_easyconfigs\n"
    " * [x] $CFGS/GCC-6.4.0-2.28.eb (module: Core | GCC/6.4.0-2.28)\n"
    " * [R] $CFGS/toy-0.0-GCC-6.4.0-2.28.eb (module: Compiler/GCC/6.4.0-2.28 | \n"
    "toy/0.0)\n"
    "== Temporary log file(s) \n"
)


def test_the_dry_run_s_modules_are_read_across_wrapped_lines_without_the_installed_ones():
    assert wouldbuild.planned_modules(DRY_RUN) == {"toy-0.0-GCC-6.4.0-2.28.eb": COMPILER}


def test_an_easyconfig_path_that_fills_a_wrapped_line_is_read_without_the_space_easybuild_dropped():
    path = "$CFGS/apps/software/ValA/1.0-GCC-6.4.0-2.28/easybuild/ValA-1.0-GCC-6.4.0-2.28.eb"
    assert len(path) == 80  # EasyBuild's width: the wrap after it leaves no space
    text = f" * [R] \n{path}\n(module: Compiler/GCC/6.4.0-2.28 | ValA/1.0)\n"

    assert wouldbuild.planned_modules(DRY_RUN + text) == {
        "toy-0.0-GCC-6.4.0-2.28.eb": COMPILER,
        "ValA-1.0-GCC-6.4.0-2.28.eb": "Compiler/GCC/6.4.0-2.28/ValA/1.0",
    }


def _fake_eb(tmp_path, hierarchical, flat):
    """An eb that prints a dry run: ``hierarchical`` names, or ``flat`` ones under EasyBuildMNS."""
    calls = tmp_path / "calls"
    eb = tmp_path / "eb"
    lines = {
        key: "".join(f" * [R] $CFGS/{ec} (module: {module})\\n" for ec, module in value.items())
        for key, value in (("h", hierarchical), ("f", flat))
    }
    eb.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in\n'
        f"*--module-naming-scheme=EasyBuildMNS*) printf '{lines['f']}' ;;\n"
        f"*) printf '{lines['h']}' ;;\nesac\n"
    )
    eb.chmod(0o755)
    return str(eb), calls


def _entry(trees, module, subdir):
    return paths.ModulePaths(trees, module, subdir, "run1")


def test_a_hierarchical_run_that_easybuild_would_place_as_the_live_module_passes(trees, tmp_path):
    installs = {"toy-0.0.eb": "toy/0.0-GCC-6.4.0-2.28"}
    eb, calls = _fake_eb(tmp_path, {"toy-0.0.eb": COMPILER}, installs)

    wouldbuild.check(eb, [eb, "toy-0.0.eb"], {}, [_entry(trees, COMPILER, "toy/0.0-GCC-6.4.0-2.28")])

    assert len(calls.read_text().splitlines()) == 2


def test_a_hierarchical_run_that_would_build_another_module_is_refused(trees, tmp_path):
    eb, _calls = _fake_eb(tmp_path, {"toy-0.0.eb": "Core/toy/0.0"}, {"toy-0.0.eb": "toy/0.0"})

    with pytest.raises(errors.UsageError) as raised:
        wouldbuild.check(eb, [eb, "toy-0.0.eb"], {}, [_entry(trees, COMPILER, "toy/0.0-GCC-6.4.0-2.28")])

    assert str(raised.value) == (
        f"EasyBuild would build Core/toy/0.0 (its dry run), not the live {COMPILER} that --modules "
        "names: give the easyconfigs and toolchain options that build the live module; nothing was built"
    )


def test_a_hierarchical_run_that_would_install_elsewhere_is_refused(trees, tmp_path):
    eb, _calls = _fake_eb(tmp_path, {"toy-0.0.eb": CORE}, {"toy-0.0.eb": "toy/0.0"})
    entry = _entry(trees, CORE, "toy/0.0-site")

    with pytest.raises(errors.UsageError) as raised:
        wouldbuild.check(eb, [eb, "toy-0.0.eb"], {}, [entry])

    assert str(raised.value) == (
        f"EasyBuild would install {CORE} in {trees.software}/toy/0.0, but the live module's install is "
        f"{entry.stable_path}; nothing was built"
    )


def test_a_flat_run_asks_easybuild_nothing(trees, tmp_path):
    eb, calls = _fake_eb(tmp_path, {}, {})

    wouldbuild.check(eb, [eb, "toy-0.0.eb"], {}, [_entry(trees, "toy/0.0", "toy/0.0")])

    assert not calls.exists()
