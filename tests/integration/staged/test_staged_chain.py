"""Stack rebuilds (``--with-dependants``) with the real EasyBuild, Lmod and Environment Modules.

The live tree (``harness/chainsite.py``) holds a library that compiles a value into its
header and shared library (``ValLib``, built with ``VAL=1``), two direct dependants and one
dependant of a dependant that compile the header's value into a program and link the library
through the RPATH EasyBuild's wrappers (``--rpath``) write, and an unrelated package. The
rebuild gives ValLib's easyconfig with ``VAL=2``; each dependant is rebuilt from its own
install's easyconfig copy. A dependant that was not rebuilt against the new library would
print the old value where it compiled the header, and a binary built in a stage directory
would name that directory in its RPATH.

Each tree is built once per module with plain ``eb`` and given back as built to each test
(``PristineSite``).
"""

from __future__ import annotations

import json
import os

import pytest

import chainpkgs
from tests.integration.harness import chainsite, toysite
from tests.integration.harness.ebsite import result_json

BACKENDS = ["bwrap", "userns"]
LIB = chainpkgs.LIB
UNRELATED = chainpkgs.UNRELATED
FAILING = "ValB"  # a direct dependant, built after ValLib and before or after ValA


@pytest.fixture(scope="module")
def flat_tree(lmod, tmp_path_factory) -> tuple:
    site = toysite.new_site(lmod, tmp_path_factory, "chain-site")
    chain = chainsite.build(site)
    return chain, toysite.PristineSite(site, tmp_path_factory.mktemp("chain-site-as-built"))


@pytest.fixture
def chain(flat_tree) -> chainsite.ChainSite:
    chain, pristine = flat_tree
    pristine.fresh()
    return chain


@pytest.fixture(scope="module")
def hierarchical_tree(lmod, toy_material, tmp_path_factory) -> tuple:
    site = toysite.new_site(lmod, tmp_path_factory, "chain-hmns-site")
    chain = chainsite.build(site, toy_material)
    return chain, toysite.PristineSite(site, tmp_path_factory.mktemp("chain-hmns-site-as-built"))


@pytest.fixture
def hierarchical_chain(hierarchical_tree) -> chainsite.ChainSite:
    chain, pristine = hierarchical_tree
    pristine.fresh()
    return chain


def _assert_build_order(chain, result) -> None:
    """The run's modules: ValLib and its dependants, ValLib first, ValC after ValA."""
    order = [entry["module"] for entry in result["modules"]]
    assert sorted(order) == sorted(chain.module(name) for name in chain.members), order
    assert order[0] == chain.module(LIB)
    assert order.index(chain.module("ValC")) > order.index(chain.module("ValA"))


def _assert_rpaths_live(chain, run_id, before) -> None:
    """Every rebuilt ELF file's RPATH is what the plain build in place wrote: only ``$ORIGIN``
    and live install directories, none of the run's generation or EasyBuild's build paths."""
    site = chain.site
    for name in chain.members:
        rpaths = chain.rpaths(name)
        assert rpaths, f"{name} has no ELF file with an RPATH"
        assert rpaths == before[name], name
        for path, entries in rpaths.items():
            for entry in entries:
                if entry.startswith("$ORIGIN"):
                    continue
                assert entry.startswith(f"{site.software}/"), (name, path, entry)
                assert ".eb-staged-rebuild" not in entry, (name, path, entry)
                assert run_id not in entry, (name, path, entry)
                install = entry[len(f"{site.software}/") :].split("/")[:2]
                assert (site.software / "/".join(install)).is_dir(), (name, path, entry)


def _assert_published_and_rolled_back(chain, backend, tool=None) -> dict:
    """Rebuild ValLib with its dependants, check what is live, roll back, check again.

    ``tool``: Environment Modules, to load every dependant with it as well as with Lmod.
    """
    members = chain.members
    before = chain.state_of(*members)
    inodes = {name: chain.live(name).stat().st_ino for name in members}
    unrelated = chain.untouched(UNRELATED)
    rpaths = {name: chain.rpaths(name) for name in members}
    tools = [None] if tool is None else [None, tool]
    for each in tools:
        assert chain.outputs(each) == chain.expected_outputs(1)

    done = chain.run_tool(*chain.rebuild_args(backend))

    result = result_json(done)
    assert (result["state"], result["backend"]) == ("published", backend)
    _assert_build_order(chain, result)
    for each in tools:  # every dependant was rebuilt against the new ValLib, and links it
        assert chain.outputs(each) == chain.expected_outputs(2)
    for name in members:
        assert chain.live(name).stat().st_ino != inodes[name], name
        text = chain.module_file(name).read_text()
        assert text.startswith("#%Module") == chain.hierarchical  # the syntax kept
        assert str(chain.live(name)) in text
        assert str(chain.site.generation(result["run_id"])) not in text
    _assert_rpaths_live(chain, result["run_id"], rpaths)
    assert chain.untouched(UNRELATED) == unrelated

    back = chain.run_tool("--json", "rollback", result["run_id"])

    assert back.returncode == 0, back.stderr[-2000:]
    assert chain.state_of(*members) == before
    assert chain.untouched(UNRELATED) == unrelated
    for each in tools:
        assert chain.outputs(each) == chain.expected_outputs(1)
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_dependants_rebuilds_every_dependant_against_the_new_library_and_rolls_back(chain, backend):
    _assert_published_and_rolled_back(chain, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dependant_whose_build_fails_leaves_every_member_live_as_it_was(chain, backend):
    chainpkgs.write_failing_build(chain.own_easyconfig(FAILING))
    before = chain.site.snapshot()

    done = chain.run_tool(*chain.rebuild_args(backend))

    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert chain.site.snapshot() == before  # inode and bytes of every member, and of the rest
    assert chain.outputs() == chain.expected_outputs(1)
    (journal,) = chain.site.journals()
    assert json.loads(journal.read_text())["state"] == "failed"
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith(f"eb-staged-rebuild: {chain.module(FAILING)} failed to build: "), line
    # EasyBuild's reason: the build command that failed, and where
    assert "shell command 'false " in line, line
    assert "in build step" in line, line


@pytest.mark.parametrize("backend", ["userns"])
def test_a_hierarchical_tcl_chain_is_published_loads_in_both_module_tools_and_rolls_back(
    hierarchical_chain, environment_modules, backend
):
    for name in (*hierarchical_chain.members, UNRELATED):
        module_file = hierarchical_chain.module_file(name)
        assert module_file.read_text().startswith("#%Module"), module_file
        assert not os.path.exists(f"{module_file}.lua")

    result = _assert_published_and_rolled_back(hierarchical_chain, backend, environment_modules)

    assert result["modules"][0]["module"] == f"{chainsite.COMPILER_LEVEL}/{LIB}/{chainpkgs.VERSION}"
