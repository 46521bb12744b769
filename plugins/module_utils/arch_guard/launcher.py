# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the launcher that the arch_guard role installs runs: the site's settings, then the guard.

The site's timeout and verbosity are defaults: a job that sets ``EESSI_ARCH_GUARD_TIMEOUT``
(to a usable number of seconds) or ``EESSI_ARCH_GUARD_VERBOSE`` itself keeps its value, as it
would without the role; a timeout the guard could not use means the site's, not 60 s. A
partition the site switched the guard off for is off whatever the job says: the job's own
``EESSI_ARCH_GUARD`` can switch the guard off, never on, since that is the site's call.

Read by every task of every step, so it imports no more than the cached-decision path does.
"""

from __future__ import annotations

from . import cli, lean_os, settings

SITE_SWITCH_OFF = "0"


def site_environment(env, timeout=None, verbose=False, disabled_partitions=()):
    """A copy of ``env`` with the site's settings laid over it."""
    laid = dict(env)
    if timeout is not None and settings.requested_timeout(env) is None:
        laid["EESSI_ARCH_GUARD_TIMEOUT"] = str(timeout)
    if verbose:
        laid.setdefault("EESSI_ARCH_GUARD_VERBOSE", "1")
    if env.get("SLURM_JOB_PARTITION") in disabled_partitions:
        laid["EESSI_ARCH_GUARD"] = SITE_SWITCH_OFF
    return laid


def run(timeout=None, verbose=False, disabled_partitions=(), argv=None) -> int:
    """The guard with the site's settings; always 0, as ``cli.main``."""
    env = site_environment(lean_os.environ(), timeout, verbose, tuple(disabled_partitions))
    return cli.main(argv=argv, environ=env)
