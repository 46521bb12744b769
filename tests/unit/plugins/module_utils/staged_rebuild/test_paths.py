"""Where things are, and the refusals: module names, run ids, live directories, the state root.

Every refusal is shown on a real tree under ``tmp_path``: real symlinks, real files where a
directory belongs, real modes.
"""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import paths, records


@pytest.fixture
def trees(tmp_path):
    software, modules = tmp_path / "apps" / "software", tmp_path / "apps" / "modules"
    software.mkdir(parents=True)
    (modules / "all").mkdir(parents=True)
    return paths.Trees(str(software), str(modules))


def _module(trees, name="TinyApp", version="1.0", run_id="run1"):
    return paths.ModulePaths(trees, f"{name}/{version}", f"{name}/{version}", run_id)


def _live(trees, name="TinyApp", version="1.0"):
    live = os.path.join(trees.software, name, version)
    os.makedirs(live)
    return live


# parse_module


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("GROMACS/2024.1-foss-2023b", ("GROMACS", "2024.1-foss-2023b")),
        ("Python/3.11.5-GCCcore-13.2.0", ("Python", "3.11.5-GCCcore-13.2.0")),
        ("R-bundle/2023.12", ("R-bundle", "2023.12")),
        ("libsigc++/3.4.0-GCCcore-12.3.0", ("libsigc++", "3.4.0-GCCcore-12.3.0")),
        ("Boost.Python/1.83.0-GCC-13.2.0", ("Boost.Python", "1.83.0-GCC-13.2.0")),
        ("4ti2/1.6.10-GCC-13.2.0", ("4ti2", "1.6.10-GCC-13.2.0")),
        ("SciPy-bundle/2023.11-gfbf-2023b", ("SciPy-bundle", "2023.11-gfbf-2023b")),
        ("TensorFlow/2.13.0-foss-2023a-CUDA-12.1.1", ("TensorFlow", "2.13.0-foss-2023a-CUDA-12.1.1")),
        ("Bio_Utils/1.0_rc1", ("Bio_Utils", "1.0_rc1")),
        ("foss/2023b", ("foss", "2023b")),
    ],
)
def test_parse_module_accepts_easybuild_names(value, expected):
    assert paths.parse_module(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "..",
        "../x",
        "Name/..",
        ".",
        "Name/.",
        "./1.0",
        "",
        "/",
        "Name",
        "Name/",
        "/Name/1.0",
        "/abs/path/1.0",
        "A/B/C",
        "Name/1.0/bin",
        ".hidden/1.0",
        "Name/.1.0",
        "Name/.1.0.run1",
        "-rf/1.0",
        "Name/1 0",
        "Name/1.0\n",
        "Name\n/1.0",
    ],
)
def test_parse_module_refuses_what_could_leave_a_root_or_is_not_a_plain_name(value):
    with pytest.raises(errors.UsageError) as raised:
        paths.parse_module(value)

    assert repr(value) in str(raised.value)
    assert "NAME/VERSION" in str(raised.value)


# check_run_id


@pytest.mark.parametrize(
    "run_id", ["run1", "20261130T101500Z-3fa2c1", "retire-20261130T101500123456Z", "a", "x" * 128]
)
def test_check_run_id_accepts_plain_names_up_to_128_characters(run_id):
    assert paths.check_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "run_id",
    ["", ".", "..", ".hidden", "-x", "a/b", "../x", "a b", "x" * 129, "run1\n", "run\x00", "r\u00e9"],
    ids=[
        "empty",
        "dot",
        "dotdot",
        "hidden",
        "dash",
        "slash",
        "up",
        "space",
        "129",
        "newline",
        "nul",
        "non-ascii",
    ],
)
def test_check_run_id_refuses_anything_but_a_plain_name(run_id):
    with pytest.raises(errors.UsageError) as raised:
        paths.check_run_id(run_id)

    assert repr(run_id) in str(raised.value)


# require_inside


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/apps/software/TinyApp/1.0", "/apps/software/TinyApp/1.0"),
        ("/apps/software/TinyApp/./1.0", "/apps/software/TinyApp/1.0"),
        ("/apps/software//TinyApp/1.0/", "/apps/software/TinyApp/1.0"),
        ("/apps/software", "/apps/software"),
    ],
)
def test_require_inside_returns_the_normalised_path_under_the_root(path, expected):
    assert paths.require_inside(path, "/apps/software", "root") == expected


@pytest.mark.parametrize(
    "path",
    [
        "/apps/software/../etc",
        "/apps/software/TinyApp/../../etc",
        "/apps/software/TinyApp/../Other/1.0",
        "/apps/software-old/TinyApp/1.0",
        "/apps/softwareX",
        "/apps",
        "/etc/passwd",
        "apps/software/TinyApp/1.0",
        "TinyApp/1.0",
    ],
)
def test_require_inside_refuses_a_path_that_leaves_the_root_or_is_relative(path):
    with pytest.raises(errors.UsageError) as raised:
        paths.require_inside(path, "/apps/software", "module root")

    assert str(raised.value) == f"module root {path} leaves /apps/software"


