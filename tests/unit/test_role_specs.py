"""Each role's ``meta/argument_specs.yml`` describes ``defaults/main.yml`` key for key.

Ansible validates a role's variables against the spec before the role runs, and
``ansible-doc -t role`` shows the spec: a variable missing from it is unchecked and
undocumented, a spec entry missing from the defaults documents a default that is not there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_NAMES = sorted(path.name for path in ROLES.iterdir() if (path / "tasks" / "main.yml").is_file())
TYPES = {"str": str, "path": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}


def _load(role, relative):
    with open(ROLES / role / relative, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def _spec(role):
    return _load(role, "meta/argument_specs.yml")["argument_specs"]["main"]["options"]


def test_the_collection_has_roles():
    assert "build_host" in ROLE_NAMES


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_the_spec_and_the_defaults_name_the_same_variables(role):
    assert sorted(_spec(role)) == sorted(_load(role, "defaults/main.yml"))


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_each_default_is_the_spec_s_default_and_of_its_type(role):
    defaults = _load(role, "defaults/main.yml")
    for name, option in _spec(role).items():
        assert option.get("default") == defaults[name], name
        assert isinstance(defaults[name], TYPES[option["type"]]), name
        if "choices" in option:
            assert defaults[name] in option["choices"], name


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_variable_carries_the_role_s_prefix_and_a_description(role):
    for name, option in _spec(role).items():
        assert name.startswith(f"{role}_"), name
        assert option.get("description"), name
