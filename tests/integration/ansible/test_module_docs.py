"""Every module's documentation, as ``ansible-doc`` renders it from the installed collection.

The modules are the files in ``plugins/modules/``, so a module added there is covered without
touching this test. What each page must show is read from the module's own source
(``DOCUMENTATION``, ``EXAMPLES`` and ``RETURN`` parsed as YAML, the way ansible-doc reads
them): its options, its examples verbatim and its return values. ``ansible-doc`` runs from
this project's virtual environment with the checkout linked in as ``hpcstack.ops``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import checkout

COLLECTION = "hpcstack.ops"
MODULES_DIR = checkout.REPO / "plugins" / "modules"
MODULES = sorted(path.stem for path in MODULES_DIR.glob("*.py") if path.name != "__init__.py")
DOC_TIMEOUT = 120


def _doc_strings(name):
    """DOCUMENTATION, EXAMPLES and RETURN of module ``name`` as its source assigns them."""
    tree = ast.parse((MODULES_DIR / f"{name}.py").read_text(encoding="utf-8"))
    names = ("DOCUMENTATION", "EXAMPLES", "RETURN")
    return {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in names
    }


@pytest.fixture(scope="module")
def ansible_doc(tmp_path_factory):
    """Run ``ansible-doc ARGS`` against this checkout as ``hpcstack.ops``; never raises on exit."""
    root = tmp_path_factory.mktemp("ansible-doc")
    collections = checkout.link_collection(root / "collections")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_HOME=str(root / "home"),
        ANSIBLE_LOCAL_TEMP=str(root / "home" / "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )

    def run(*args):
        return subprocess.run(
            [str(Path(sys.executable).parent / "ansible-doc"), *args],
            cwd=root,  # no ansible.cfg of the caller's directory applies
            env=env,
            capture_output=True,
            text=True,
            timeout=DOC_TIMEOUT,
            check=False,
        )

    return run


def test_the_modules_directory_holds_the_modules_this_test_covers():
    # Guards the discovery itself: an empty list would make every check below vacuous.
    assert "staged_rollback" in MODULES
    assert all(_doc_strings(name).keys() == {"DOCUMENTATION", "EXAMPLES", "RETURN"} for name in MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders_the_documentation_examples_and_return_values(ansible_doc, name):
    strings = _doc_strings(name)
    documentation = yaml.safe_load(strings["DOCUMENTATION"])
    returns = yaml.safe_load(strings["RETURN"])

    done = ansible_doc("-t", "module", f"{COLLECTION}.{name}")

    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr
    page = done.stdout
    assert page.startswith(f"> MODULE {COLLECTION}.{name} ")
    described = page[: page.index("\nEXAMPLES:\n")]
    examples = page[page.index("\nEXAMPLES:\n") : page.index("\nRETURN VALUES:\n")]
    return_values = page[page.index("\nRETURN VALUES:\n") :]
    # DOCUMENTATION: every option of the module ("= name" when required), and the author.
    for option in documentation.get("options") or {}:
        assert re.search(rf"^[-=] {re.escape(option)}\b", described, re.M), f"option {option} not rendered"
    authors = documentation["author"]
    assert f"AUTHOR: {authors if isinstance(authors, str) else authors[0]}" in described
    # EXAMPLES: printed as written.
    assert strings["EXAMPLES"].strip() in examples
    # RETURN: every return value.
    for key in returns or {}:
        assert re.search(rf"^- {re.escape(key)}\b", return_values, re.M), f"return value {key} not rendered"


def test_ansible_doc_json_gives_each_module_its_own_documentation(ansible_doc):
    done = ansible_doc("-t", "module", "--json", *(f"{COLLECTION}.{name}" for name in MODULES))

    assert done.returncode == 0, done.stderr
    pages = json.loads(done.stdout)
    assert sorted(pages) == [f"{COLLECTION}.{name}" for name in MODULES]
    for name in MODULES:
        page = pages[f"{COLLECTION}.{name}"]
        documentation = yaml.safe_load(_doc_strings(name)["DOCUMENTATION"])
        assert page["doc"]["module"] == name
        assert page["doc"]["short_description"] == documentation["short_description"]
        if f"{COLLECTION}.staged_rebuild" in documentation.get("extends_documentation_fragment", []):
            # The shared options come in from the doc fragment.
            assert {"state_root", "lock_timeout"} <= page["doc"]["options"].keys()
        assert page["examples"].strip() == _doc_strings(name)["EXAMPLES"].strip()
        assert page["return"].keys() == (yaml.safe_load(_doc_strings(name)["RETURN"]) or {}).keys()


def test_ansible_doc_lists_every_module_of_the_collection(ansible_doc):
    done = ansible_doc("-t", "module", "-l", COLLECTION)

    assert done.returncode == 0, done.stderr
    listed = sorted(line.split()[0] for line in done.stdout.splitlines() if line.strip())
    assert listed == [f"{COLLECTION}.{name}" for name in MODULES]


ROLES_DIR = checkout.REPO / "roles"
ROLES = sorted(path.parent.parent.name for path in ROLES_DIR.glob("*/meta/argument_specs.yml"))


@pytest.mark.parametrize("name", ROLES)
def test_ansible_doc_renders_each_role_s_variables(ansible_doc, name):
    spec_file = ROLES_DIR / name / "meta" / "argument_specs.yml"
    spec = yaml.safe_load(spec_file.read_text(encoding="utf-8"))["argument_specs"]["main"]

    done = ansible_doc("-t", "role", "--json", f"{COLLECTION}.{name}")

    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)[f"{COLLECTION}.{name}"]["entry_points"]["main"]
    assert entry["short_description"] == spec["short_description"]
    assert entry["options"].keys() == spec["options"].keys()


def test_the_roles_directory_holds_the_roles_this_test_covers():
    assert "build_host" in ROLES
