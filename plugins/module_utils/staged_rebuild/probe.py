# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``probe --path DIR``: what this host, this user and the filesystem of DIR can do.

The directory exchange is tried for real on two scratch directories made inside DIR (and
removed): only a filesystem whose exchange succeeds publishes without a moment in which
the live name is missing. The sandbox probes run what the backends run. Each open-004
recommendation of the design becomes a line of the report when the finding it answers is
there.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from typing import Optional, Tuple

from ..common import errors, proc
from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import setting
from . import backends, easybuild, fsutil, mountinfo

# Filesystems that several nodes mount at once: there, whether the lock excludes other nodes
# is a measurement, not a property this host can see.
SHARED_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "fuse.glusterfs")
# The first release the design accepts for the pipeline.
EASYBUILD_VALIDATED = (5, 4, 2)
EB_VERSION_PATTERN = re.compile(r"This is EasyBuild (\d+)\.(\d+)\.(\d+)")
_EB_TIMEOUT = 60


def exchange_works(path):
    """``(True, None)`` if RENAME_EXCHANGE swaps two directories in ``path``, else ``(False, errno name)``."""
    try:
        scratch = tempfile.mkdtemp(prefix=".eb-staged-rebuild-probe-", dir=path)
    except OSError as err:
        raise errors.UsageError(
            f"probe {setting('path')} {path}: cannot make a scratch directory there ({err.strerror}); "
            "run the probe as the build account"
        ) from None
    try:
        first, second = os.path.join(scratch, "a"), os.path.join(scratch, "b")
        os.mkdir(first)
        os.mkdir(second)
        try:
            fsutil.rename_exchange(first, second)
        except OSError as err:
            return False, errno.errorcode.get(err.errno or 0, str(err.errno))
        return True, None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def max_user_namespaces():
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def easybuild_version(eb: str) -> Optional[Tuple[int, ...]]:
    """``(major, minor, patch)`` of ``eb --version``, or None when it does not run."""
    try:
        done = proc.run_child(
            [eb, "--version"],
            env=easybuild.with_own_python(dict(os.environ), eb),
            deadline=Deadline(_EB_TIMEOUT),
        )
    except (OSError, DeadlineExceeded):
        return None
    found = EB_VERSION_PATTERN.search(done.stdout.decode("utf-8", "replace"))
    return tuple(int(part) for part in found.groups()) if found else None


def sandbox_probes():
    """The probes that write nothing outside a temporary directory: what a dry run reports."""
    bwrap, userns = backends.probe_bwrap(), backends.probe_userns()
    return {
        "bwrap": bwrap,
        "userns": userns,
        "max_user_namespaces": max_user_namespaces(),
        "auto_backend": backends.auto_choice(bwrap, userns),
    }


def recommendations(report):
    """The open-004 recommendations that apply to ``report``, one line each."""
    lines = []
    if not report["bwrap"]:
        lines.append(
            "bubblewrap: 'bwrap --dev-bind / / true' fails for this user; use the bwrap backend only "
            "where it succeeds, else the userns backend"
        )
    if not report["userns"] or report["max_user_namespaces"] == 0:
        lines.append(
            f"user namespaces: not available (user.max_user_namespaces={report['max_user_namespaces']}); "
            "keep it non-zero for the build account under a documented exception, or use a setuid "
            "bubblewrap that passes the probe, or accept the unsandboxed installpath fallback"
        )
    if not report["exchange"]:
        lines.append(
            f"directory exchange: fails with {report['exchange_errno']} on {report['filesystem']}; "
            "publishing uses the three-rename fallback, in which the live name is briefly missing: require "
            "a filesystem where the exchange works for prefixes where that is unacceptable, else publish "
            "in a frozen release window"
        )
    if report["filesystem"] in SHARED_FILESYSTEMS:
        lines.append(
            f"cross-node lock: {report['filesystem']} is shared; contend for the state-root lock from two "
            "build nodes, and if both acquire it, use a scheduler singleton or another measured "
            "distributed lock before deployment"
        )
    version = report["easybuild_version"]
    if version is None or tuple(int(part) for part in version.split(".")) < EASYBUILD_VALIDATED:
        validated = ".".join(map(str, EASYBUILD_VALIDATED))
        lines.append(
            f"EasyBuild: {version or 'not found'}; pin the pipeline to {validated} or a newer release "
            "validated by the integration test"
        )
    return lines


def probe(path, eb):
    if not os.path.isdir(path):
        raise errors.UsageError(f"probe {setting('path')} {path}: not a directory")
    exchange, exchange_errno = exchange_works(path)
    version = easybuild_version(eb)
    report = {
        "path": os.path.abspath(path),
        "filesystem": mountinfo.filesystem_of(path),
        "exchange": exchange,
        "exchange_errno": exchange_errno,
        "publish_method": "exchange"
        if exchange
        else "fallback (three renames: the live name is briefly missing)",
        "easybuild_version": ".".join(map(str, version)) if version else None,
        "changed": False,
    }
    report.update(sandbox_probes())
    report["recommendations"] = recommendations(report)
    return report
