# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run journal: ``<state-root>/runs/<run-id>/journal.json``.

Format (a JSON object, rewritten whole by ``fsutil.atomic_write`` on every change, so a
reader sees the previous version or the next one, never a torn file):

``schema``
    2: a directory swap; 4: a directory swap whose run also appends ledger records.
    1 and 3 were generation-pointer journals (the live path a symlink to a generation);
    this version never swaps symlinks and refuses them rather than guess.
``kind``
    ``publish`` (a rebuild) or ``retire`` (a module file moved out of the way).
``run_id``, ``created``, ``updated``, ``state_since``
    The run's name and its UTC times (ISO 8601); ``state_since`` is when ``state`` last
    changed (gc's grace period counts from it).
``state``
    Where the run is: ``building``, ``planning``, ``publishing``, ``published``,
    ``failed`` (reversed after an error), ``rolling_back``, ``rolled_back``; for retire:
    ``retiring``, ``retired``, ``rolled_back``.
``modules``
    One object per module, in publish order: ``module``, ``stable_path``,
    ``retired_path`` (the staged sibling before the swap, the old tree after it),
    ``module_file`` and its ``module_backup``, the SHA-256 of the old and new module file,
    the inodes of live and stage taken before the swap (they let resume tell, from the
    disk itself, whether a swap happened), and the live-change record.
``steps``
    Each operation, appended with ``status: started`` BEFORE it runs and marked ``done``
    after: a crash leaves the operation it interrupted at the end of the list.

The journal is written before each step it records. ``EB_STAGED_REBUILD_CRASH_AT=<step>``
is a test-only hook: the process kills itself with SIGKILL right after recording that step
as started, which is how the crash tests stop the tool at every journaled step.
"""

from __future__ import annotations

import datetime
import json
import os
import signal

from ..common import errors
from . import fsutil, paths

SCHEMA_SWAP = 2
SCHEMA_SWAP_LEDGER = 4
SUPPORTED_SCHEMAS = (SCHEMA_SWAP, SCHEMA_SWAP_LEDGER)
_REFUSED_SCHEMAS = {
    1: "schema 1 is a generation-pointer journal (live path as a symlink to a generation)",
    3: "schema 3 is a generation-pointer journal with a ledger",
}
JOURNAL = "journal.json"
CRASH_HOOK = "EB_STAGED_REBUILD_CRASH_AT"

# States in which a run holds work that resume must finish or reverse.
INTERRUPTED = ("building", "planning", "publishing", "rolling_back", "retiring")


def now():
    # Microseconds: two runs started in the same second still list in the order they began.
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Journal:
    """One run's journal; every change is written through before the caller goes on."""

    def __init__(self, path, data):
        self.path = path
        self.data = data

    @property
    def run_dir(self):
        return os.path.dirname(self.path)

    @property
    def run_id(self):
        return self.data["run_id"]

    @property
    def state(self):
        return self.data["state"]

    @property
    def modules(self):
        return self.data["modules"]

    @classmethod
    def create(cls, runs_dir, run_id, kind, state, schema=SCHEMA_SWAP, **fields):
        """Create ``runs_dir/run_id/`` and its first journal; refuse an existing run id."""
        run_dir = os.path.join(runs_dir, run_id)
        try:
            os.mkdir(run_dir, 0o700)
        except FileExistsError:
            raise errors.UsageError(
                f"run {run_id} exists already ({run_dir}); pick another --run-id"
            ) from None
        fsutil.fsync_dir(runs_dir)
        stamp = now()
        data = {
            "state_since": stamp,
            "schema": schema,
            "kind": kind,
            "run_id": run_id,
            "state": state,
            "created": stamp,
            "updated": stamp,
            "modules": [],
            "steps": [],
        }
        data.update(fields)
        journal = cls(os.path.join(run_dir, JOURNAL), data)
        journal.save()
        return journal

    @classmethod
    def load(cls, path):
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as err:
            raise errors.JournalError(f"cannot read journal {path}: {err.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise errors.JournalError(f"journal {path} is truncated or not JSON ({len(raw)} bytes)") from None
        if not isinstance(data, dict) or "schema" not in data:
            raise errors.JournalError(f"journal {path} has no schema field")
        schema = data["schema"]
        # JSON true is an int that equals 1, and a list is unhashable: only a real int counts.
        known = isinstance(schema, int) and not isinstance(schema, bool)
        if known and schema in _REFUSED_SCHEMAS:
            raise errors.JournalError(
                f"journal {path}: {_REFUSED_SCHEMAS[schema]}; "
                "this version only swaps directories (schemas 2 and 4)"
            )
        if not known or schema not in SUPPORTED_SCHEMAS:
            raise errors.JournalError(f"journal {path} has unknown schema {schema!r} (known: 2, 4)")
        for field in ("kind", "run_id", "state", "modules", "steps"):
            if field not in data:
                raise errors.JournalError(f"journal {path} lacks the field {field!r}")
        return cls(path, data)

    def save(self):
        self.data["updated"] = now()
        fsutil.atomic_write_json(self.path, self.data)

    def set_state(self, state):
        self.data["state"] = state
        # gc's grace clock starts when the run last changed state, not at any later save.
        self.data["state_since"] = now()
        self.save()

    def start(self, step, **fields):
        """Record ``step`` as started (durably) before the caller performs it."""
        entry = {"step": step, "status": "started", "at": now()}
        entry.update(fields)
        self.data["steps"].append(entry)
        self.save()
        if os.environ.get(CRASH_HOOK) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return entry

    def finish(self, entry, **fields):
        entry["status"] = "done"
        entry.update(fields)
        self.save()

    def step_names(self):
        return [entry["step"] for entry in self.data["steps"]]


def run_journals(state_root):
    """Every journal under ``state_root/runs``, oldest run first; one bad journal stops it.

    A partial list would hide the broken run, so an unreadable journal raises.
    """
    runs_dir = os.path.join(state_root, "runs")
    try:
        names = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return []
    journals = []
    for name in names:
        path = os.path.join(runs_dir, name, JOURNAL)
        if os.path.isdir(os.path.join(runs_dir, name)):
            journals.append(Journal.load(path))
    journals.sort(key=lambda journal: (journal.data.get("created", ""), journal.run_id))
    return journals


def find(state_root, run_id):
    """The journal of ``run_id``; a run id that is not a plain name (``../x``) is refused."""
    paths.check_run_id(run_id)
    path = os.path.join(state_root, "runs", run_id, JOURNAL)
    if not os.path.lexists(os.path.dirname(path)):
        raise errors.UsageError("no run {} under {}".format(run_id, os.path.join(state_root, "runs")))
    return Journal.load(path)