def test_require_inside_accepts_a_root_given_with_a_trailing_slash():
    assert paths.require_inside("/apps/software/A/1", "/apps/software/", "root") == "/apps/software/A/1"


# Trees and ModulePaths


def test_trees_from_installpath_names_software_and_modules(tmp_path):
    trees = paths.Trees.from_installpath(str(tmp_path / "apps"))

    assert (trees.software, trees.modules) == (f"{tmp_path}/apps/software", f"{tmp_path}/apps/modules")
    assert trees.modules_all == f"{tmp_path}/apps/modules/all"


def test_trees_are_a_record_the_journal_stores_and_reads_back(tmp_path):
    trees = paths.Trees.from_installpath(str(tmp_path / "apps"))

    stored = records.dump(trees)

    assert stored == {"software": f"{tmp_path}/apps/software", "modules": f"{tmp_path}/apps/modules"}
    assert records.load(paths.Trees, stored) == trees


def test_trees_make_relative_roots_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    trees = paths.Trees("software", "modules")

    assert (trees.software, trees.modules) == (f"{tmp_path}/software", f"{tmp_path}/modules")


def test_the_generation_lies_inside_the_software_root(trees):
    assert trees.generation("run1") == os.path.join(trees.software, ".eb-staged-rebuild", "run1")


def test_module_paths_name_the_stable_and_the_retired_path(trees):
    module = _module(trees, "GROMACS", "2024.1-foss-2023b", "20261130T101500Z-3fa2c1")

    assert module.module == "GROMACS/2024.1-foss-2023b"
    assert module.stable_path == os.path.join(trees.software, "GROMACS", "2024.1-foss-2023b")
    assert module.module_dir == os.path.join(trees.modules, "all", "GROMACS")


def test_the_retired_path_is_the_hidden_sibling_dot_version_dot_run_id(trees):
    module = _module(trees, "TinyApp", "1.0", "run1")

    assert os.path.dirname(module.retired_path) == os.path.dirname(module.stable_path)
    assert os.path.basename(module.retired_path) == ".1.0.run1"


def test_staged_build_is_inside_the_generation(trees):
    module = _module(trees)
    generation = trees.generation("run1")

    assert module.staged_build(generation) == (
        os.path.join(generation, "software", "TinyApp", "1.0"),
        os.path.join(generation, "modules", "all", "TinyApp", "1.0.lua"),
    )


# module_file


def _module_dir(trees):
    module_dir = os.path.join(trees.modules_all, "TinyApp")
    os.makedirs(module_dir, exist_ok=True)
    return module_dir


def test_module_file_is_the_lua_file_when_nothing_exists_yet(trees):
    assert _module(trees).module_file() == os.path.join(trees.modules_all, "TinyApp", "1.0.lua")


def test_module_file_picks_the_lua_file_when_it_exists(trees):
    lua = os.path.join(_module_dir(trees), "1.0.lua")
    open(lua, "w").close()

    assert _module(trees).module_file() == lua


def test_module_file_falls_back_to_an_existing_tcl_file(trees):
    tcl = os.path.join(_module_dir(trees), "1.0")
    open(tcl, "w").close()

    assert _module(trees).module_file() == tcl


def test_module_file_prefers_lua_when_both_exist(trees):
    module_dir = _module_dir(trees)
    open(os.path.join(module_dir, "1.0"), "w").close()
    open(os.path.join(module_dir, "1.0.lua"), "w").close()

    assert _module(trees).module_file() == os.path.join(module_dir, "1.0.lua")


def test_module_file_counts_a_dangling_lua_link_as_existing(trees):
    module_dir = _module_dir(trees)
    open(os.path.join(module_dir, "1.0"), "w").close()
    os.symlink("/nonexistent", os.path.join(module_dir, "1.0.lua"))

    assert _module(trees).module_file() == os.path.join(module_dir, "1.0.lua")


# require_live_dir


def test_require_live_dir_accepts_a_real_directory_and_returns_its_stat(trees):
    live = _live(trees)

    info = paths.require_live_dir(_module(trees))

    assert stat.S_ISDIR(info.st_mode)
    assert info.st_ino == os.lstat(live).st_ino


def test_require_live_dir_trusts_a_software_root_behind_a_link(tmp_path):
    real = tmp_path / "real-software"
    (real / "TinyApp" / "1.0").mkdir(parents=True)
    (tmp_path / "software").symlink_to(real)
    trees = paths.Trees(str(tmp_path / "software"), str(tmp_path / "modules"))

    assert stat.S_ISDIR(paths.require_live_dir(_module(trees)).st_mode)


def test_require_live_dir_refuses_a_missing_install(trees):
    with pytest.raises(errors.UsageError) as raised:
        paths.require_live_dir(_module(trees))

    message = str(raised.value)
    assert message.startswith("TinyApp/1.0 is not installed")
    assert os.path.join(trees.software, "TinyApp", "1.0") in message


