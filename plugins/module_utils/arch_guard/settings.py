# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a task's environment says before anything is computed: off, not loaded, how long.

Read by every task, so it imports nothing the cached-decision path does not need.
"""

from __future__ import annotations

from .decision import skip
from .lean_os import isdir

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


def scratch_dir(env) -> str:
    """``TMPDIR`` when it is an absolute path to a directory, else /tmp."""
    tmpdir = env.get("TMPDIR", "")
    return tmpdir if tmpdir.startswith("/") and isdir(tmpdir) else "/tmp"  # noqa: S108
