# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The expected failures of the core: each carries one line for the user and an exit code.

The command-line front ends print ``<tool>: <message>`` and exit with ``exit_code``; the
Ansible modules return the message through ``fail_json``, with ``kind`` as a stable
``error`` a playbook can test (``lock_held``: retry later). Anything else that escapes is
a bug and keeps its traceback (with ``--debug``).

A message about a setting names the setting, not its spelling:
``UsageError(f"{setting('grace_hours')} must not be negative")``. ``render(name_of)``
spells each named setting as the front end does (``--grace-hours`` on the command line,
``grace_hours`` in a module); ``str()`` spells it ``--name-with-dashes``, and
``marked(err)`` keeps the marks, for a message that quotes another error. The name is
marked with NUL bytes, which no path, option or journal value the message quotes can hold.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_WARNINGS = 1
EXIT_ERROR = 2


_MARK = "\0"


def marked(err: BaseException) -> str:
    """``err``'s message with the settings it names still marked, to quote in another one."""
    if isinstance(err, HpcstackError) and err.args:
        return str(err.args[0])
    return str(err)


def setting(name: str) -> str:
    """The setting ``name`` inside a message, spelt later by the front end that shows it."""
    return f"{_MARK}{name}{_MARK}"


def _dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def message(err: BaseException, name_of=_dashed) -> str:
    """``err`` in the words a user is shown: the core's own message, each setting it names spelt
    by ``name_of`` (``--name-with-dashes`` by default); the system's words for an OSError, with
    the path it names; the class name and message of anything else (a bug, or an interrupt)."""
    if isinstance(err, HpcstackError):
        return err.render(name_of)
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        return f"{err.strerror or err}{where}"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class HpcstackError(Exception):
    """Root of the expected errors; ``str(err)`` is the one-line message.

    ``details`` are fields a front end shows beside the message (``--json``, a module's
    failure): what a failed build's EasyBuild said, and where its log is.
    """

    exit_code = EXIT_ERROR
    kind = "error"

    def __init__(self, *args, details=None) -> None:
        super().__init__(*args)
        self.details = dict(details or {})

    def render(self, name_of=_dashed) -> str:  # no typing import: the guard's fast path loads this
        """The message with each setting it names spelt by ``name_of(setting)``."""
        parts = str(self.args[0] if self.args else "").split(_MARK)
        # Between two marks (odd places) stands a setting's name.
        return "".join(name_of(part) if index % 2 else part for index, part in enumerate(parts))

    def __str__(self) -> str:
        return self.render()


class UsageError(HpcstackError):
    """Bad input: an option, a path or a name that is refused before anything changes."""

    kind = "usage"


class LockError(HpcstackError):
    """The state root's lock could not be taken (an error of the filesystem, not a holder)."""

    kind = "lock"


class LockHeld(LockError):
    """Another run holds the state root's lock: trying again later may succeed."""

    kind = "lock_held"


class JournalError(HpcstackError):
    """A journal that cannot be read, is truncated, or has a schema this version refuses."""

    kind = "journal"


class PublishError(HpcstackError):
    """A transaction step failed; what had been done was reversed before this was raised."""

    kind = "publish_failed"


class Terminated(HpcstackError):
    """SIGTERM arrived; raised where the process was, so that clean-up code runs.

    The one class for both commands: the staged tool reverses the completed steps of its
    transaction, the guard kills its children's process groups and removes its work
    directory. It lives here because this module imports nothing, so the guard's
    cached-decision path can import it at no cost.
    """

    kind = "terminated"
