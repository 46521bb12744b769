# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Would a rebuild change anything? Each module against what its live install records.

EasyBuild records both things a rebuild is asked for in the install it made:
``<install>/easybuild/<Name>-<version>.eb``, a byte copy of the easyconfig it built from,
and its own version in the first line of its log beside it (``... This is EasyBuild 5.4.1
(framework: ...``). A module is up to date when that copy equals one of the easyconfig
files among EasyBuild's arguments and the log's version is the one ``eb --version`` gives
now. An easyconfig named without a path (found through EasyBuild's robot path) cannot be
read here, so it never counts as up to date. A chain's dependants are compared with their own
copies, which they are rebuilt from.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import os
import stat
from typing import Any, Callable, Dict

from ..common import errors
from . import fsutil, probe

_LOG_HEAD_BYTES = 4096
_OPENERS: Dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open}


def requested_easyconfigs(eb_args) -> list:
    """EasyBuild's arguments that name an easyconfig file."""
    return [arg for arg in eb_args if arg.endswith(".eb") and not arg.startswith("-")]


def compare(request) -> list:
    """For each requested module: ``{module, up_to_date, why}``."""
    easyconfigs = requested_easyconfigs(request.eb_args)
    if request.chain is not None:
        # A dependant is rebuilt from its own copy: it is stale only by EasyBuild's version, so
        # a chain is rebuilt when its named module (or EasyBuild) changed.
        easyconfigs += [member.easyconfig for member in request.chain.members[1:]]
    contents, problem = _read_all(easyconfigs)
    version = probe.easybuild_version(request.eb)
    results = []
    # By the install directory: EasyBuild keeps the easyconfig there as <Name>-<dir>.eb, also
    # for a hierarchical module (toy-0.0-GCC-6.4.0-2.28.eb for Compiler/GCC/6.4.0-2.28/toy/0.0).
    for entry in request.module_paths("uptodate"):
        easyconfig = f"{entry.name}-{entry.version}.eb"
        why = problem or _why_stale(entry.stable_path, easyconfig, contents, version)
        results.append(
            {"module": entry.module, "up_to_date": why is None, "why": why or "same easyconfig and EasyBuild"}
        )
    return results


def _read_all(easyconfigs):
    if not easyconfigs:
        return [], "no easyconfig file among EasyBuild's arguments to compare with"
    contents = []
    for path in easyconfigs:
        try:
            contents.append(fsutil.read_regular(path, "easyconfig"))
        except (OSError, errors.UsageError):
            return [], f"easyconfig {path} is not a file that can be read here"
    return contents, None


def _why_stale(install, easyconfig_name, contents, version):
    recorded = os.path.join(install, "easybuild", easyconfig_name)
    try:
        if fsutil.read_regular(recorded, "easyconfig") not in contents:
            return f"{recorded} differs from the requested easyconfig"
    except (OSError, errors.UsageError):
        return f"the live install records no easyconfig ({recorded})"
    if version is None:
        return "eb --version did not run, so the EasyBuild version cannot be compared"
    built_by = recorded_easybuild_version(os.path.join(install, "easybuild"))
    if built_by != version:
        shown = ".".join(map(str, built_by)) if built_by else "an unknown version"
        return f"built by EasyBuild {shown}, not by {'.'.join(map(str, version))}"
    return None


def _log_head(path):
    """The first bytes of the log ``path``, uncompressed: opened without following a link or
    blocking (a FIFO there would stop the comparison), and read only if it is a regular file."""
    fd = fsutil.open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    # Checked on the descriptor, before io makes a file object of it (which refuses a
    # directory with an error of its own).
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise errors.UsageError(f"EasyBuild log {path} is not a regular file")
    with os.fdopen(fd, "rb") as raw:
        opener = _OPENERS.get(os.path.splitext(path)[1])
        if opener is None:
            return raw.read(_LOG_HEAD_BYTES)
        with opener(raw, "rb") as handle:
            return handle.read(_LOG_HEAD_BYTES)


def recorded_easybuild_version(log_dir):
    """``(major, minor, patch)`` from the newest EasyBuild log in ``log_dir``, or None."""
    logs = sorted(glob.glob(os.path.join(glob.escape(log_dir), "easybuild-*.log*")))
    logs = [log for log in logs if not log.endswith("_test_report.md")]
    if not logs:
        return None
    try:
        head = _log_head(logs[-1]).decode("utf-8", "replace")
    except (OSError, EOFError, errors.UsageError):
        return None
    found = probe.EB_VERSION_PATTERN.search(head)
    return tuple(int(part) for part in found.groups()) if found else None
