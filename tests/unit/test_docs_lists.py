"""The lists in docs/ that the code defines are the code's: the journal's fields, the gates,
the code map, the guard's failure tokens. Each is compared with the code here, or written from
it by tools/docgen.py, so that adding a field, a gate, a file or a token without its line in
the docs fails."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import checkout
import docgen
import gates
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import decision
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal, paths

DOCS = checkout.REPO / "docs"
JOURNAL_PAGE = DOCS / "reference" / "journal.md"
# Each table of the journal's reference: its heading, and the record whose fields it lists.
JOURNAL_TABLES = {
    "## The run (`journal.json`)": journal.Run,
    "## A module of a publish run (`modules[]`)": journal.ModuleEntry,
    "## A step (`steps[]`)": journal.Step,
    "## The batch job of a run (`job`)": journal.JobRecord,
}
GUARD_PAGE = DOCS / "reference" / "eessi-arch-guard.md"
DECIDE = checkout.REPO / "plugins" / "module_utils" / "arch_guard" / "decide.py"


def table_names(text: str, heading: str) -> list[str]:
    """The names in the first column of the first table after ``heading`` (each cell's names in
    backquotes, several separated by commas), in order."""
    section = text.split(f"\n{heading}\n", 1)[1]
    rows = re.search(r"^\|.*\|\n\|[-|: ]+\|\n((?:\|.*\|\n)+)", section, re.M)
    assert rows, f"no table under {heading!r}"
    names = []
    for row in rows.group(1).splitlines():
        names.extend(re.findall(r"`([^`]+)`", row.split("|")[1]))
    return names


def test_table_names_reads_each_name_of_the_first_column_of_the_table_under_its_heading():
    text = "# A\n\n## T\n\nprose `x`\n\n| f | w |\n|---|---|\n| `a`, `b` | `c` |\n| `d` | e |\n\n| `z` |\n"

    assert table_names(text, "## T") == ["a", "b", "d"]


@pytest.mark.parametrize("heading", sorted(JOURNAL_TABLES))
def test_each_journal_record_s_table_lists_its_fields_and_no_other(heading):
    record = JOURNAL_TABLES[heading]
    listed = table_names(JOURNAL_PAGE.read_text(), heading)

    assert len(listed) == len(set(listed)), f"a field listed twice under {heading}"
    assert set(listed) == {field.name for field in dataclasses.fields(record)}


def test_the_run_s_trees_are_the_fields_the_page_names():
    row = next(line for line in JOURNAL_PAGE.read_text().splitlines() if line.startswith("| `trees` |"))

    assert set(re.findall(r"`([^`]+)`", row.split("|")[3])) == {
        field.name for field in dataclasses.fields(paths.Trees)
    }


def test_the_gate_table_lists_every_gate_and_no_other(tmp_path):
    listed = table_names((DOCS / "development.md").read_text(), "## The gates: `tools/gates.py`")

    assert sorted(listed) == sorted(gate.name for gate in gates.gates([], tmp_path))


@pytest.mark.parametrize("folder", ["tools", "testbed"])
def test_the_table_of_tools_and_of_the_testbed_names_every_file_of_its_folder(folder):
    heading = "## Where things are: `tools/` and `testbed/`"
    text = (DOCS / "development.md").read_text().split(f"\n{heading}\n", 1)[1]
    # The tools' table is the section's first, the testbed's the one after its introduction.
    section = text if folder == "tools" else text.split(f"`{folder}/` is the site", 1)[1]
    listed = table_names("\n## table\n" + section, "## table")
    tracked = {
        Path(name).relative_to(folder).parts[0]
        for name in checkout.tracked_files()
        if name.startswith(f"{folder}/")
    }

    assert sorted(name.rstrip("/") for name in listed) == sorted(tracked)


def test_the_module_table_names_every_staged_rebuild_module_and_ansible_doc_shows_their_options():
    text = (DOCS / "ansible.md").read_text()
    listed = table_names(text, "## Modules")
    modules = sorted(
        f"hpcstack.ops.{path.stem}" for path in (checkout.REPO / "plugins" / "modules").glob("staged_*.py")
    )

    assert sorted(listed) == modules
    # The options are not listed by hand: ansible-doc shows them, from each module's
    # DOCUMENTATION, which the sanity gate's validate-modules compares with its argument spec.
    assert "`ansible-doc hpcstack.ops.<module>` shows every option." in text


def test_the_guard_s_token_table_lists_every_failure_token_in_order():
    tokens = table_names(GUARD_PAGE.read_text(), "### Failure tokens")

    assert tokens == list(decision.FAILURE_TOKENS)


def test_every_failure_the_guard_decides_carries_a_listed_token_or_the_target_s_label():
    """Each call of ``_failed`` or ``interrupted`` in decide.py names its token by one of
    decision.py's constants, and that constant is a listed token (a literal would escape the
    table's test); or it is the third form of the marker (the Markers table): a module that
    failed to load on the selected target, whose label takes the token's place."""
    calls = [
        node
        for node in ast.walk(ast.parse(DECIDE.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("_failed", "interrupted")
    ]
    labels, used = 0, set()
    for call in calls:
        token = call.args[1]
        if ast.unparse(token) == "now.label(was)":
            labels += 1
        elif not (isinstance(token, ast.Name) and token.id == "token"):  # interrupted passes its own on
            assert isinstance(token, ast.Name), ast.unparse(call)
            used.add(getattr(decision, token.id))
    assert labels == 1
    # Every token is decided somewhere, and nothing else is.
    assert used == set(decision.FAILURE_TOKENS)


def test_the_generated_sections_are_what_the_code_makes_now():
    assert docgen.stale() == [], "run .venv/bin/python tools/docgen.py --write"


def test_the_code_map_names_every_module_of_the_core_once():
    text = (DOCS / "development.md").read_text()
    block = text.split("<!-- generated by tools/docgen.py: code-map -->", 1)[1].split(
        "<!-- end of code-map", 1
    )[0]
    named = [line.split()[0] for line in block.splitlines() if line.strip() and not line.startswith("```")]
    core = docgen.CORE
    modules = sorted(
        str(path.relative_to(core)) for path in core.glob("*/*.py") if path.name != "__init__.py"
    )

    assert named == modules


def test_a_stale_section_is_named_and_written_anew(monkeypatch, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- generated by tools/docgen.py: demo -->\nold\n<!-- end of demo -->\noutro\n")
    monkeypatch.setattr(docgen, "REPO", tmp_path)
    monkeypatch.setattr(docgen, "SECTIONS", {"demo": ("page.md", lambda: "new")})

    assert docgen.stale() == ["page.md: demo"]
    assert docgen.write() == ["page.md: demo"]
    assert (
        page.read_text()
        == "intro\n<!-- generated by tools/docgen.py: demo -->\nnew\n<!-- end of demo -->\noutro\n"
    )
    assert docgen.stale() == []


def test_a_page_without_the_section_s_markers_is_refused():
    with pytest.raises(ValueError, match="no section code-map"):
        docgen.render("code-map", "a page with no markers\n")


def test_first_sentence_ends_at_the_first_full_stop_that_ends_a_sentence():
    assert docgen.first_sentence("One thing. Another.") == "One thing."
    assert docgen.first_sentence("Reads ``a.b``\n  and more.\n\nDetail.") == "Reads ``a.b`` and more."
    assert docgen.first_sentence("no stop") == "no stop"


def test_ansible_s_markup_becomes_markdown_and_a_role_s_table_has_a_row_per_variable():
    assert (
        docgen._markdown("C(venv/) under O(prefix), V(auto) I(or) C(x)")
        == "`venv/` under `prefix`, `auto` *or* `x`"
    )
    for role in ("build_host", "arch_guard"):
        spec = (checkout.REPO / "roles" / role / "meta" / "argument_specs.yml").read_text()
        rows = docgen.role_variables(role).splitlines()[2:]
        assert [row.split("`")[1] for row in rows] == re.findall(r"^      ([a-z_]+):$", spec, re.M)
        assert all(row.count(" | ") == 3 for row in rows), "a description holding a column separator"


def test_the_reference_pages_are_linked_from_the_guides():
    assert "(reference/roles.md)" in (DOCS / "ansible.md").read_text()


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_slug_is_github_s_anchor_of_a_heading():
    assert (
        slug("Rolling it out to a fleet: the arch_guard role")
        == "rolling-it-out-to-a-fleet-the-arch_guard-role"
    )
    assert slug("The run (`journal.json`)") == "the-run-journaljson"


def test_every_relative_link_of_the_docs_reaches_a_file_and_its_heading():
    pages = [checkout.REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            name, _, anchor = target.partition("#")
            linked = (page.parent / name).resolve() if name else page
            if not linked.is_file():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                if anchor not in {slug(heading) for heading in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")

    assert broken == []


def test_the_journal_page_is_linked_from_the_command_s_page():
    assert "(reference/journal.md)" in (DOCS / "staged-rebuild.md").read_text()
    assert JOURNAL_PAGE.is_file()
