"""The settings of every command: each resolver takes the value given, else the host's
variable, else the default, checks it once, and names the setting in its refusal; the
rebuild request's options become the command line's flags and the module's argument spec.

A refusal is shown as the command line spells it (``err.render(settings.flag)``); how
a module spells it is in test_module_support.
"""

from __future__ import annotations

import argparse
import math
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.errors import setting
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import settings
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.request import RebuildRequest


def _refusal(resolve):
    with pytest.raises(errors.UsageError) as raised:
        resolve()
    message = raised.value.render(settings.flag)
    assert "\n" not in message
    return message


# state_root


def test_the_state_root_option_beats_the_variable(tmp_path):
    environ = {settings.STATE_ROOT_VARIABLE: "/var/lib/other"}

    assert settings.state_root({"state_root": str(tmp_path)}, environ) == str(tmp_path)


def test_the_state_root_comes_from_the_variable_without_the_option(tmp_path):
    environ = {settings.STATE_ROOT_VARIABLE: str(tmp_path)}

    assert settings.state_root({"state_root": None}, environ) == str(tmp_path)


def test_a_relative_state_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert settings.state_root({"state_root": "state"}, {}) == os.path.join(str(tmp_path), "state")


@pytest.mark.parametrize("environ", [{}, {settings.STATE_ROOT_VARIABLE: ""}], ids=["unset", "empty"])
def test_no_state_root_anywhere_is_refused(environ):
    assert _refusal(lambda: settings.state_root({}, environ)) == (
        "no state root: give --state-root DIR or set EB_STAGED_REBUILD_STATE_ROOT"
    )


# lock_timeout


@pytest.mark.parametrize(("given", "seconds"), [(None, 0.0), (0, 0.0), (2.5, 2.5), ("3", 3.0)])
def test_the_lock_timeout_is_the_seconds_given_else_zero(given, seconds):
    assert settings.lock_timeout({"lock_timeout": given}) == seconds


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (-1.0, "--lock-timeout must be 0 or more seconds, not -1.0"),
        (math.nan, "--lock-timeout must be 0 or more seconds, not nan"),
        ("soon", "--lock-timeout 'soon' is not a number"),
    ],
)
def test_a_lock_timeout_that_is_negative_or_not_a_number_is_refused(given, message):
    assert _refusal(lambda: settings.lock_timeout({"lock_timeout": given})) == message


# grace_hours


def test_the_default_grace_period_is_144_hours():
    assert settings.grace_hours({}, {}) == settings.DEFAULT_GRACE_HOURS == 144.0


def test_the_grace_period_comes_from_the_variable_without_the_option():
    assert settings.grace_hours({"grace_hours": None}, {settings.GRACE_HOURS_VARIABLE: "48"}) == 48.0


@pytest.mark.parametrize("hours", [0, 2.5])
def test_the_grace_hours_option_beats_the_variable_even_when_it_is_zero(hours):
    assert settings.grace_hours({"grace_hours": hours}, {settings.GRACE_HOURS_VARIABLE: "48"}) == hours


@pytest.mark.parametrize(
    ("values", "environ", "message"),
    [
        ({"grace_hours": math.nan}, {}, "--grace-hours must be a finite number of hours, not nan"),
        ({"grace_hours": math.inf}, {}, "--grace-hours must be a finite number of hours, not inf"),
        (
            {},
            {settings.GRACE_HOURS_VARIABLE: "inf"},
            "--grace-hours must be a finite number of hours, not inf",
        ),
        ({"grace_hours": -1}, {}, "--grace-hours must not be negative"),
        ({}, {settings.GRACE_HOURS_VARIABLE: "-0.5"}, "--grace-hours must not be negative"),
        (
            {},
            {settings.GRACE_HOURS_VARIABLE: "a week"},
            "EB_STAGED_REBUILD_GRACE_HOURS='a week' is not a number",
        ),
        ({"grace_hours": "a week"}, {}, "--grace-hours 'a week' is not a number"),
    ],
)
def test_a_grace_period_that_is_not_a_finite_number_of_hours_is_refused(values, environ, message):
    assert _refusal(lambda: settings.grace_hours(values, environ)) == message


