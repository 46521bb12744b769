"""The tree_digest lookup: which files of a tree it lists, in what order, and when its digest
changes.

A role copies the collection's code to a host only when the digest differs from the one
recorded there, so the digest must change with every file's name and bytes, and with
nothing an interpreter or a build leaves in a source tree.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import yaml
from ansible import constants
from ansible.errors import AnsibleLookupError

from ansible_collections.hpcstack.ops.plugins.lookup import tree_digest


def _write(path, text="x\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _source_tree(root):
    """Two packages, with what Python and setuptools leave beside the sources."""
    for name in (
        "pkg/__init__.py",
        "pkg/b.py",
        "pkg/A.py",
        "pkg/sub/z.py",
        "pkg/sub/__init__.py",
        "pkg/a_sub/y.py",
        "other/mod.py",
        "README",
    ):
        _write(root / name, f"{name}\n")
    _write(root / "pkg" / "__pycache__" / "b.cpython-311.pyc", "bytecode")
    _write(root / "pkg" / "sub" / "__pycache__" / "z.cpython-311.pyc", "bytecode")
    _write(root / "pkg" / "stale.pyc", "bytecode")
    _write(root / "pkg" / "hpcstack_ops.egg-info" / "PKG-INFO", "Name: hpcstack-ops\n")
    return root


def _digest(root, *terms):
    return tree_digest.digest_files(str(root), tree_digest.list_tree(str(root), terms))


def test_files_are_listed_sorted_directory_by_directory_and_term_by_term(tmp_path):
    _source_tree(tmp_path)

    listed = tree_digest.list_tree(str(tmp_path), ["pkg", "other", "README"])

    assert listed == [
        "pkg/A.py",
        "pkg/__init__.py",
        "pkg/b.py",
        "pkg/a_sub/y.py",
        "pkg/sub/__init__.py",
        "pkg/sub/z.py",
        "other/mod.py",
        "README",
    ]


def test_the_terms_keep_the_order_they_are_given_in(tmp_path):
    _source_tree(tmp_path)

    assert tree_digest.list_tree(str(tmp_path), ["other", "pkg/sub"]) == [
        "other/mod.py",
        "pkg/sub/__init__.py",
        "pkg/sub/z.py",
    ]


def test_bytecode_and_build_metadata_are_left_out(tmp_path):
    _source_tree(tmp_path)
    sources = tree_digest.list_tree(str(tmp_path), ["pkg"])
    _write(tmp_path / "pkg" / "sub" / "__pycache__" / "notes.txt")
    _write(tmp_path / "pkg" / "setup.egg-info")
    _write(tmp_path / "pkg" / "a_sub" / "y.pyc", "bytecode")

    listed = tree_digest.list_tree(str(tmp_path), ["pkg"])

    assert listed == sources
    assert not [name for name in listed if "__pycache__" in name or name.endswith((".pyc", ".egg-info"))]
    assert not [name for name in listed if ".egg-info/" in name]


def test_a_file_term_is_listed_as_given_normalized(tmp_path):
    _source_tree(tmp_path)

    assert tree_digest.list_tree(str(tmp_path), ["./pkg/../README", "pkg/b.py"]) == ["README", "pkg/b.py"]


def test_only_regular_files_and_links_to_them_are_listed(tmp_path):
    _source_tree(tmp_path)
    (tmp_path / "pkg" / "link.py").symlink_to("b.py")
    (tmp_path / "pkg" / "dangling.py").symlink_to("no-such-file.py")
    os.mkfifo(tmp_path / "pkg" / "pipe")

    listed = tree_digest.list_tree(str(tmp_path), ["pkg"])

    assert "pkg/link.py" in listed
    assert "pkg/dangling.py" not in listed
    assert "pkg/pipe" not in listed


def test_the_digest_is_of_each_path_and_content_in_listing_order(tmp_path):
    _source_tree(tmp_path)
    files = tree_digest.list_tree(str(tmp_path), ["pkg"])
    expected = hashlib.sha256(b"".join(f"{name}\0{name}\n\0".encode() for name in files)).hexdigest()

    assert tree_digest.digest_files(str(tmp_path), files) == expected


def test_the_digest_does_not_depend_on_where_the_tree_is_or_on_metadata(tmp_path):
    first = _source_tree(tmp_path / "first")
    second = _source_tree(tmp_path / "second")
    (second / "pkg" / "b.py").chmod(0o600)
    os.utime(second / "pkg" / "A.py", (0, 0))

    assert _digest(first, "pkg", "other") == _digest(second, "pkg", "other")


def test_the_digest_does_not_change_with_what_an_interpreter_or_a_build_leaves(tmp_path):
    _source_tree(tmp_path)
    before = _digest(tmp_path, "pkg")
    _write(tmp_path / "pkg" / "a_sub" / "__pycache__" / "y.cpython-312.pyc", "bytecode")
    _write(tmp_path / "pkg" / "b.pyc", "bytecode")
    _write(tmp_path / "pkg" / "pkg.egg-info" / "SOURCES.txt")

    assert _digest(tmp_path, "pkg") == before


def test_the_digest_changes_with_a_file_s_content(tmp_path):
    _source_tree(tmp_path)
    before = _digest(tmp_path, "pkg")
    (tmp_path / "pkg" / "sub" / "z.py").write_text("pkg/sub/z.py\n# a later release\n")

    assert _digest(tmp_path, "pkg") != before


def test_the_digest_changes_with_a_file_s_name(tmp_path):
    _source_tree(tmp_path)
    before = _digest(tmp_path, "pkg")
    (tmp_path / "pkg" / "b.py").rename(tmp_path / "pkg" / "c.py")

    assert _digest(tmp_path, "pkg") != before


def test_the_digest_changes_when_a_file_is_added_or_removed(tmp_path):
    _source_tree(tmp_path)
    before = _digest(tmp_path, "pkg")
    _write(tmp_path / "pkg" / "new.py", "")
    added = _digest(tmp_path, "pkg")
    (tmp_path / "pkg" / "new.py").unlink()
    (tmp_path / "pkg" / "A.py").unlink()

    assert len({before, added, _digest(tmp_path, "pkg")}) == 3


def test_bytes_do_not_move_between_neighbouring_files_unnoticed(tmp_path):
    _write(tmp_path / "one" / "a", "ab")
    _write(tmp_path / "one" / "b", "c")
    _write(tmp_path / "two" / "a", "a")
    _write(tmp_path / "two" / "b", "bc")

    assert _digest(tmp_path / "one", ".") != _digest(tmp_path / "two", ".")


@pytest.mark.parametrize("term", ["no-such-dir", "pkg/no-such-file.py"])
def test_a_term_that_is_not_there_is_a_lookup_error(tmp_path, term):
    _source_tree(tmp_path)

    with pytest.raises(
        AnsibleLookupError, match=f"tree_digest: {tmp_path}/{term} is neither a file nor a directory"
    ):
        tree_digest.list_tree(str(tmp_path), ["pkg", term])


@pytest.fixture
def lookup():
    """The plugin as Ansible's loader gives it: its options declared from its DOCUMENTATION."""
    plugin = tree_digest.LookupModule()
    plugin._load_name = tree_digest.__name__
    options = yaml.safe_load(tree_digest.DOCUMENTATION)["options"]
    constants.config.initialize_plugin_configuration_definitions("lookup", plugin._load_name, options)
    return plugin


def test_the_lookup_returns_one_dictionary_of_the_digest_and_the_files(lookup, tmp_path):
    _source_tree(tmp_path)

    result = lookup.run(["pkg/sub", "other"], variables={}, root=str(tmp_path))

    assert result == [
        {
            "digest": _digest(tmp_path, "pkg/sub", "other"),
            "files": ["pkg/sub/__init__.py", "pkg/sub/z.py", "other/mod.py"],
        }
    ]


def test_the_lookup_refuses_a_missing_term(lookup, tmp_path):
    with pytest.raises(AnsibleLookupError, match="is neither a file nor a directory"):
        lookup.run(["missing"], variables={}, root=str(tmp_path))
