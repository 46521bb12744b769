# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The expected failures of the core: each carries one line for the user and an exit code.

The command-line front ends print ``<tool>: <message>`` and exit with ``exit_code``; the
Ansible modules return the message through ``fail_json``. Anything else that escapes is a
bug and keeps its traceback (with ``--debug``).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_WARNINGS = 1
EXIT_ERROR = 2


class HpcstackError(Exception):
    """Root of the expected errors; ``str(err)`` is the one-line message."""

    exit_code = EXIT_ERROR


class UsageError(HpcstackError):
    """Bad input: an option, a path or a name that is refused before anything changes."""


class LockError(HpcstackError):
    """The state root's lock is held by another process, or could not be taken."""


class JournalError(HpcstackError):
    """A journal that cannot be read, is truncated, or has a schema this version refuses."""


class PublishError(HpcstackError):
    """A transaction step failed; what had been done was reversed before this was raised."""


class Terminated(HpcstackError):
    """SIGTERM arrived; raised where the process was, so that clean-up code runs.

    The one class for both commands: the staged tool reverses the completed steps of its
    transaction, the guard kills its children's process groups and removes its work
    directory. It lives here because this module imports nothing, so the guard's
    cached-decision path can import it at no cost.
    """
