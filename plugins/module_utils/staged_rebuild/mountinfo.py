# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The mount table of this process, read from ``/proc/self/mountinfo``."""

from __future__ import annotations

import os
import re

_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")


def _unescape(field):
    # The kernel writes space, tab, newline and backslash in a path as three-digit octal.
    return os.fsdecode(_OCTAL_ESCAPE.sub(lambda match: bytes([int(match.group(1), 8)]), field))


def mounts():
    """Every mount as ``(mount point, filesystem type)``, in the kernel's order."""
    table = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split()
            separator = fields.index(b"-")
            table.append((_unescape(fields[4]), os.fsdecode(fields[separator + 1])))
    return table


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def filesystem_of(path):
    """The filesystem type of the mount that holds ``path`` (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, fstype = "", "unknown"
    for point, kind in mounts():
        if _inside(real, point) and len(point) >= len(best):
            best, fstype = point, kind
    return fstype


def mount_points_under(root):
    """The mount points at or below ``root``, shallowest first, each once."""
    points = {point for point, _kind in mounts() if _inside(point, root)}
    return sorted(points, key=lambda point: (point.count("/"), point))
