"""pyproject.toml lists every package of plugins/module_utils under the name hpcstack_ops."""

from __future__ import annotations

import sys

import pytest

import checkout

if sys.version_info >= (3, 11):
    import tomllib


@pytest.fixture(scope="module")
def setuptools_config():
    with open(checkout.REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["tool"]["setuptools"]


def test_module_utils_is_the_package_hpcstack_ops(setuptools_config):
    assert setuptools_config["package-dir"] == {"hpcstack_ops": "plugins/module_utils"}


def test_every_directory_with_python_code_is_a_listed_package(setuptools_config):
    core = checkout.REPO / "plugins" / "module_utils"
    on_disk = {
        ".".join(("hpcstack_ops", *init.parent.relative_to(core).parts)) for init in core.rglob("__init__.py")
    }
    without_init = {
        str(py.parent.relative_to(core))
        for py in core.rglob("*.py")
        if not (py.parent / "__init__.py").exists()
    }
    assert without_init == set(), "directories with code but no __init__.py"
    assert set(setuptools_config["packages"]) == on_disk
