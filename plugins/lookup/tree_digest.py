# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of part of a tree on the controller, and one digest of their names and bytes."""

from __future__ import annotations

DOCUMENTATION = r"""
name: tree_digest
author: hpcstack.ops maintainers (@hpcstack)
version_added: 0.1.0
short_description: List files under a directory on the controller and digest them
description:
  - Lists the regular files of each term (a file or a directory, relative to O(root)), in
    sorted order, leaving out what an interpreter or a build leaves in a source tree
    (C(__pycache__), C(*.egg-info), C(*.pyc)).
  - Returns one SHA-256 of every listed file's relative path and content, so that a role can
    copy a tree to a host only when the digest recorded there differs, in one round trip.
  - The roles of this collection use it to install the collection's own code.
options:
  _terms:
    description: Paths relative to O(root), of files or directories.
    type: list
    elements: str
    required: true
  root:
    description: The directory the terms and the listed names are relative to.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: The guard's code and its digest
  ansible.builtin.set_fact:
    code: "{{ lookup('hpcstack.ops.tree_digest', 'plugins/module_utils/common', root=collection_root) }}"
"""

RETURN = r"""
_raw:
  description: One dictionary.
  type: list
  elements: dict
  contains:
    digest:
      description: SHA-256 (hex) of each file's relative path, a NUL, its content and a NUL, in listing order.
      type: str
    files:
      description: The files' paths relative to O(root), sorted within each term.
      type: list
      elements: str
"""

import hashlib
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

_LEFT_OUT_DIRS = ("__pycache__",)
_LEFT_OUT_SUFFIXES = (".egg-info", ".pyc")


def _kept(name):
    return name not in _LEFT_OUT_DIRS and not name.endswith(_LEFT_OUT_SUFFIXES)


def list_tree(root, terms):
    """The files of ``terms`` under ``root``, relative to it, in a stable order."""
    files = []
    for term in terms:
        top = os.path.join(root, term)
        if os.path.isfile(top):
            files.append(os.path.normpath(term))
            continue
        if not os.path.isdir(top):
            raise AnsibleLookupError(f"tree_digest: {top} is neither a file nor a directory")
        for folder, folders, names in os.walk(top):
            folders[:] = sorted(name for name in folders if _kept(name))
            files.extend(
                os.path.relpath(os.path.join(folder, name), root)
                for name in sorted(names)
                if _kept(name) and os.path.isfile(os.path.join(folder, name))
            )
    return files


def digest_files(root, files):
    digest = hashlib.sha256()
    for path in files:
        with open(os.path.join(root, path), "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read() + b"\0")
    return digest.hexdigest()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        root = self.get_option("root")
        files = list_tree(root, terms)
        return [{"digest": digest_files(root, files), "files": files}]
