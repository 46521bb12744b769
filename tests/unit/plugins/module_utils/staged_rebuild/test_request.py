"""The rebuild request: resolved once from the options and the host's variables
(``request.resolve``, ``request.live_trees``), checked once against the disk, and kept in the
journal as it is.

The live tree is a real directory under ``tmp_path`` (``software/TinyApp/1.0``); ``eb`` is an
executable file that is never run.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import paths, records, settings
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import request as request_module
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.ledger import LedgerConfig
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.request import RebuildRequest

APP = "TinyApp/1.0"
BACKENDS = "auto, bwrap, userns, installpath"


@pytest.fixture
def site(tmp_path):
    (tmp_path / "apps" / "software" / "TinyApp" / "1.0").mkdir(parents=True)
    (tmp_path / "apps" / "modules" / "all" / "TinyApp").mkdir(parents=True)
    eb = tmp_path / "bin" / "eb"
    eb.parent.mkdir()
    eb.write_text("#!/bin/sh\nexit 0\n")
    eb.chmod(0o755)
    return tmp_path


def _values(site, **changes):
    values = {"installpath": str(site / "apps"), "modules": [APP], "eb": str(site / "bin" / "eb")}
    values.update(changes)
    return values


def _resolve(site, environ=None, eb_args=("TinyApp-1.0.eb",), **changes):
    return request_module.resolve(_values(site, **changes), environ or {}, list(eb_args))


def _refusal(site, environ=None, **changes):
    with pytest.raises(errors.UsageError) as raised:
        _resolve(site, environ, **changes)
    message = raised.value.render(settings.flag)
    assert "\n" not in message
    return message


# live_trees: the options first, then EasyBuild's variables


def test_live_trees_of_installpath_are_its_software_and_modules():
    trees = request_module.live_trees({"installpath": "/apps"}, {"EASYBUILD_INSTALLPATH": "/other"})

    assert trees == paths.Trees("/apps/software", "/apps/modules")


def test_live_trees_of_the_two_tree_options_are_those_trees():
    trees = request_module.live_trees({"installpath_software": "/s", "installpath_modules": "/m"}, {})

    assert trees == paths.Trees("/s", "/m")


@pytest.mark.parametrize("given", ["installpath_software", "installpath_modules"])
def test_one_tree_option_without_the_other_is_refused(given):
    with pytest.raises(errors.UsageError) as raised:
        request_module.live_trees({given: "/x"}, {})

    assert (
        raised.value.render(settings.flag) == "--installpath-software and --installpath-modules go together"
    )


def test_live_trees_come_from_easybuild_installpath_without_an_option():
    trees = request_module.live_trees({}, {"EASYBUILD_INSTALLPATH": "/apps"})

    assert trees == paths.Trees("/apps/software", "/apps/modules")


def test_the_tree_variables_beat_easybuild_installpath_as_in_easybuild():
    environ = {"EASYBUILD_INSTALLPATH": "/apps", "EASYBUILD_INSTALLPATH_MODULES": "/mods"}

    assert request_module.live_trees({}, environ) == paths.Trees("/apps/software", "/mods")


def test_an_option_beats_every_variable():
    environ = {"EASYBUILD_INSTALLPATH_SOFTWARE": "/s", "EASYBUILD_INSTALLPATH_MODULES": "/m"}

    assert request_module.live_trees({"installpath": "/apps"}, environ) == paths.Trees(
        "/apps/software", "/apps/modules"
    )


@pytest.mark.parametrize(
    ("environ", "tree"),
    [({}, "software"), ({"EASYBUILD_INSTALLPATH_SOFTWARE": "/s"}, "modules")],
    ids=["nothing", "software-only"],
)
def test_no_install_path_for_a_tree_is_refused_naming_the_tree(environ, tree):
    with pytest.raises(errors.UsageError) as raised:
        request_module.live_trees({}, environ)

    assert raised.value.render(settings.flag) == (
        f"no install path for {tree}: give --installpath DIR (or set EASYBUILD_INSTALLPATH)"
    )


# resolve: what the request holds


def test_resolve_gives_the_request_with_every_path_absolute(site):
    request = _resolve(site, run_id="run1", skip_live_check=True)

    assert request == RebuildRequest(
        software=str(site / "apps" / "software"),
        modules=str(site / "apps" / "modules"),
        modules_requested=[APP],
        eb=str(site / "bin" / "eb"),
        eb_args=["TinyApp-1.0.eb"],
        run_id="run1",
        backend="auto",
        skip_live_check=True,
        allow_unrelocated=False,
        prepare=None,
        ledger_config=None,
        lock_timeout=0.0,
        ledger=None,
    )
    assert request.trees == paths.Trees(str(site / "apps" / "software"), str(site / "apps" / "modules"))
    assert [entry.stable_path for entry in request.module_paths("run1")] == [
        str(site / "apps" / "software" / "TinyApp" / "1.0")
    ]


def test_resolve_names_a_run_without_a_run_id_by_the_time_and_a_random_suffix(site):
    first, second = _resolve(site), _resolve(site)

    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", first.run_id)
    assert first.run_id != second.run_id


def test_an_empty_run_id_is_refused_not_replaced_by_a_generated_one(site):
    assert _refusal(site, run_id="") == "run id '' is not a plain name ([A-Za-z0-9._-], at most 128)"


def test_resolve_takes_the_lock_timeout(site):
    assert _resolve(site, lock_timeout=2.5).lock_timeout == 2.5


def test_resolve_takes_eb_from_the_variable(site):
    environ = {settings.EB_VARIABLE: str(site / "bin" / "eb")}

    assert request_module.resolve(
        {"installpath": str(site / "apps"), "modules": [APP]}, environ, []
    ).eb == str(site / "bin" / "eb")


# resolve: the backend


def test_the_backend_comes_from_the_variable_without_the_option(site):
    assert _resolve(site, {settings.BACKEND_VARIABLE: "userns"}).backend == "userns"


def test_the_backend_option_beats_the_variable(site):
    assert (
        _resolve(site, {settings.BACKEND_VARIABLE: "userns"}, backend="installpath").backend == "installpath"
    )


def test_an_empty_backend_variable_counts_as_unset(site):
    assert _resolve(site, {settings.BACKEND_VARIABLE: ""}).backend == "auto"


def test_an_unknown_backend_option_is_refused_naming_the_option(site):
    assert _refusal(site, backend="chroot") == f"--backend chroot is not one of {BACKENDS}"


def test_an_unknown_backend_variable_is_refused_naming_the_variable(site):
    assert _refusal(site, {settings.BACKEND_VARIABLE: "docker"}) == (
        f"EB_STAGED_REBUILD_BACKEND='docker' is not one of {BACKENDS}"
    )


# resolve: the ledger


def test_the_ledger_configuration_is_read_once_and_kept_with_its_absolute_name(site, monkeypatch):
    (site / "ledger-config.json").write_text(json.dumps({"path": "/var/lib/ledger.jsonl", "site": "hpc1"}))
    monkeypatch.chdir(site)

    request = _resolve(site, ledger_config="ledger-config.json")

    assert request.ledger_config == str(site / "ledger-config.json")
    assert request.ledger == LedgerConfig("/var/lib/ledger.jsonl", "hpc1")
    assert request.ledger_settings() == request.ledger


def test_a_request_stored_without_its_ledger_reads_the_configuration_again(site):
    # What a journal of the previous release holds: the file's name only.
    (site / "ledger-config.json").write_text(json.dumps({"path": "/var/lib/ledger.jsonl"}))
    request = RebuildRequest(
        software="/apps/software",
        modules="/apps/modules",
        modules_requested=[APP],
        eb="/opt/eb",
        eb_args=[],
        ledger_config=str(site / "ledger-config.json"),
    )

    assert request.ledger_settings() == LedgerConfig("/var/lib/ledger.jsonl", "")


def test_a_request_without_a_ledger_has_none():
    assert RebuildRequest("/s", "/m", [APP], "/opt/eb", []).ledger_settings() is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read --ledger-config {config}: No such file or directory"),
        ("{", "--ledger-config {config} is not JSON"),
        (
            json.dumps({"path": "ledger.jsonl"}),
            "--ledger-config {config}: path 'ledger.jsonl' is not absolute",
        ),
        (
            json.dumps({"path": "/var/lib/../ledger.jsonl"}),
            "--ledger-config {config}: path '/var/lib/../ledger.jsonl' has a '..' component",
        ),
    ],
    ids=["missing", "not-json", "relative", "dot-dot"],
)
def test_a_ledger_configuration_that_is_refused_refuses_the_request(site, content, message):
    config = site / "ledger-config.json"
    if content is not None:
        config.write_text(content)

    assert _refusal(site, ledger_config=str(config)) == message.format(config=config)


# resolve: the checks against the disk, before anything is written


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"modules": []}, "rebuild needs at least one --module NAME/VERSION"),
        ({"modules": None}, "rebuild needs at least one --module NAME/VERSION"),
        ({"modules": [APP, APP]}, "--module TinyApp/1.0 is given twice"),
        (
            {"modules": ["../1.0"]},
            "--module '../1.0' is not NAME/VERSION of plain names (no '..', no '/', no leading '.')",
        ),
        ({"run_id": "a/b"}, "run id 'a/b' is not a plain name ([A-Za-z0-9._-], at most 128)"),
    ],
    ids=["no-module", "modules-null", "twice", "not-name-version", "bad-run-id"],
)
def test_a_bad_request_is_refused_naming_the_option(site, changes, message):
    assert _refusal(site, **changes) == message


def test_a_module_that_is_not_installed_is_refused(site):
    missing = site / "apps" / "software" / "Missing" / "1.0"

    assert _refusal(site, modules=["Missing/1.0"]) == (
        f"Missing/1.0 is not installed: {missing} does not exist "
        "(a staged rebuild replaces an existing install)"
    )


def test_a_run_id_whose_retired_path_exists_is_refused(site):
    (site / "apps" / "software" / "TinyApp" / ".1.0.run1").mkdir()

    assert _refusal(site, run_id="run1") == (
        f"{site}/apps/software/TinyApp/.1.0.run1 exists already; pick another --run-id"
    )


@pytest.mark.parametrize("eb", ["missing", "not-executable", "a-directory"])
def test_an_easybuild_that_is_not_an_executable_file_is_refused(site, eb):
    path = site / "bin" / eb
    if eb == "not-executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    elif eb == "a-directory":
        path.mkdir()

    assert _refusal(site, eb=str(path)) == (
        f"EasyBuild command {path} is not an executable file (--eb, EB_STAGED_REBUILD_EB)"
    )


def test_resolve_writes_nothing(site):
    before = sorted(os.walk(site))

    _resolve(site, run_id="run1")

    assert sorted(os.walk(site)) == before


# the journal keeps the request as it is


def test_the_request_round_trips_through_the_journal_s_records(site):
    (site / "ledger-config.json").write_text(json.dumps({"path": "/var/lib/ledger.jsonl", "site": "hpc1"}))
    request = _resolve(
        site, run_id="run1", prepare="make check", ledger_config=str(site / "ledger-config.json")
    )

    assert records.load(RebuildRequest, records.dump(request)) == request


# the module syntax: the live file's, refused before anything is built when the run asks otherwise


def _tcl_live(site):
    (site / "apps" / "modules" / "all" / "TinyApp" / "1.0").write_text("#%Module\nset root /x\n")


def test_a_tcl_live_module_is_built_as_tcl_whatever_the_site_s_default(site):
    _tcl_live(site)

    request = _resolve(site, environ={"EASYBUILD_MODULE_SYNTAX": "Lua"})

    assert request.module_syntax("run1") == "Tcl"


def test_a_tcl_live_module_with_an_explicit_lua_syntax_is_refused_before_anything_is_written(site):
    _tcl_live(site)
    before = sorted(str(path) for path in site.rglob("*"))

    message = _refusal_with_args(site, ["--module-syntax=Lua", "TinyApp-1.0.eb"])

    assert message == (
        f"TinyApp/1.0's live module file {site}/apps/modules/all/TinyApp/1.0 is Tcl, and the EasyBuild "
        "arguments ask for --module-syntax=Lua: a staged rebuild keeps each module's syntax "
        "(give --module-syntax=Tcl or leave the option out)"
    )
    assert sorted(str(path) for path in site.rglob("*")) == before


def test_a_lua_live_module_with_an_explicit_tcl_syntax_is_refused(site):
    (site / "apps" / "modules" / "all" / "TinyApp" / "1.0.lua").write_text('local root = "/x"\n')

    message = _refusal_with_args(site, ["--module-syntax", "Tcl", "TinyApp-1.0.eb"])

    assert "is Lua, and the EasyBuild arguments ask for --module-syntax=Tcl" in message


def _refusal_with_args(site, eb_args):
    with pytest.raises(errors.UsageError) as raised:
        _resolve(site, eb_args=eb_args)
    message = raised.value.render(settings.flag)
    assert "\n" not in message
    return message


def test_the_build_order_puts_a_dependency_first_as_the_live_module_files_say(site):
    for name in ("libtoy", "toy-app"):
        (site / "apps" / "software" / name / "0.0").mkdir(parents=True)
        (site / "apps" / "modules" / "all" / name).mkdir(parents=True)
    (site / "apps" / "modules" / "all" / "libtoy" / "0.0.lua").write_text('local root = "/x"\n')
    (site / "apps" / "modules" / "all" / "toy-app" / "0.0.lua").write_text(
        'local root = "/y"\ndepends_on("libtoy/0.0")\n'
    )

    request = _resolve(
        site, modules=["toy-app/0.0", "libtoy/0.0"], eb_args=["toy-app-0.0.eb", "libtoy-0.0.eb"]
    )

    assert request.build_order("run1") == ["libtoy/0.0", "toy-app/0.0"]


# hierarchical naming: the live tree says which module a name means and where it is installed

HMNS = ["--module-naming-scheme=HierarchicalMNS"]
CORE_TOY = "Core/toy/0.0"
COMPILER_TOY = "Compiler/GCC/6.4.0-2.28/toy/0.0"


def _live_module(site, module, install_subdir, tcl=False):
    software = site / "apps" / "software" / install_subdir
    software.mkdir(parents=True, exist_ok=True)
    module_file = site / "apps" / "modules" / "all" / (module if tcl else module + ".lua")
    module_file.parent.mkdir(parents=True, exist_ok=True)
    root = f"set root    {software}\n" if tcl else f'local root = "{software}"\n'
    module_file.write_text(("#%Module\n" if tcl else "") + root)
    return software


@pytest.fixture
def hmns_site(site):
    """Core/toy/0.0 (Lua) in software/toy/0.0, Compiler/GCC/6.4.0-2.28/toy/0.0 (Tcl) in
    software/toy/0.0-GCC-6.4.0-2.28, and the GCC toolchain module they are built with."""
    _live_module(site, CORE_TOY, "toy/0.0")
    _live_module(site, COMPILER_TOY, "toy/0.0-GCC-6.4.0-2.28", tcl=True)
    _live_module(site, "Core/GCC/6.4.0-2.28", "GCC/6.4.0-2.28", tcl=True)
    return site


@pytest.mark.parametrize(
    ("module", "install"), [(CORE_TOY, "toy/0.0"), (COMPILER_TOY, "toy/0.0-GCC-6.4.0-2.28")]
)
def test_a_full_hierarchical_name_is_the_live_module_installed_where_its_root_says(
    hmns_site, module, install
):
    request = _resolve(hmns_site, eb_args=[*HMNS, "toy-0.0.eb"], modules=[module])

    (entry,) = request.module_paths("run1")
    assert request.modules_requested == [module]
    assert (entry.module, entry.install_subdir) == (module, install)
    assert entry.stable_path == str(hmns_site / "apps" / "software" / install)
    assert entry.retired_path == str(hmns_site / "apps" / "software" / "toy" / f".{install[4:]}.run1")
    assert entry.module_file() == str(hmns_site / "apps" / "modules" / "all" / module) + (
        ".lua" if module == CORE_TOY else ""
    )


def test_an_unambiguous_short_name_is_the_one_live_module_that_ends_so(hmns_site):
    (hmns_site / "apps" / "modules" / "all" / "Core" / "toy" / "0.0.lua").unlink()

    request = _resolve(hmns_site, eb_args=[*HMNS, "toy-0.0.eb"], modules=["toy/0.0"])

    assert request.modules_requested == [COMPILER_TOY]
    assert request.module_paths("run1")[0].install_subdir == "toy/0.0-GCC-6.4.0-2.28"


def test_an_ambiguous_short_name_is_refused_naming_the_candidates(hmns_site):
    assert _refusal(hmns_site, modules=["toy/0.0"]) == (
        f"--module toy/0.0 is ambiguous: the live tree has {COMPILER_TOY}, {CORE_TOY}; "
        "give the full module name"
    )


def test_a_hierarchical_name_that_matches_no_live_module_is_refused(hmns_site):
    assert _refusal(hmns_site, modules=["MPI/GCC/6.4.0-2.28/OpenMPI/2.1.2/toy/0.0"]) == (
        "--module MPI/GCC/6.4.0-2.28/OpenMPI/2.1.2/toy/0.0 matches no live module file under "
        f"{hmns_site}/apps/modules/all"
    )


def test_a_hierarchical_module_whose_root_is_not_an_install_of_the_software_tree_is_refused(hmns_site):
    module_file = hmns_site / "apps" / "modules" / "all" / "Core" / "toy" / "0.0.lua"
    module_file.write_text('local root = "/opt/elsewhere/toy/0.0"\n')

    assert _refusal(hmns_site, eb_args=[*HMNS, "toy-0.0.eb"], modules=[CORE_TOY]) == (
        f"Core/toy/0.0's live module file {module_file} names root /opt/elsewhere/toy/0.0, which is not "
        f"<Name>/<version> under the software tree {hmns_site}/apps/software; a staged rebuild finds the "
        "install by it"
    )


def test_a_hierarchical_name_without_a_scheme_given_is_left_to_easybuild_s_configuration(hmns_site):
    # A configuration file may set the scheme: the rebuild asks EasyBuild (--show-config).
    assert _resolve(hmns_site, eb_args=["toy-0.0.eb"], modules=[CORE_TOY]).modules_requested == [CORE_TOY]


@pytest.mark.parametrize(
    ("environ", "eb_args", "said"),
    [
        (
            {"EASYBUILD_MODULE_NAMING_SCHEME": "HierarchicalMNS"},
            [],
            "EASYBUILD_MODULE_NAMING_SCHEME=HierarchicalMNS",
        ),
        ({}, ["--module-naming-scheme=HierarchicalMNS"], "--module-naming-scheme=HierarchicalMNS"),
        ({}, ["--module-naming-scheme", "MigrateFromEBToHMNS"], "--module-naming-scheme=MigrateFromEBToHMNS"),
    ],
)
def test_a_flat_name_built_under_a_hierarchical_scheme_is_refused(site, environ, eb_args, said):
    before = sorted(str(path) for path in site.rglob("*"))
    with pytest.raises(errors.UsageError) as raised:
        _resolve(site, environ, eb_args=[*eb_args, "TinyApp-1.0.eb"])

    assert str(raised.value) == (
        f"TinyApp/1.0 is not a hierarchical name (Core/..., Compiler/..., MPI/...), but EasyBuild would "
        f"build it under {said}, and write its module file elsewhere: name the module as "
        f"{said.split('=')[1]} does"
    )
    assert sorted(str(path) for path in site.rglob("*")) == before


@pytest.mark.parametrize(
    ("environ", "eb_args"),
    [
        ({"EASYBUILD_MODULE_NAMING_SCHEME": "HierarchicalMNS"}, []),
        ({}, ["--module-naming-scheme", "MigrateFromEBToHMNS"]),
        # The run's own option beats the site's variable, as in EasyBuild.
        ({"EASYBUILD_MODULE_NAMING_SCHEME": "EasyBuildMNS"}, ["--module-naming-scheme=HierarchicalMNS"]),
    ],
)
def test_a_hierarchical_name_under_a_hierarchical_scheme_is_accepted(hmns_site, environ, eb_args):
    request = _resolve(hmns_site, environ, eb_args=[*eb_args, "toy-0.0.eb"], modules=[COMPILER_TOY])

    assert request.modules_requested == [COMPILER_TOY]


@pytest.mark.parametrize("scheme", ["CategorizedModuleNamingScheme", "CategorizedHMNS", "MyOwnMNS"])
def test_a_scheme_the_tool_does_not_place_is_refused_before_anything_is_built(site, scheme):
    before = sorted(str(path) for path in site.rglob("*"))

    assert _refusal(site, eb_args=[f"--module-naming-scheme={scheme}", "TinyApp-1.0.eb"]) == (
        f"--module-naming-scheme={scheme} is not a naming scheme staged rebuilds handle (EasyBuildMNS, "
        "HierarchicalMNS, MigrateFromEBToHMNS): rebuild these modules with plain eb, or under one of those "
        "schemes"
    )
    assert sorted(str(path) for path in site.rglob("*")) == before


@pytest.mark.parametrize(
    ("environ", "eb_args"),
    [
        ({"EASYBUILD_MODULE_NAMING_SCHEME": "EasyBuildMNS"}, []),
        ({"EASYBUILD_MODULE_NAMING_SCHEME": "HierarchicalMNS"}, ["--module-naming-scheme=EasyBuildMNS"]),
    ],
)
def test_the_flat_naming_scheme_is_accepted(site, environ, eb_args):
    assert _resolve(site, environ, eb_args=[*eb_args, "TinyApp-1.0.eb"]).modules_requested == [APP]
