# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a task's environment says before anything is computed: off, not loaded, how long.

Read by every task, so it imports nothing the cached-decision path does not need.
"""

from __future__ import annotations

import _stat
import posix

from .decision import skip

DEFAULT_TIMEOUT_SECONDS = 60.0
# A TaskProlog that runs for a day is a hung node, and larger values overflow the kernel's
# timeouts: they mean the default.
MAX_TIMEOUT_SECONDS = 86400.0
DISABLING_VALUES = frozenset(("0", "off", "no", "false"))


def requested_timeout(env):
    """EESSI_ARCH_GUARD_TIMEOUT when it is a usable number of seconds, else None."""
    try:
        seconds = float(env.get("EESSI_ARCH_GUARD_TIMEOUT", ""))
    except ValueError:
        return None
    return seconds if 0 < seconds <= MAX_TIMEOUT_SECONDS else None


def timeout_seconds(env) -> float:
    requested = requested_timeout(env)
    return DEFAULT_TIMEOUT_SECONDS if requested is None else requested


def disabled_by(env):
    """The value of EESSI_ARCH_GUARD when it switches the guard off, else None."""
    value = env.get("EESSI_ARCH_GUARD")
    if value is not None and value.strip().lower() in DISABLING_VALUES:
        return value
    return None


def early_skip(env):
    """The decision when the guard is off or EESSI is not loaded, else None.

    Checked before the cache: EESSI_ARCH_GUARD is not part of the cache key.
    """
    switch = disabled_by(env)
    if switch is not None:
        return skip(f"disabled by EESSI_ARCH_GUARD={switch}")
    if not env.get("EESSI_SOFTWARE_SUBDIR"):
        return skip("EESSI is not loaded (EESSI_SOFTWARE_SUBDIR is unset or empty)")
    return None


FALLBACK_SCRATCH = "/tmp"  # noqa: S108 (where slurmstepd falls back to, too)
_SHARED_WRITE = _stat.S_IWGRP | _stat.S_IWOTH


def distrust(path: str):
    """Why the directory ``path`` is not one to create files in or believe files from, or None.

    Trusted: a directory itself (lstat, no link followed), owned by root or the running uid,
    and not writable by group or others unless the sticky bit is set (then nobody else can
    rename or remove what the guard made there).
    """
    try:
        info = posix.lstat(path)
    except (OSError, ValueError) as err:
        return f"{path} cannot be looked at: {getattr(err, 'strerror', None) or err}"
    if _stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink"
    if not _stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid not in (0, posix.getuid()):
        return f"{path} belongs to uid {info.st_uid}"
    if info.st_mode & _SHARED_WRITE and not info.st_mode & _stat.S_ISVTX:
        mode = _stat.S_IMODE(info.st_mode)
        return f"{path} is writable by group or others without the sticky bit (mode {mode:04o})"
    return None


def trusted_dir(path: str) -> bool:
    return distrust(path) is None


def scratch_candidates(env) -> list:
    """Where the guard may look: ``TMPDIR`` when it is an absolute path, then /tmp."""
    tmpdir = env.get("TMPDIR", "")
    candidates = [tmpdir] if tmpdir.startswith("/") and tmpdir != FALLBACK_SCRATCH else []
    candidates.append(FALLBACK_SCRATCH)
    return candidates


def scratch_dirs(env) -> list:
    """The trusted ones of ``scratch_candidates``, in order (empty when neither is)."""
    return [path for path in scratch_candidates(env) if distrust(path) is None]


def scratch_dir(env):
    """``TMPDIR`` when it is an absolute path to a trusted directory, else /tmp when that is
    trusted, else None (then no step cache, and no work directory for the restore helper)."""
    trusted = scratch_dirs(env)
    return trusted[0] if trusted else None
