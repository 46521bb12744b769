"""The tree_archive lookup: one tar archive of the files tree_digest lists, renamed, with the
directories above them, whose bytes depend on nothing but the files' names and bytes.

A role unpacks it on every host in one transfer, so what it holds must be what the role
used to copy file by file: the same files, root's, 0644 (directories 0755).
"""

from __future__ import annotations

import base64
import io
import os
import tarfile

import pytest
import yaml
from ansible import constants
from ansible.errors import AnsibleLookupError

from ansible_collections.hpcstack.ops.plugins.lookup import tree_archive, tree_digest


def _write(path, text="x\n", mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _tree(root):
    for name in (
        "plugins/module_utils/__init__.py",
        "plugins/module_utils/pkg/a.py",
        "plugins/module_utils/pkg/sub/b.py",
    ):
        _write(root / name, f"{name}\n")
    _write(root / "plugins" / "module_utils" / "pkg" / "__pycache__" / "a.cpython-311.pyc", "bytecode")
    return root


TERMS = ["plugins/module_utils/pkg", "plugins/module_utils/__init__.py"]
RENAME = {"plugins/module_utils": "hpcstack_ops"}


def _members(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return [
            (member.name, member.type, member.mode, member.uid, member.gid, member.uname, member.mtime)
            for member in archive.getmembers()
        ]


def test_the_archive_holds_the_listed_files_renamed_below_their_directories(tmp_path):
    _tree(tmp_path)
    files = tree_digest.list_tree(str(tmp_path), TERMS)

    members = _members(tree_archive.archive_bytes(str(tmp_path), files, RENAME))

    directory, regular = tarfile.DIRTYPE, tarfile.REGTYPE
    assert members == [
        ("hpcstack_ops", directory, 0o755, 0, 0, "root", 0),
        ("hpcstack_ops/pkg", directory, 0o755, 0, 0, "root", 0),
        ("hpcstack_ops/pkg/sub", directory, 0o755, 0, 0, "root", 0),
        ("hpcstack_ops/pkg/a.py", regular, 0o644, 0, 0, "root", 0),
        ("hpcstack_ops/pkg/sub/b.py", regular, 0o644, 0, 0, "root", 0),
        ("hpcstack_ops/__init__.py", regular, 0o644, 0, 0, "root", 0),
    ]
    with tarfile.open(
        fileobj=io.BytesIO(tree_archive.archive_bytes(str(tmp_path), files, RENAME))
    ) as archive:
        assert (
            archive.extractfile("hpcstack_ops/pkg/sub/b.py").read() == b"plugins/module_utils/pkg/sub/b.py\n"
        )


def test_the_bytes_do_not_depend_on_where_the_tree_is_or_on_metadata(tmp_path):
    first, second = _tree(tmp_path / "first"), _tree(tmp_path / "second")
    (second / "plugins" / "module_utils" / "pkg" / "a.py").chmod(0o700)
    os.utime(second / "plugins" / "module_utils" / "pkg" / "sub" / "b.py", (12345, 12345))

    def data(root):
        return tree_archive.archive_bytes(str(root), tree_digest.list_tree(str(root), TERMS), RENAME)

    assert data(first) == data(second)


def test_the_longest_prefix_of_whole_parts_is_renamed():
    rename = {"plugins": "p", "plugins/module_utils": "hpcstack_ops"}

    assert tree_archive.archive_name("plugins/module_utils/x.py", rename) == "hpcstack_ops/x.py"
    assert tree_archive.archive_name("plugins/lookup/y.py", rename) == "p/lookup/y.py"
    assert tree_archive.archive_name("pluginsextra/z.py", rename) == "pluginsextra/z.py"


@pytest.mark.parametrize("new", ["/abs", "../up"])
def test_a_name_outside_the_destination_is_refused(tmp_path, new):
    _tree(tmp_path)
    files = tree_digest.list_tree(str(tmp_path), TERMS)

    with pytest.raises(AnsibleLookupError, match="would be unpacked outside the destination"):
        tree_archive.archive_bytes(str(tmp_path), files, {"plugins/module_utils": new})


@pytest.fixture
def lookup():
    """The plugin as Ansible's loader gives it: its options declared from its DOCUMENTATION."""
    plugin = tree_archive.LookupModule()
    plugin._load_name = tree_archive.__name__
    options = yaml.safe_load(tree_archive.DOCUMENTATION)["options"]
    constants.config.initialize_plugin_configuration_definitions("lookup", plugin._load_name, options)
    return plugin


def test_the_lookup_writes_the_archive_under_its_digest_and_returns_its_path(lookup, tmp_path):
    root = _tree(tmp_path / "tree")
    dest = tmp_path / "out"

    first = lookup.run(TERMS, variables={}, root=str(root), rename=RENAME, dest=str(dest))
    again = lookup.run(TERMS, variables={}, root=str(root), rename=RENAME, dest=str(dest))

    digest = tree_digest.digest_files(str(root), tree_digest.list_tree(str(root), TERMS))
    assert first == again == [str(dest / f"{digest}.tar")]
    assert sorted(path.name for path in dest.iterdir()) == [f"{digest}.tar"]
    files = tree_digest.list_tree(str(root), TERMS)
    assert (dest / f"{digest}.tar").read_bytes() == tree_archive.archive_bytes(str(root), files, RENAME)


def test_a_destination_that_cannot_be_written_is_a_lookup_error(lookup, tmp_path):
    root = _tree(tmp_path / "tree")
    blocker = _write(tmp_path / "a-file")

    with pytest.raises(AnsibleLookupError, match=f"tree_archive: cannot write the archive in {blocker}"):
        lookup.run(TERMS, variables={}, root=str(root), dest=str(blocker))


def test_with_base64_the_lookup_returns_the_archive_itself_and_writes_nothing(lookup, tmp_path):
    root = _tree(tmp_path / "tree")
    dest = tmp_path / "out"

    [encoded] = lookup.run(TERMS, variables={}, root=str(root), rename=RENAME, dest=str(dest), base64=True)

    files = tree_digest.list_tree(str(root), TERMS)
    assert base64.b64decode(encoded, validate=True) == tree_archive.archive_bytes(str(root), files, RENAME)
    assert not dest.exists()
