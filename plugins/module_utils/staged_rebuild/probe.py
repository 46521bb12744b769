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

from ..common import errors, mountinfo, proc
from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import setting
from . import backends, easybuild, fsutil

# Filesystems that several nodes mount at once, by the type /proc/self/mountinfo gives: there,
# whether the lock excludes other nodes is a measurement, not a property this host can see.
# Each maps to what the integration tests measured with the lock probe from two nodes
# (tests/integration/cluster/test_cluster_sharedfs.py), or to None where nothing was measured.
# "flock": whether a flock reaches the other nodes, so that a publisher taking only the flock
# (0.2.0) is excluded too; the full protocol was coherent wherever "coherent" is set.
# "renames" (where set): what the filesystem needs so that other nodes see a publish's renames.
SHARED_FILESYSTEMS = {
    "nfs": None,
    "nfs4": None,
    "lustre": None,
    "gpfs": None,
    "beegfs": None,
    "cifs": None,
    "smb3": None,
    "ceph": None,  # the kernel client
    "fuse.ceph-fuse": {"measured": "CephFS 16.2.15 (ceph-fuse)", "coherent": True, "flock": True},
    "fuse.glusterfs": {
        "measured": "GlusterFS 10.3",
        "coherent": True,
        "flock": True,
        # A job on another client that keeps using the live path kept the old tree (seen for
        # minutes): md-cache answers its lookup of the name from the inode it last saw there.
        "renames": "set performance.stat-prefetch off (or performance.md-cache-timeout 0) on the volume",
    },
}
# The release the integration tests run (the pin in requirements/): the oldest one validated.
EASYBUILD_VALIDATED = (5, 4, 1)
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
        measured = SHARED_FILESYSTEMS[report["filesystem"]]
        lines.append(_cross_node_lock(report["filesystem"], measured))
        renames = measured.get("renames") if measured else None
        if measured and renames:
            lines.append(
                f"renames: on {measured['measured']} a job on another node that keeps using the live path "
                f"kept the old tree after a publish; {renames}"
            )
    version = report["easybuild_version"]
    if version is None or tuple(int(part) for part in version.split(".")) < EASYBUILD_VALIDATED:
        validated = ".".join(map(str, EASYBUILD_VALIDATED))
        lines.append(
            f"EasyBuild: {version or 'not found'}; pin the pipeline to {validated} (the release the "
            "integration tests validate) or a newer validated release"
        )
    return lines


def _cross_node_lock(filesystem, measured):
    """The cross-node lock's line for a shared ``filesystem``: what was measured, if anything."""
    if measured is None:
        return (
            f"cross-node lock: {filesystem} is shared; contend for the state-root lock from two build nodes, "
            "and if both acquire it, use a scheduler singleton or another measured distributed lock before "
            "deployment"
        )
    if not measured["coherent"]:
        return (
            f"cross-node lock: {filesystem} is shared and the lock was measured NOT coherent across nodes "
            f"on {measured['measured']}; use a scheduler singleton or another measured distributed lock"
        )
    flock = (
        "flock reaches the other nodes too, so a publisher taking only the flock (0.2.0) is excluded as well"
        if measured["flock"]
        else "flock stays on each node, so drain publishers taking only the flock (0.2.0) first"
    )
    return (
        f"cross-node lock: {filesystem} is shared; the lock was measured coherent across nodes on "
        f"{measured['measured']} ({flock}); confirm it on this site's version by contending for the "
        "state-root lock from two build nodes before deployment"
    )


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