def test_require_live_dir_refuses_a_symlink_at_the_live_path(trees, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.makedirs(os.path.join(trees.software, "TinyApp"))
    os.symlink(target, os.path.join(trees.software, "TinyApp", "1.0"))

    with pytest.raises(errors.UsageError, match=r"TinyApp/1\.0 is a symbolic link"):
        paths.require_live_dir(_module(trees))


def test_require_live_dir_refuses_a_file_at_the_live_path(trees):
    os.makedirs(os.path.join(trees.software, "TinyApp"))
    open(os.path.join(trees.software, "TinyApp", "1.0"), "w").close()

    with pytest.raises(errors.UsageError, match=r"TinyApp/1\.0 is not a directory"):
        paths.require_live_dir(_module(trees))


def test_require_live_dir_refuses_a_symlink_component(trees, tmp_path):
    (tmp_path / "elsewhere" / "1.0").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere", os.path.join(trees.software, "TinyApp"))

    with pytest.raises(errors.UsageError) as raised:
        paths.require_live_dir(_module(trees))

    assert f"{trees.software}/TinyApp is a symbolic link" in str(raised.value)


# require_module_file_path


def test_require_module_file_path_returns_the_module_file(trees):
    assert paths.require_module_file_path(_module(trees)) == _module(trees).module_file()


def test_require_module_file_path_refuses_a_symlink_component_when_the_file_is_missing(trees, tmp_path):
    (tmp_path / "other-modules").mkdir()
    os.symlink(tmp_path / "other-modules", os.path.join(trees.modules_all, "TinyApp"))

    with pytest.raises(errors.UsageError, match=r"all/TinyApp is a symbolic link"):
        paths.require_module_file_path(_module(trees))


# prepare_state_root


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_prepare_state_root_creates_runs_and_retired_private(tmp_path):
    state_root = tmp_path / "state"

    assert paths.prepare_state_root(str(state_root)) == str(state_root)

    assert (_mode(state_root), _mode(state_root / "runs"), _mode(state_root / "retired")) == (0o700,) * 3


def test_prepare_state_root_keeps_what_is_already_there(tmp_path):
    state_root = tmp_path / "state"
    (state_root / "runs" / "run1").mkdir(parents=True)
    (state_root / "runs" / "run1" / "journal.json").write_text("{}")

    paths.prepare_state_root(str(state_root))
    paths.prepare_state_root(str(state_root))

    assert (state_root / "runs" / "run1" / "journal.json").read_text() == "{}"
    assert (state_root / "retired").is_dir()


def test_prepare_state_root_makes_a_relative_root_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert paths.prepare_state_root("state") == str(tmp_path / "state")


def test_prepare_state_root_refuses_a_symlink_component_and_creates_nothing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    with pytest.raises(errors.UsageError, match=f"{tmp_path}/link is a symbolic link"):
        paths.prepare_state_root(str(tmp_path / "link" / "state"))

    assert os.listdir(tmp_path / "real") == []


def test_prepare_state_root_refuses_a_state_root_that_is_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real")

    with pytest.raises(errors.UsageError, match="symlink components are refused"):
        paths.prepare_state_root(str(tmp_path / "state"))

    assert os.listdir(tmp_path / "real") == []


@pytest.mark.parametrize("sub", ["runs", "retired"])
def test_prepare_state_root_refuses_a_linked_subdirectory(tmp_path, sub):
    state_root = tmp_path / "state"
    state_root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (state_root / sub).symlink_to(tmp_path / "elsewhere")

    with pytest.raises(errors.UsageError, match=f"{state_root}/{sub} is a symbolic link"):
        paths.prepare_state_root(str(state_root))

    assert os.listdir(tmp_path / "elsewhere") == []


def test_prepare_state_root_refuses_a_file_in_its_place(tmp_path):
    (tmp_path / "state").write_text("not a directory\n")

    with pytest.raises(errors.UsageError, match=f"state root {tmp_path}/state"):
        paths.prepare_state_root(str(tmp_path / "state"))


@pytest.mark.parametrize(
    "below_all",
    ["zlib/1.3.lua", "Core/toy/0.0", "Compiler/GCC/6.4.0-2.28/toy/0.0.lua", "all/1.0", "Core/all/1.0"],
    ids=["flat", "core", "compiler", "a-module-named-all", "a-core-module-named-all"],
)
def test_a_module_file_s_roots_are_those_of_the_tree_it_is_in_at_any_depth(below_all):
    module_file = "/apps/modules/all/" + below_all

    assert (paths.software_root_of(module_file), paths.module_root_of(module_file)) == (
        "/apps/software",
        "/apps/modules",
    )


@pytest.mark.parametrize("module_file", ["/etc/x.lua", "/apps/modules/all/x.lua", "/apps/all/zlib/1.3.lua"])
def test_a_module_file_outside_a_module_tree_has_no_software_root(module_file):
    with pytest.raises(errors.UsageError, match="is not in a module tree"):
        paths.software_root_of(module_file)