# eb


def _executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_eb_option_beats_the_variable(tmp_path):
    eb = _executable(tmp_path / "eb")

    assert settings.eb({"eb": str(eb)}, {settings.EB_VARIABLE: "/opt/other/eb"}) == str(eb)


def test_eb_comes_from_the_variable_without_the_option():
    assert settings.eb({}, {settings.EB_VARIABLE: "/opt/easybuild/bin/eb"}) == "/opt/easybuild/bin/eb"


def test_eb_is_else_found_on_path(tmp_path, monkeypatch):
    eb = _executable(tmp_path / "eb")
    monkeypatch.setenv("PATH", str(tmp_path))

    assert settings.eb({}, {}) == str(eb)


def test_eb_that_is_not_on_path_stays_as_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    assert settings.eb({}, {}) == "eb"


def test_eb_given_as_a_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert settings.eb({"eb": "bin/eb"}, {}) == os.path.join(str(tmp_path), "bin", "eb")


# how each front end spells a setting


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("grace_hours", "--grace-hours"),
        ("state_root", "--state-root"),
        ("ledger_config", "--ledger-config"),
        ("modules", "--module"),
        ("eb_args", "EasyBuild's arguments after --"),
    ],
)
def test_the_command_line_spells_a_setting_as_its_flag(name, flag):
    assert settings.flag(name) == flag
    assert errors.UsageError(f"see {setting(name)}").render(settings.flag) == f"see {flag}"


# the rebuild request's options


def test_the_request_s_options_are_its_fields_declared_with_option():
    assert list(settings.options(RebuildRequest)) == [
        "run_id",
        "backend",
        "skip_live_check",
        "allow_unrelocated",
        "prepare",
        "ledger_config",
        "with_dependants",
        "exclude",
    ]


def test_the_module_s_argument_spec_has_each_option_a_module_offers():
    assert settings.argument_spec(RebuildRequest) == {
        "run_id": {"type": "str"},
        "backend": {"type": "str", "choices": ["auto", "bwrap", "userns", "installpath"]},
        "skip_live_check": {"type": "bool", "default": False},
        "allow_unrelocated": {"type": "bool", "default": False},
        "ledger_config": {"type": "path"},
        "with_dependants": {"type": "bool", "default": False},
        "exclude": {"type": "list", "elements": "str", "default": []},
    }


def test_the_command_line_has_a_flag_for_each_option_none_where_not_given():
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, RebuildRequest)

    given = vars(
        parser.parse_args(
            [
                "--skip-live-check",
                "--backend",
                "userns",
                "--prepare",
                "make check",
                "--exclude",
                "a/1",
                "--exclude",
                "b/2",
            ]
        )
    )
    absent = vars(parser.parse_args([]))

    assert given == {
        "run_id": None,
        "backend": "userns",
        "skip_live_check": True,
        "allow_unrelocated": None,
        "prepare": "make check",
        "ledger_config": None,
        "with_dependants": None,
        "exclude": ["a/1", "b/2"],
    }
    assert set(absent.values()) == {None}


def test_an_option_not_given_takes_its_variable_then_its_default():
    backend = settings.options(RebuildRequest)["backend"][0]

    assert settings.from_option_or_environment("backend", {}, {}, backend) == "auto"
    assert settings.from_option_or_environment(
        "backend", {}, {"EB_STAGED_REBUILD_BACKEND": "userns"}, backend
    ) == ("userns")
    assert settings.from_option_or_environment(
        "backend", {"backend": "bwrap"}, {"EB_STAGED_REBUILD_BACKEND": "userns"}, backend
    ) == ("bwrap")
