"""The dependants of an install (``dependants``): discovery from the installs' easyconfig
copies and the live module files, the graph, the plan (members in build order, why each is
in, ``--exclude``), the refusals of what cannot be rebuilt, and the copies a run takes.

Each tree is written under ``tmp_path`` as EasyBuild leaves one (``tests/support/chains``):
no EasyBuild runs, discovery only reads files.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    dependants,
    easyconfig,
    paths,
    records,
    settings,
)
from tests.support.chains import flat_chain, install


def _trees(root):
    return paths.Trees.from_installpath(str(root))


def _plan(root, target="libtoy/0.0", install_subdir=None, exclude=(), given="/given/libtoy-0.0.eb"):
    return dependants.plan(
        dependants.scan(_trees(root)), target, install_subdir or target, given, list(exclude)
    )


def _refusal(root, **kwargs):
    with pytest.raises(errors.UsageError) as raised:
        _plan(root, **kwargs)
    message = raised.value.render(settings.flag)
    assert "\n" not in message
    return message


def _members(plan):
    return [(member.module, member.reason, member.kind) for member in plan.members]


# The plan of a flat tree


def test_every_dependant_direct_or_not_runtime_or_build_in_build_order_and_nothing_else(tmp_path):
    flat_chain(tmp_path)

    plan = _plan(tmp_path)

    assert plan.target == "libtoy/0.0"
    assert _members(plan) == [
        ("libtoy/0.0", ["libtoy/0.0"], "runtime"),
        ("toyapp/0.0", ["toyapp/0.0", "libtoy/0.0"], "runtime"),
        # Free to go once toyapp is in: the smaller name first.
        ("toptool/2.0", ["toptool/2.0", "toyapp/0.0", "libtoy/0.0"], "runtime"),
        ("toybuild/3.0", ["toybuild/3.0", "libtoy/0.0"], "build"),
        ("toylib/1.0", ["toylib/1.0", "libtoy/0.0"], "runtime"),
    ]
    assert plan.excluded == []
    assert plan.warnings == []


def test_the_named_module_is_rebuilt_from_the_easyconfig_given_each_dependant_from_its_own_copy(tmp_path):
    flat_chain(tmp_path)

    plan = _plan(tmp_path)

    assert plan.members[0].easyconfig == "/given/libtoy-0.0.eb"
    assert plan.members[1].easyconfig == str(tmp_path / "software/toyapp/0.0/easybuild/toyapp-0.0.eb")
    assert [member.install_subdir for member in plan.members] == [
        "libtoy/0.0",
        "toyapp/0.0",
        "toptool/2.0",
        "toybuild/3.0",
        "toylib/1.0",
    ]


def test_a_dependant_comes_after_every_member_it_depends_on_whatever_the_names(tmp_path):
    install(tmp_path, "zlib", "1.3")
    # "aaa" sorts first but needs "mmm", which needs zlib.
    install(tmp_path, "aaa", "1", dependencies=[("mmm", "1"), ("zlib", "1.3")])
    install(tmp_path, "mmm", "1", dependencies=[("zlib", "1.3")])

    plan = _plan(tmp_path, "zlib/1.3")

    assert [member.module for member in plan.members] == ["zlib/1.3", "mmm/1", "aaa/1"]
    # The shortest path is its reason: aaa depends on zlib directly.
    assert plan.members[2].reason == ["aaa/1", "zlib/1.3"]


def test_a_module_without_dependants_is_a_plan_of_itself(tmp_path):
    flat_chain(tmp_path)

    plan = _plan(tmp_path, "other/1.0")

    assert _members(plan) == [("other/1.0", ["other/1.0"], "runtime")]


def test_a_runtime_path_is_the_reason_of_a_member_that_has_one_besides_a_build_path(tmp_path):
    install(tmp_path, "lib", "1")
    install(tmp_path, "mid", "1", dependencies=[("lib", "1")])
    install(tmp_path, "app", "1", dependencies=[("mid", "1")], builddependencies=[("lib", "1")])

    plan = _plan(tmp_path, "lib/1")

    assert _members(plan)[-1] == ("app/1", ["app/1", "mid/1", "lib/1"], "runtime")


# The sources: module files (Lua and Tcl), toolchains, subtoolchains


def test_a_lua_module_file_s_load_is_an_edge_when_the_easyconfig_copy_names_none(tmp_path):
    install(tmp_path, "lib", "1")
    install(tmp_path, "app", "1", loads=["lib/1"])

    assert [member.module for member in _plan(tmp_path, "lib/1").members] == ["lib/1", "app/1"]


def test_a_tcl_module_file_s_module_load_is_an_edge(tmp_path):
    install(tmp_path, "lib", "1", tcl=True)
    install(tmp_path, "app", "1", loads=["lib/1"], tcl=True)

    assert [member.module for member in _plan(tmp_path, "lib/1").members] == ["lib/1", "app/1"]


def test_help_text_that_says_module_load_is_no_edge(tmp_path):
    install(tmp_path, "lib", "1")
    # install() writes "module load nothing" into every Lua file's help; this one names lib.
    app = install(tmp_path, "app", "1")
    module_file = tmp_path / "modules/all/app/1.lua"
    module_file.write_text(f'help([[depends_on("lib/1") and module load lib/1]])\nlocal root = "{app}"\n')

    assert [member.module for member in _plan(tmp_path, "lib/1").members] == ["lib/1"]


def test_the_toolchain_is_a_dependency_and_an_inherited_toolchain_finds_the_subtoolchain_s_install(tmp_path):
    install(tmp_path, "GCCcore", "13.2.0")
    install(tmp_path, "GCC", "13.2.0", dependencies=[("GCCcore", "13.2.0")])
    install(
        tmp_path,
        "zlib",
        "1.3",
        toolchain="('GCCcore', '13.2.0')",
        install_dir="1.3-GCCcore-13.2.0",
    )
    # Built with GCC, it names zlib without a toolchain: EasyBuild takes GCCcore's.
    install(
        tmp_path,
        "app",
        "2",
        toolchain="('GCC', '13.2.0')",
        install_dir="2-GCC-13.2.0",
        dependencies=[("zlib", "1.3")],
    )

    by_zlib = _plan(tmp_path, "zlib/1.3-GCCcore-13.2.0")
    by_gcccore = _plan(tmp_path, "GCCcore/13.2.0")

    assert [(m.module, m.reason) for m in by_zlib.members] == [
        ("zlib/1.3-GCCcore-13.2.0", ["zlib/1.3-GCCcore-13.2.0"]),
        ("app/2-GCC-13.2.0", ["app/2-GCC-13.2.0", "zlib/1.3-GCCcore-13.2.0"]),
    ]
    assert [member.module for member in by_gcccore.members] == [
        "GCCcore/13.2.0",
        "GCC/13.2.0",
        "zlib/1.3-GCCcore-13.2.0",
        "app/2-GCC-13.2.0",
    ]


def test_a_dependency_under_two_subtoolchains_is_the_one_the_module_file_loads(tmp_path):
    for toolchain in ("GCCcore-12.3.0", "GCCcore-13.2.0"):
        install(
            tmp_path,
            "zlib",
            "1.3",
            install_dir=f"1.3-{toolchain}",
            toolchain=f"('GCCcore', '{toolchain[8:]}')",
        )
    install(tmp_path, "GCC", "13.2.0")
    install(
        tmp_path,
        "app",
        "2",
        toolchain="('GCC', '13.2.0')",
        install_dir="2-GCC-13.2.0",
        dependencies=[("zlib", "1.3")],
        loads=["zlib/1.3-GCCcore-13.2.0"],
    )

    new = _plan(tmp_path, "zlib/1.3-GCCcore-13.2.0")
    old = _plan(tmp_path, "zlib/1.3-GCCcore-12.3.0")

    assert [member.module for member in new.members] == ["zlib/1.3-GCCcore-13.2.0", "app/2-GCC-13.2.0"]
    assert [member.module for member in old.members] == ["zlib/1.3-GCCcore-12.3.0"]


def test_an_explicit_dependency_toolchain_names_exactly_one_install(tmp_path):
    install(tmp_path, "Java", "17")
    install(tmp_path, "Java", "17", install_dir="17-GCC-13.2.0", toolchain="('GCC', '13.2.0')")
    install(tmp_path, "GCC", "13.2.0")
    install(
        tmp_path,
        "app",
        "1",
        toolchain="('GCC', '13.2.0')",
        install_dir="1-GCC-13.2.0",
        dependencies=[("Java", "17", "", ("system", "system"))],
    )

    assert [member.module for member in _plan(tmp_path, "Java/17").members] == ["Java/17", "app/1-GCC-13.2.0"]
    assert [member.module for member in _plan(tmp_path, "Java/17-GCC-13.2.0").members] == [
        "Java/17-GCC-13.2.0"
    ]


def test_a_hierarchical_tree_maps_flat_named_installs_to_their_modules_at_each_level(tmp_path):
    # The compiler is a module file alone, as in EasyBuild's own hierarchical test material.
    gcc = tmp_path / "modules/all/Core/GCC/6.4.0-2.28"
    gcc.parent.mkdir(parents=True)
    gcc.write_text("#%Module\nmodule use /elsewhere\n")
    toolchain = "('GCC', '6.4.0-2.28')"
    install(
        tmp_path,
        "libtoy",
        "0.0",
        toolchain=toolchain,
        install_dir="0.0-GCC-6.4.0-2.28",
        module="Compiler/GCC/6.4.0-2.28/libtoy/0.0",
        tcl=True,
    )
    install(
        tmp_path,
        "toy",
        "0.0",
        toolchain=toolchain,
        install_dir="0.0-GCC-6.4.0-2.28",
        module="Compiler/GCC/6.4.0-2.28/toy/0.0",
        tcl=True,
        dependencies=[("libtoy", "0.0")],
        loads=["libtoy/0.0"],
    )
    install(tmp_path, "toy", "0.0", module="Core/toy/0.0", tcl=True)  # the Core toy: unrelated

    plan = _plan(tmp_path, "Compiler/GCC/6.4.0-2.28/libtoy/0.0", "libtoy/0.0-GCC-6.4.0-2.28")

    assert [(m.module, m.install_subdir) for m in plan.members] == [
        ("Compiler/GCC/6.4.0-2.28/libtoy/0.0", "libtoy/0.0-GCC-6.4.0-2.28"),
        ("Compiler/GCC/6.4.0-2.28/toy/0.0", "toy/0.0-GCC-6.4.0-2.28"),
    ]
    assert plan.members[1].reason == ["Compiler/GCC/6.4.0-2.28/toy/0.0", "Compiler/GCC/6.4.0-2.28/libtoy/0.0"]


def test_a_hierarchical_load_means_the_module_on_the_levels_the_loader_sees(tmp_path):
    # libtoy/0.0 at two compilers' levels: the toy of GCC 13 loads GCC 13's.
    for version in ("12", "13"):
        install(
            tmp_path,
            "libtoy",
            "0.0",
            install_dir=f"0.0-GCC-{version}",
            toolchain=f"('GCC', '{version}')",
            module=f"Compiler/GCC/{version}/libtoy/0.0",
        )
        (tmp_path / f"modules/all/Core/GCC/{version}.lua").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"modules/all/Core/GCC/{version}.lua").write_text("-- a compiler module alone\n")
    install(
        tmp_path,
        "toy",
        "0.0",
        install_dir="0.0-GCC-13",
        toolchain="('GCC', '13')",
        module="Compiler/GCC/13/toy/0.0",
        loads=["libtoy/0.0"],
    )

    by_13 = _plan(tmp_path, "Compiler/GCC/13/libtoy/0.0", "libtoy/0.0-GCC-13")
    by_12 = _plan(tmp_path, "Compiler/GCC/12/libtoy/0.0", "libtoy/0.0-GCC-12")

    assert [member.module for member in by_13.members] == [
        "Compiler/GCC/13/libtoy/0.0",
        "Compiler/GCC/13/toy/0.0",
    ]
    assert [member.module for member in by_12.members] == ["Compiler/GCC/12/libtoy/0.0"]


# --exclude


def test_exclude_leaves_a_member_out_with_those_that_reach_the_target_only_through_it(tmp_path):
    flat_chain(tmp_path)

    plan = _plan(tmp_path, exclude=["toyapp/0.0"])

    assert [member.module for member in plan.members] == ["libtoy/0.0", "toybuild/3.0", "toylib/1.0"]
    assert plan.excluded == ["toyapp/0.0", "toptool/2.0"]
    assert plan.warnings == [
        "toyapp/0.0 is left out (--exclude): it keeps linking the old libtoy/0.0",
        "toptool/2.0 is left out: it depends on libtoy/0.0 only through toyapp/0.0, "
        "and keeps linking the old libtoy/0.0",
    ]


def test_exclude_keeps_a_member_that_reaches_the_target_another_way(tmp_path):
    flat_chain(tmp_path)
    # toptool also links libtoy itself.
    (tmp_path / "modules/all/toptool/2.0.lua").write_text(
        f'local root = "{tmp_path}/software/toptool/2.0"\n'
        'depends_on("toyapp/0.0")\ndepends_on("libtoy/0.0")\n'
    )

    plan = _plan(tmp_path, exclude=["toyapp/0.0"])

    assert "toptool/2.0" in [member.module for member in plan.members]
    assert plan.excluded == ["toyapp/0.0"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("other/1.0", "--exclude other/1.0 is not a dependant of libtoy/0.0"),
        ("nothing/9", "--exclude nothing/9 is not a dependant of libtoy/0.0"),
        ("libtoy/0.0", "--exclude libtoy/0.0 is the module named by --module"),
    ],
)
def test_exclude_of_what_is_no_dependant_is_refused(tmp_path, value, said):
    flat_chain(tmp_path)

    assert said in _refusal(tmp_path, exclude=[value])


# Refusals: members that cannot be rebuilt


def test_a_member_whose_easyconfig_copy_is_missing_is_refused_naming_it_and_what_to_do(tmp_path):
    flat_chain(tmp_path)
    copy = tmp_path / "software/toptool/2.0/easybuild/toptool-2.0.eb"
    copy.unlink()

    said = _refusal(tmp_path)

    assert said == (
        f"dependant toptool/2.0 of libtoy/0.0 cannot be rebuilt: its easyconfig copy {copy} is missing; "
        "repair it, or leave it out with --exclude toptool/2.0"
    )


def test_an_unrelated_install_without_a_copy_refuses_nothing(tmp_path):
    flat_chain(tmp_path)
    (tmp_path / "software/other/1.0/easybuild/other-1.0.eb").unlink()

    assert len(_plan(tmp_path).members) == 5


def test_a_fifo_planted_as_the_copy_is_refused_without_blocking(tmp_path):
    flat_chain(tmp_path)
    copy = tmp_path / "software/toyapp/0.0/easybuild/toyapp-0.0.eb"
    copy.unlink()
    os.mkfifo(copy)

    assert f"easyconfig copy {copy} is not a regular file" in _refusal(tmp_path)


def test_a_symlink_planted_as_the_copy_is_not_followed(tmp_path):
    flat_chain(tmp_path)
    copy = tmp_path / "software/toyapp/0.0/easybuild/toyapp-0.0.eb"
    elsewhere = tmp_path / "elsewhere.eb"
    elsewhere.write_text(copy.read_text())
    copy.unlink()
    copy.symlink_to(elsewhere)

    assert f"{copy} is a symbolic link; refusing to follow it" in _refusal(tmp_path)


def test_a_huge_copy_is_refused_unread(tmp_path):
    flat_chain(tmp_path)
    copy = tmp_path / "software/toyapp/0.0/easybuild/toyapp-0.0.eb"
    with copy.open("ab") as handle:
        handle.truncate(easyconfig.MAX_BYTES + 1)

    assert f"easyconfig copy {copy} is larger than {easyconfig.MAX_BYTES} bytes" in _refusal(tmp_path)


def test_a_copy_that_does_not_parse_is_refused_as_unreadable_without_running_it(tmp_path):
    flat_chain(tmp_path)
    copy = tmp_path / "software/toyapp/0.0/easybuild/toyapp-0.0.eb"
    copy.write_text("name = 'toyapp'\nversion = '0.0'\ntoolchain = SYSTEM\ndependencies = [(\n")

    said = _refusal(tmp_path)

    assert said.startswith("dependant toyapp/0.0 of libtoy/0.0 cannot be rebuilt: its easyconfig copy ")
    assert "cannot be read without running it: it is not Python (line 4)" in said


def test_a_member_s_dependency_that_matches_no_install_and_no_module_is_refused(tmp_path):
    flat_chain(tmp_path)
    install(tmp_path, "late", "1", dependencies=[("libtoy", "0.0"), ("gone", "2")])

    said = _refusal(tmp_path)

    assert said == (
        "dependant late/1 of libtoy/0.0 cannot be rebuilt: its dependency gone 2 matches no install "
        f"under {tmp_path}/software and no module under {tmp_path}/modules/all; "
        "repair it, or leave it out with --exclude late/1"
    )


def test_a_member_s_dependency_that_matches_two_installs_is_refused_as_ambiguous(tmp_path):
    flat_chain(tmp_path)
    install(tmp_path, "GCC", "13.2.0")
    for toolchain in ("12.3.0", "13.2.0"):
        install(
            tmp_path,
            "zlib",
            "1.3",
            install_dir=f"1.3-GCCcore-{toolchain}",
            toolchain=f"('GCCcore', '{toolchain}')",
        )
    install(
        tmp_path,
        "late",
        "1",
        toolchain="('GCC', '13.2.0')",
        install_dir="1-GCC-13.2.0",
        dependencies=[("libtoy", "0.0", "", ("system", "system")), ("zlib", "1.3")],
    )

    said = _refusal(tmp_path)

    assert said.startswith(
        "dependant late/1-GCC-13.2.0 of libtoy/0.0 cannot be rebuilt: its dependency zlib 1.3 "
    )
    assert "is ambiguous: the live tree has zlib/1.3-GCCcore-12.3.0, zlib/1.3-GCCcore-13.2.0" in said


def test_an_unresolvable_dependency_of_an_unrelated_install_refuses_nothing(tmp_path):
    flat_chain(tmp_path)
    install(tmp_path, "lonely", "1", dependencies=[("gone", "2")])

    assert "lonely/1" not in [member.module for member in _plan(tmp_path).members]


def test_a_dependency_cycle_among_members_is_refused(tmp_path):
    install(tmp_path, "lib", "1")
    install(tmp_path, "ping", "1", dependencies=[("lib", "1"), ("pong", "1")])
    install(tmp_path, "pong", "1", dependencies=[("ping", "1")])

    said = _refusal(tmp_path, target="lib/1")

    assert said == (
        "the dependants of lib/1 ping/1, pong/1 depend on each other (a cycle), so no order builds each "
        "against the new builds of the others; leave one out with --exclude"
    )


def test_a_cycle_through_the_named_module_orders_it_first(tmp_path):
    # The named module's own dependencies do not order it: it is built first.
    install(tmp_path, "lib", "1", dependencies=[("app", "1")])
    install(tmp_path, "app", "1", dependencies=[("lib", "1")])

    assert [member.module for member in _plan(tmp_path, "lib/1").members] == ["lib/1", "app/1"]


# The plan in the journal, and the copies the build reads


def test_the_plan_is_a_record_the_journal_stores_and_loads_back(tmp_path):
    flat_chain(tmp_path)
    plan = _plan(tmp_path, exclude=["toylib/1.0"])

    assert records.load(dependants.Plan, records.dump(plan)) == plan


def test_a_run_takes_each_dependant_s_copy_once_into_its_directory(tmp_path):
    flat_chain(tmp_path / "apps")
    plan = _plan(tmp_path / "apps")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    taken = dependants.take_copies(plan, str(run_dir), str(tmp_path / "apps/software"))
    (tmp_path / "apps/software/toyapp/0.0/easybuild/toyapp-0.0.eb").write_text("changed after the copy\n")
    again = dependants.take_copies(plan, str(run_dir), str(tmp_path / "apps/software"))

    assert (
        taken
        == again
        == [
            str(run_dir / "easyconfigs" / f)
            for f in ("toyapp-0.0.eb", "toptool-2.0.eb", "toybuild-3.0.eb", "toylib-1.0.eb")
        ]
    )
    assert (run_dir / "easyconfigs/toyapp-0.0.eb").read_text().startswith("name = 'toyapp'")
    assert oct((run_dir / "easyconfigs/toyapp-0.0.eb").stat().st_mode & 0o777) == "0o600"


def test_a_copy_replaced_by_a_symlink_before_the_run_takes_it_is_refused(tmp_path):
    flat_chain(tmp_path / "apps")
    plan = _plan(tmp_path / "apps")
    copy = tmp_path / "apps/software/toylib/1.0/easybuild/toylib-1.0.eb"
    copy.unlink()
    copy.symlink_to("/etc/shadow")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    with pytest.raises(errors.UsageError, match="is a symbolic link; refusing to follow it"):
        dependants.take_copies(plan, str(run_dir), str(tmp_path / "apps/software"))
    assert not (run_dir / "easyconfigs/toylib-1.0.eb").exists()
