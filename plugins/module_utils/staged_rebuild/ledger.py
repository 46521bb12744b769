# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The optional ledger: one JSON line per published module, appended under the lock.

``--ledger-config FILE`` names a JSON object ``{"path": "<ledger.jsonl>", "site": "<label>"}``.
A run with a ledger writes journal schema 4. The append is an operation of the publish
transaction: its inverse truncates the ledger back to its length before the append, so a
publish that fails after it leaves no record of a tree that never went live.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os

from ..common import errors
from ..common.errors import setting
from . import fsutil, records
from .records import AbsPath


@dataclasses.dataclass(frozen=True)
class LedgerConfig:
    """Where the ledger is and the site label each line carries."""

    path: AbsPath
    site: str = ""


def load_config(path):
    """The ledger configuration in the file ``path`` (the ``ledger_config`` setting)."""
    try:
        document = json.loads(fsutil.read_regular(path, setting("ledger_config")))
    except OSError as err:
        raise errors.UsageError(f"cannot read {setting('ledger_config')} {path}: {err.strerror}") from None
    except ValueError:
        raise errors.UsageError(f"{setting('ledger_config')} {path} is not JSON") from None
    target = document.get("path") if isinstance(document, dict) else None
    if not isinstance(target, str) or not target:
        raise errors.UsageError(
            f'{setting("ledger_config")} {path} needs {{"path": "<ledger.jsonl>", "site": "<label>"}}'
        )
    if not os.path.isabs(target):
        raise errors.UsageError(f"{setting('ledger_config')} {path}: path {target!r} is not absolute")
    # The run's journal keeps the path, and a journal path holds no ".." (records.AbsPath).
    if ".." in target.split("/"):
        raise errors.UsageError(f"{setting('ledger_config')} {path}: path {target!r} has a '..' component")
    return LedgerConfig(AbsPath(target), str(document.get("site", "")))


def _sha256(path):
    return hashlib.sha256(fsutil.read_regular(path, "easyconfig")).hexdigest()


def lines_of(journal, config):
    """The ledger's lines for a published run: one per module, as it is live now."""
    published_at = records.now()
    lines = []
    for entry in journal.modules:
        easyconfigs = sorted(glob.glob(os.path.join(entry.stable_path, "easybuild", "*.eb")))
        lines.append(
            {
                "name": entry.name,
                "version": entry.version,
                "stable_path": entry.stable_path,
                "run_id": journal.run_id,
                "site": config.site,
                "started_at": journal.run.created,
                "published_at": published_at,
                "module_file": entry.module_file,
                "module_sha256": entry.new_module_sha256,
                "easyconfig_sha256": _sha256(easyconfigs[0]) if easyconfigs else None,
                "retired_path": entry.retired_path,
            }
        )
    return lines


def append_run(config, journal):
    """Append the lines of ``journal``'s published modules; return the length before."""
    return append(config, lines_of(journal, config))


def append(config, lines):
    """Append ``lines`` durably; return the ledger's length before, for the inverse."""
    path = config.path
    fsutil.refuse_symlink_components(path)
    created = not os.path.exists(path)
    fd = fsutil.open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        data = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines).encode("utf-8")
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsutil.fsync_dir(os.path.dirname(path))
    return before


def length(config):
    try:
        return os.lstat(config.path).st_size
    except FileNotFoundError:
        return 0


def remove_run_records(config, length_before, run_id):
    """Cut the lines a crashed run appended after ``length_before``, if they are all its own."""
    try:
        tail = fsutil.read_regular(config.path, "ledger")[length_before:]
    except FileNotFoundError:
        return False
    lines = [line for line in tail.splitlines() if line.strip()]
    if not lines or any(json.loads(line).get("run_id") != run_id for line in lines):
        return False
    truncate(config, length_before)
    return True


def truncate(config, length):
    fd = fsutil.open_nofollow(config.path, os.O_WRONLY, 0o644)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)
