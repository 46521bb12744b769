"""The module syntax of a staged build (``syntax``): the live module files' own, whatever the
site's default; a run's explicit ``--module-syntax`` for the other one, and a run whose modules
have both syntaxes, refused before anything is built."""

from __future__ import annotations

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import syntax

TCL_FILE = "/apps/modules/all/toy/0.0"
LUA_FILE = "/apps/modules/all/toy/0.0.lua"


@pytest.mark.parametrize(
    ("module_file", "expected"),
    [(LUA_FILE, "Lua"), (TCL_FILE, "Tcl"), ("/apps/modules/all/x/1.lua.bak", "Tcl")],
)
def test_a_module_file_is_lua_by_its_suffix_and_tcl_otherwise(module_file, expected):
    assert syntax.of_module_file(module_file) == expected


@pytest.mark.parametrize(
    ("eb_args", "expected"),
    [
        (["toy-0.0.eb"], None),
        (["--module-syntax=Tcl", "toy-0.0.eb"], "Tcl"),
        (["--module-syntax", "Lua", "toy-0.0.eb"], "Lua"),
        (["--module-syntax=Tcl", "--module-syntax=Lua"], "Lua"),
        (["--module-syntax"], None),
    ],
)
def test_the_requested_syntax_is_the_last_module_syntax_option(eb_args, expected):
    assert syntax.requested(eb_args) == expected


@pytest.mark.parametrize(("module_file", "expected"), [(TCL_FILE, "Tcl"), (LUA_FILE, "Lua")])
def test_a_run_without_the_option_builds_in_the_live_file_s_syntax(module_file, expected):
    assert syntax.for_run(["toy/0.0"], [module_file], ["toy-0.0.eb"]) == expected


@pytest.mark.parametrize("given", ["--module-syntax=Tcl", "--module-syntax=tcl"])
def test_the_option_for_the_live_syntax_is_accepted(given):
    assert syntax.for_run(["toy/0.0"], [TCL_FILE], [given, "toy-0.0.eb"]) == "Tcl"


@pytest.mark.parametrize(
    ("module_file", "given", "live", "asked"),
    [(TCL_FILE, "Lua", "Tcl", "Lua"), (LUA_FILE, "Tcl", "Lua", "Tcl")],
)
def test_the_option_for_the_other_syntax_is_refused_saying_how_to_keep_it(module_file, given, live, asked):
    with pytest.raises(errors.UsageError) as raised:
        syntax.for_run(["toy/0.0"], [module_file], [f"--module-syntax={given}", "toy-0.0.eb"])

    assert str(raised.value) == (
        f"toy/0.0's live module file {module_file} is {live}, and the EasyBuild arguments ask for "
        f"--module-syntax={asked}: a staged rebuild keeps each module's syntax "
        f"(give --module-syntax={live} or leave the option out)"
    )


def test_modules_of_both_syntaxes_in_one_run_are_refused_naming_one_of_each():
    with pytest.raises(errors.UsageError) as raised:
        syntax.for_run(
            ["libtoy/0.0", "toy/0.0"], ["/apps/modules/all/libtoy/0.0.lua", TCL_FILE], ["toy-0.0.eb"]
        )

    assert str(raised.value) == (
        "toy/0.0 has a Tcl module file and libtoy/0.0 a Lua one; EasyBuild writes one module syntax "
        "per run: rebuild them in separate runs"
    )


@pytest.mark.parametrize("live", ["Lua", "Tcl"])
def test_the_placement_names_the_syntax(live):
    assert syntax.placement(live) == [f"--module-syntax={live}"]
