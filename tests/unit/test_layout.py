"""The layout explains itself: the README's layout section matches the tree, and the unit tests
stand on shared helpers, not on the integration suite."""

from __future__ import annotations

import ast
import re

import checkout

README = checkout.REPO / "README.md"


def _layout_block() -> str:
    """The fenced block under README.md's ``## Layout`` heading."""
    section = README.read_text().split("\n## Layout\n", 1)[1]
    return section.split("```\n", 2)[1]


def _named_paths(block: str) -> set[str]:
    """The paths the layout block names: the first column of each line, names separated by one
    space. A name indented under a line that names one directory is inside that directory; a
    line indented as far as the descriptions continues the description above it."""
    lines = [line for line in block.splitlines() if line.strip()]
    description_column = re.match(r"\S+(?: \S+)*  +", lines[0]).end()
    named: set[str] = set()
    parent = ""
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if indent >= description_column:
            continue
        names = re.split(r"  +", line.strip(), maxsplit=1)[0].split(" ")
        named.update((parent if indent else "") + name for name in names)
        if not indent:
            parent = names[0] if len(names) == 1 and names[0].endswith("/") else ""
    return named


def _top_level_directories() -> set[str]:
    """The top-level directories of the checkout's files (tracked, or new and not ignored)."""
    return {name.split("/", 1)[0] for name in checkout.tracked_files() if "/" in name}


def test_every_path_the_readme_layout_names_exists():
    missing = sorted(path for path in _named_paths(_layout_block()) if not (checkout.REPO / path).exists())
    assert missing == []


def test_the_readme_layout_names_every_top_level_directory():
    named = {path.split("/", 1)[0] for path in _named_paths(_layout_block())}
    assert sorted(_top_level_directories() - named) == []


def test_the_layout_reader_nests_indented_names_and_skips_continued_descriptions():
    block = (
        "a.yml b/c.yml   two files\n"
        "plugins/x/      a directory\n"
        "  y/            inside it\n"
        "                its description, continued\n"
        "z/              another\n"
    )
    assert _named_paths(block) == {"a.yml", "b/c.yml", "plugins/x/", "plugins/x/y/", "z/"}


def _imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_unit_tests_do_not_import_the_integration_suite():
    # The unit tests' helpers live in tests/support/; importing tests.integration would make a
    # unit test depend on the harness of the real components.
    offenders = sorted(
        f"{path.relative_to(checkout.REPO)}: {name}"
        for path in (checkout.REPO / "tests" / "unit").rglob("*.py")
        for name in _imported_modules(path)
        if name == "tests.integration" or name.startswith("tests.integration.")
    )
    assert offenders == []
