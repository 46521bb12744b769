# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``probe --path DIR``: what this host and the filesystem of DIR can do for a staged rebuild.

The directory exchange is tried for real on two scratch directories made inside DIR (and
removed): only a filesystem whose exchange succeeds publishes without a moment in which
the live name is missing. The sandbox probes run what the backends would run.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile

from ..common import errors, fsutil


def filesystem_of(path):
    """The filesystem type of the mount that holds ``path`` (longest mount point prefix)."""
    best, fstype = "", "unknown"
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            mount_point = fields[4].replace("\\040", " ")
            separator = fields.index("-")
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best):
                best, fstype = mount_point, fields[separator + 1]
    return fstype


def exchange_works(path):
    """``(True, None)`` if RENAME_EXCHANGE swaps two directories in ``path``, else ``(False, errno name)``."""
    scratch = tempfile.mkdtemp(prefix=".eb-staged-rebuild-probe-", dir=path)
    try:
        first, second = os.path.join(scratch, "a"), os.path.join(scratch, "b")
        os.mkdir(first)
        os.mkdir(second)
        try:
            fsutil.rename_exchange(first, second)
        except OSError as err:
            return False, errno.errorcode.get(err.errno, str(err.errno))
        return True, None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _succeeds(argv):
    try:
        return (
            subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def max_user_namespaces():
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def sandbox_probes():
    """The probes that write nothing: what a dry run reports."""
    return {
        "bwrap": _succeeds(["bwrap", "--dev-bind", "/", "/", "true"]),
        "userns": _succeeds(["unshare", "--user", "--map-root-user", "--mount", "true"]),
        "max_user_namespaces": max_user_namespaces(),
    }


def probe(path):
    if not os.path.isdir(path):
        raise errors.UsageError(f"probe --path {path}: not a directory")
    exchange, exchange_errno = exchange_works(path)
    return {
        "path": os.path.abspath(path),
        "filesystem": filesystem_of(path),
        "exchange": exchange,
        "exchange_errno": exchange_errno,
        "publish_method": "exchange"
        if exchange
        else "fallback (three renames: the live name is briefly missing)",
        "bwrap": _succeeds(["bwrap", "--dev-bind", "/", "/", "true"]),
        "userns": _succeeds(["unshare", "--user", "--map-root-user", "--mount", "true"]),
        "max_user_namespaces": max_user_namespaces(),
        "auto_backend": "installpath",
        "changed": False,
    }
