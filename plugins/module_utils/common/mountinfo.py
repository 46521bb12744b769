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


def _table():
    """Every mount as ``(mount point, filesystem type, source)``, in the kernel's order."""
    table = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split()
            separator = fields.index(b"-")
            table.append(
                (_unescape(fields[4]), os.fsdecode(fields[separator + 1]), _unescape(fields[separator + 2]))
            )
    return table


def mounts():
    """Every mount as ``(mount point, filesystem type)``, in the kernel's order."""
    return [(point, kind) for point, kind, _source in _table()]


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def mount_of(path):
    """``(mount point, filesystem type, source)`` of the mount that holds ``path``: the
    longest mount point above its real path, the last of equal ones (the one on top), as
    ``findmnt -T`` finds it; ``("", "unknown", "")`` when none does."""
    real = os.path.realpath(path)
    best = ("", "unknown", "")
    for mount in _table():
        if _inside(real, mount[0]) and len(mount[0]) >= len(best[0]):
            best = mount
    return best


def filesystem_of(path):
    """The filesystem type of the mount that holds ``path`` (the longest mount point above it)."""
    return mount_of(path)[1]


def mount_points_under(root):
    """The mount points at or below ``root``, shallowest first, each once."""
    points = {point for point, _kind in mounts() if _inside(point, root)}
    return sorted(points, key=lambda point: (point.count("/"), point))
