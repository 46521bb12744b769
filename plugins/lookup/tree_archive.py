# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of part of a tree on the controller, in one tar archive for one transfer."""

from __future__ import annotations

DOCUMENTATION = r"""
name: tree_archive
author: hpcstack.ops maintainers (@hpcstack)
version_added: 0.1.0
short_description: Pack files under a directory on the controller into one tar archive
description:
  - Lists the files of each term as P(hpcstack.ops.tree_digest#lookup) does (the same files, in the
    same order, without what an interpreter or a build leaves in a source tree) and writes
    them, with the directories above them, into one uncompressed tar archive on the
    controller; returns the archive's path, for M(ansible.builtin.unarchive), or with
    O(base64) the archive itself, for a module that unpacks it (M(hpcstack.ops.arch_guard_install)).
  - One archive is one transfer and one module run per host, where a loop of
    M(ansible.builtin.copy) costs three round trips per file.
  - The archive's bytes depend only on the files' names and bytes (owner C(root), mode 0644
    for files and 0755 for directories, modification time 0), and its name is their digest, so
    hosts templating the same lookup in parallel write the same file.
  - It is written in Ansible's temporary directory of this run on the controller (removed
    when the run ends) unless O(dest) names another directory.
  - The roles of this collection use it to install the collection's own code.
options:
  _terms:
    description: Paths relative to O(root), of files or directories.
    type: list
    elements: str
    required: true
  root:
    description: The directory the terms are relative to.
    type: path
    required: true
  rename:
    description:
      - Leading path prefixes to replace in the archive, each old prefix mapped to its new
        one; of those that match whole leading parts of a path, the longest wins.
    type: dict
    default: {}
  dest:
    description: The directory on the controller to write the archive in; created if missing.
    type: path
  base64:
    description:
      - Return the archive's bytes in base64 rather than a path; nothing is written. The archive
        then travels in a module's arguments, in the same round trip as the module.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Unpack the guard's code on a host
  ansible.builtin.unarchive:
    src: >-
      {{ lookup('hpcstack.ops.tree_archive', 'plugins/module_utils/common',
                root=collection_root, rename={'plugins/module_utils': 'hpcstack_ops'}) }}
    dest: /opt/guard/lib/build
"""

RETURN = r"""
_raw:
  description:
    - The archive's absolute path on the controller, C(<dest>/<digest>.tar); with O(base64), the
      archive in base64.
  type: list
  elements: str
"""

import base64
import io
import os
import tarfile
import tempfile

from ansible import constants
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.hpcstack.ops.plugins.lookup.tree_digest import digest_files, list_tree


def archive_name(name, rename):
    """``name`` with the longest leading prefix of ``rename`` that matches whole parts replaced."""
    for old in sorted(rename, key=len, reverse=True):
        if name == old or name.startswith(old.rstrip("/") + "/"):
            return os.path.normpath(rename[old] + name[len(old.rstrip("/")) :])
    return name


def _directories(names):
    """Every directory above ``names``, parents first, each once."""
    seen = []
    for name in names:
        parts = name.split("/")[:-1]
        for end in range(1, len(parts) + 1):
            folder = "/".join(parts[:end])
            if folder not in seen:
                seen.append(folder)
    return seen


def _member(name, kind, size=0):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def archive_bytes(root, files, rename):
    """The archive of ``files`` (relative to ``root``) as bytes; names renamed by ``rename``."""
    names = [archive_name(name, rename) for name in files]
    for name in names:
        if os.path.isabs(name) or ".." in name.split("/"):
            raise AnsibleLookupError(f"tree_archive: {name} would be unpacked outside the destination")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for folder in _directories(names):
            archive.addfile(_member(folder, tarfile.DIRTYPE))
        for source, name in zip(files, names):
            with open(os.path.join(root, source), "rb") as handle:
                data = handle.read()
            archive.addfile(_member(name, tarfile.REGTYPE, len(data)), io.BytesIO(data))
    return buffer.getvalue()


def write_archive(root, files, rename, dest):
    """Write the archive into ``dest`` under its digest's name, atomically; return its path."""
    data = archive_bytes(root, files, rename)
    digest = digest_files(root, files)
    os.makedirs(dest, mode=0o700, exist_ok=True)
    path = os.path.join(dest, f"{digest}.tar")
    # Another fork may be writing the same bytes: each writes its own file and renames it.
    fd, scratch = tempfile.mkstemp(dir=dest, prefix=".tree_archive.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise
    return path


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        root = self.get_option("root")
        rename = self.get_option("rename") or {}
        dest = self.get_option("dest") or os.path.join(constants.DEFAULT_LOCAL_TMP, "tree_archive")
        files = list_tree(root, terms)
        if self.get_option("base64"):
            return [base64.b64encode(archive_bytes(root, files, rename)).decode("ascii")]
        try:
            return [write_archive(root, files, rename, dest)]
        except OSError as error:
            raise AnsibleLookupError(f"tree_archive: cannot write the archive in {dest}: {error}") from error
