"""Tiny directory trees for swap tests: a directory with a PAYLOAD naming its generation."""

from __future__ import annotations

import os


def make_tree(path, payload):
    path.mkdir()
    (path / "PAYLOAD").write_text(payload)
    return path


def tree_state(path):
    """(inode, PAYLOAD) of the tree at ``path``, or None when the name is missing."""
    if not os.path.lexists(path):
        return None
    return (path.stat().st_ino, (path / "PAYLOAD").read_text())
