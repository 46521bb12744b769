"""The EasyBuild command of a staged build: redirecting options out, ``--rebuild`` in.

The option names are EasyBuild 5.4's (``eb --help``): ``--installpath``,
``--installpath-data``, ``--installpath-modules``, ``--installpath-software``,
``--subdir-*``, ``--bwrap``, ``--bwrap-installpath``, ``--bwrap-options`` and
``--remove-ghost-install-dirs``. EasyBuild reads each option also from ``EASYBUILD_<NAME>``
in its environment, and its option parser (optparse) takes boolean options with an
``--enable-`` prefix and any unambiguous abbreviation of a long option.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import easybuild

LIVE = "/apps"
# Options that take a value (EasyBuild's ``store`` options among the redirecting ones).
VALUED = (
    "--installpath",
    "--installpath-data",
    "--installpath-modules",
    "--installpath-software",
    "--subdir-software",
    "--subdir-modules",
    "--subdir-data",
    "--subdir-user-modules",
    "--suffix-modules-path",
    "--bwrap-installpath",
    "--bwrap-options",
)
# Redirecting options without a value (``store_true``).
FLAGS = ("--bwrap", "--remove-ghost-install-dirs")
REDIRECTING = VALUED + FLAGS


def _is_redirecting(arg):
    name = arg.split("=", 1)[0]
    return name in REDIRECTING


def _in_order(part, whole):
    """True when ``part`` is ``whole`` with some items left out (order kept)."""
    rest = iter(whole)
    return all(any(item == other for other in rest) for item in part)


# filter_args


@pytest.mark.parametrize("option", VALUED)
def test_filter_args_removes_a_valued_option_in_the_equals_form(option):
    kept, removed = easybuild.filter_args(["--robot", f"{option}={LIVE}", "TinyApp-1.0.eb"])

    assert kept == ["--robot", "TinyApp-1.0.eb"]
    assert removed == [f"{option}={LIVE}"]


@pytest.mark.parametrize("option", VALUED)
def test_filter_args_removes_a_valued_option_with_its_separate_value(option):
    kept, removed = easybuild.filter_args(["--robot", option, LIVE, "TinyApp-1.0.eb"])

    assert kept == ["--robot", "TinyApp-1.0.eb"]
    assert removed == [option, LIVE]


@pytest.mark.parametrize("flag", FLAGS)
def test_filter_args_removes_a_flag_and_keeps_the_easyconfig_right_after_it(flag):
    kept, removed = easybuild.filter_args([flag, "TinyApp-1.0.eb", "--robot"])

    assert kept == ["TinyApp-1.0.eb", "--robot"]
    assert removed == [flag]


def test_filter_args_removes_a_valued_option_given_last_without_its_value():
    kept, removed = easybuild.filter_args(["TinyApp-1.0.eb", "--installpath"])

    assert kept == ["TinyApp-1.0.eb"]
    assert removed == ["--installpath"]


def test_filter_args_keeps_everything_else_in_order():
    args = [
        "GROMACS-2024.1-foss-2023b.eb",
        "--robot",
        "--robot-paths=/site/easyconfigs",
        "--parallel",
        "8",
        "-r",
        "--trace",
        "--hooks",
        "/site/hooks.py",
        "--read-only-installdir",
        "--disable-bwrap",
        "--sourcepath=/site/sources",
        "Python-3.11.5-GCCcore-13.2.0.eb",
    ]

    assert easybuild.filter_args(args) == (args, [])


def test_filter_args_keeps_easyconfigs_between_removed_options():
    args = ["--installpath", "/apps", "A-1.eb", "--bwrap", "B-2.eb", "--subdir-software=sw", "C-3.eb"]

    kept, removed = easybuild.filter_args(args)

    assert kept == ["A-1.eb", "B-2.eb", "C-3.eb"]
    assert removed == ["--installpath", "/apps", "--bwrap", "--subdir-software=sw"]


@pytest.mark.parametrize(
    "args", [["--prefix", "/site/eb", "A-1.eb"], ["--prefix=/site/eb", "A-1.eb"], ["--prefi=/x"]]
)
def test_filter_args_keeps_the_prefix_which_places_sources_and_build_paths(args):
    # The install paths the prefix would also decide are given explicitly after it.
    assert easybuild.filter_args(args) == (args, [])


def test_filter_args_of_nothing_is_nothing():
    assert easybuild.filter_args([]) == ([], [])


def test_filter_args_leaves_its_input_alone():
    args = ["--prefix", "/apps", "A-1.eb"]

    easybuild.filter_args(args)

    assert args == ["--prefix", "/apps", "A-1.eb"]


@pytest.mark.parametrize(
    "alias",
    [
        "--enable-bwrap",
        "--enable-remove-ghost-install-dirs",
        "--remove-ghost",
        f"--installpath-s={LIVE}",
    ],
)
def test_filter_args_removes_the_spellings_easybuild_accepts_for_a_redirecting_option(alias):
    # EasyBuild 5.4.1 reads each of these as the redirecting option itself (checked with
    # ``eb <alias> --show-config``): --enable-<flag> sets a boolean, and optparse expands an
    # unambiguous abbreviation (--installpath-s is only --installpath-software, --remove-ghost only
    # --remove-ghost-install-dirs).
    kept, removed = easybuild.filter_args([alias, "TinyApp-1.0.eb"])

    assert kept == ["TinyApp-1.0.eb"]
    assert removed == [alias]


# the property: no redirecting option survives, every other argument does

_values = st.sampled_from([LIVE, "/apps/software", "relative/dir", "x", ""])
_easyconfigs = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_]{0,8}-[0-9][0-9.]{0,5}\.eb\Z")
_safe_options = st.sampled_from(
    ["--robot", "-r", "--trace", "--debug", "-D", "--robot-paths=/site", "--parallel=4", "--disable-bwrap"]
)
# One unit of the command line: (arguments, whether filter_args must keep them).
_redirecting_units = st.one_of(
    st.builds(lambda opt, value: ([f"{opt}={value}"], False), st.sampled_from(VALUED), _values),
    st.builds(lambda opt, value: ([opt, value], False), st.sampled_from(VALUED), _values),
    st.builds(lambda flag: ([flag], False), st.sampled_from(FLAGS)),
)
_kept_units = st.one_of(
    st.builds(lambda arg: ([arg], True), _easyconfigs),
    st.builds(lambda arg: ([arg], True), _safe_options),
)


@given(st.lists(st.one_of(_redirecting_units, _kept_units), max_size=12))
def test_no_redirecting_option_survives_and_every_other_argument_does(units):
    args = [arg for unit, _keep in units for arg in unit]

    kept, removed = easybuild.filter_args(args)

    assert not [arg for arg in kept if _is_redirecting(arg)]
    assert kept == [arg for unit, keep in units if keep for arg in unit]
    assert removed == [arg for unit, keep in units if not keep for arg in unit]


@given(st.lists(st.text(alphabet="-=/abcdefghilnoprstuwx.", max_size=24), max_size=10))
def test_arbitrary_arguments_are_either_kept_or_removed_never_lost_or_reordered(args):
    kept, removed = easybuild.filter_args(args)

    assert not [arg for arg in kept if _is_redirecting(arg)]
    assert sorted(kept + removed) == sorted(args)
    assert _in_order(kept, args)
    assert _in_order(removed, args)


# with_rebuild


def test_with_rebuild_adds_rebuild_at_the_end():
    assert easybuild.with_rebuild(["TinyApp-1.0.eb", "--robot"]) == ["TinyApp-1.0.eb", "--robot", "--rebuild"]


@pytest.mark.parametrize("forcing", ["--rebuild", "--force", "-f"])
def test_with_rebuild_adds_nothing_when_the_user_forces_already(forcing):
    args = ["TinyApp-1.0.eb", forcing, "--robot"]

    assert easybuild.with_rebuild(args) == args


def test_with_rebuild_returns_a_new_list():
    args = ["TinyApp-1.0.eb"]

    result = easybuild.with_rebuild(args)
    result.append("--robot")

    assert args == ["TinyApp-1.0.eb"]


@pytest.mark.parametrize("lookalike", ["--rebuild-only", "--forced-thing", "-fr", "TinyApp-f.eb"])
def test_with_rebuild_is_not_fooled_by_lookalikes(lookalike):
    assert easybuild.with_rebuild([lookalike])[-1] == "--rebuild"


# filter_env


@pytest.mark.parametrize(
    "variable",
    [
        "EASYBUILD_INSTALLPATH",
        "EASYBUILD_INSTALLPATH_SOFTWARE",
        "EASYBUILD_INSTALLPATH_MODULES",
        "EASYBUILD_INSTALLPATH_DATA",
        "EASYBUILD_SUBDIR_SOFTWARE",
        "EASYBUILD_SUBDIR_MODULES",
        "EASYBUILD_SUBDIR_USER_MODULES",
        "EASYBUILD_BWRAP",
        "EASYBUILD_BWRAP_INSTALLPATH",
        "EASYBUILD_BWRAP_OPTIONS",
        "EASYBUILD_REMOVE_GHOST_INSTALL_DIRS",
    ],
)
def test_filter_env_drops_the_variables_of_redirecting_options(variable):
    env = {variable: LIVE, "PATH": "/usr/bin"}

    assert easybuild.filter_env(env) == {"PATH": "/usr/bin"}


@pytest.mark.parametrize(
    "variable",
    [
        "EASYBUILD_PREFIX",
        "EASYBUILD_ROBOT_PATHS",
        "EASYBUILD_SOURCEPATH",
        "EASYBUILD_BUILDPATH",
        "EASYBUILD_MODULES_TOOL",
        "EASYBUILD_HOOKS",
        "EASYBUILD_READ_ONLY_INSTALLDIR",
        "EASYBUILD_PREFER_PYTHON_SEARCH_PATH",
    ],
)
def test_filter_env_keeps_the_other_easybuild_variables(variable):
    env = {variable: "/site/value"}

    assert easybuild.filter_env(env) == env


def test_filter_env_keeps_variables_that_only_look_alike():
    env = {"PREFIX": "/x", "INSTALLPATH": "/y", "MY_EASYBUILD_PREFIX": "/z", "easybuild_prefix": "/w"}

    assert easybuild.filter_env(env) == env


def test_filter_env_returns_a_copy():
    env = {"EASYBUILD_PREFIX": LIVE}

    easybuild.filter_env(env)

    assert env == {"EASYBUILD_PREFIX": LIVE}


# command

STAGE = ["--installpath-software=/s", "--installpath-modules=/m"]


def test_command_is_eb_the_kept_arguments_rebuild_and_the_placement():
    command = easybuild.command(
        "/usr/bin/eb",
        ["--installpath=/apps", "GROMACS-2024.1-foss-2023b.eb", "--robot"],
        [
            "--installpath-software=/apps/software/.eb-staged-rebuild/run1/software",
            "--installpath-modules=/apps/software/.eb-staged-rebuild/run1/modules",
        ],
    )

    assert command == [
        "/usr/bin/eb",
        "GROMACS-2024.1-foss-2023b.eb",
        "--robot",
        "--rebuild",
        "--installpath-software=/apps/software/.eb-staged-rebuild/run1/software",
        "--installpath-modules=/apps/software/.eb-staged-rebuild/run1/modules",
    ]


def test_command_keeps_the_users_force_instead_of_adding_rebuild():
    command = easybuild.command("eb", ["-f", "A-1.eb"], STAGE)

    assert command == ["eb", "-f", "A-1.eb", "--installpath-software=/s", "--installpath-modules=/m"]


def test_command_puts_the_placement_last_so_it_wins():
    # optparse keeps the last value of an option given twice.
    command = easybuild.command("eb", ["--installpath-software", "/apps/software"], STAGE)

    assert command[-2:] == ["--installpath-software=/s", "--installpath-modules=/m"]
    assert "/apps/software" not in command


# in_dependency_order: the run's easyconfigs, dependencies first, in the places they held


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["/ecs/t/toy-app/toy-app-0.0.eb", "/ecs/l/libtoy/libtoy-0.0.eb"],
            ["/ecs/l/libtoy/libtoy-0.0.eb", "/ecs/t/toy-app/toy-app-0.0.eb"],
        ),
        (
            ["--robot", "toy-app-0.0.eb", "--trace", "libtoy-0.0.eb"],
            ["--robot", "libtoy-0.0.eb", "--trace", "toy-app-0.0.eb"],
        ),
        (["libtoy-0.0.eb", "toy-app-0.0.eb"], ["libtoy-0.0.eb", "toy-app-0.0.eb"]),
        (["other-1.0.eb", "toy-app-0.0.eb"], ["other-1.0.eb", "toy-app-0.0.eb"]),
    ],
)
def test_in_dependency_order_puts_dependencies_first_and_leaves_the_rest(args, expected):
    assert easybuild.in_dependency_order(args, ["libtoy/0.0", "toy-app/0.0"]) == expected


def test_the_command_passes_the_run_s_easyconfigs_in_dependency_order():
    command = easybuild.command(
        "eb", ["toy-app-0.0.eb", "libtoy-0.0.eb"], ["--x"], ["libtoy/0.0", "toy-app/0.0"]
    )

    assert command == ["eb", "libtoy-0.0.eb", "toy-app-0.0.eb", "--rebuild", "--x"]


@pytest.fixture
def config_env(tmp_path):
    """An environment whose home and system configuration directories are empty."""
    (tmp_path / "home").mkdir()
    (tmp_path / "xdg").mkdir()
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_DIRS": str(tmp_path / "xdg")}


def test_no_configuration_file_anywhere_is_none(config_env):
    assert easybuild.configuration_files(["--robot"], config_env) == []


def test_the_user_s_and_the_system_s_configuration_files_are_found_where_easybuild_looks(
    config_env, tmp_path
):
    user = tmp_path / "home" / ".config" / "easybuild" / "config.cfg"
    user.parent.mkdir(parents=True)
    user.write_text("[override]\n")
    system = tmp_path / "xdg" / "easybuild.d"
    system.mkdir()
    (system / "b.cfg").write_text("")
    (system / "a.cfg").write_text("")
    (system / "not-a-config").write_text("")

    assert easybuild.configuration_files([], config_env) == [
        str(user),
        str(system / "a.cfg"),
        str(system / "b.cfg"),
    ]

    elsewhere = tmp_path / "config-home"
    assert easybuild.configuration_files([], dict(config_env, XDG_CONFIG_HOME=str(elsewhere))) == [
        str(system / "a.cfg"),
        str(system / "b.cfg"),
    ]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--configfiles=/site/eb.cfg"], {}),
        (["--configfiles", "/site/eb.cfg"], {}),
        ([], {"EASYBUILD_CONFIGFILES": "/site/eb.cfg"}),
    ],
)
def test_configuration_files_the_run_names_count_even_where_none_is_found(config_env, args, env):
    assert easybuild.configuration_files(args, dict(config_env, **env)) != []
