# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run journal: ``<state-root>/runs/<run-id>/journal.json``, its records and its steps.

The journal is one JSON object, rewritten whole by a durable replace on every change, so a
reader sees the previous version or the next one, never a torn file. Its records are the
dataclasses below (``Run``, ``ModuleEntry``, ``Step``), loaded and validated here, in one
place (``records.load``: every field's presence and type, the shape of paths and times);
nothing else reads a journal's keys.

``schema``
    2: a directory swap; 4: a directory swap whose run also appends ledger records.
    1 and 3 were generation-pointer journals (the live path a symlink to a generation);
    this version never swaps symlinks and refuses them rather than guess.
``kind``
    ``publish`` (a rebuild) or ``retire`` (a module file moved out of the way).
``created``, ``updated``, ``state_since``
    UTC times (ISO 8601 with offset); ``state_since`` is when ``state`` last changed (gc's
    grace period counts from it).
``state``
    Where the run is (``RunState``); ``INTERRUPTED`` lists those that resume must finish.
``modules``
    One ``ModuleEntry`` per module, in publish order: its paths, the module file and its
    backup, the SHA-256 of the old and new module file, and the inodes of live and stage
    taken before the swap (they let resume tell, from the disk itself, whether a swap
    happened).
``steps``
    Each operation, a ``Step`` appended with status ``started`` BEFORE it runs and marked
    ``done`` after: a crash leaves the operation it interrupted at the end of the list.
    A step's name is its kind (``StepKind``, a closed set), then the module class and the
    module it acts on where it has them: ``class-link <class> <Name/version>``; a step that
    reverses another is ``undo <that step>``.

Every step runs through one engine, ``Journal.step`` (or ``begin``/``done`` where a step
ends when the next one starts): it counts the operation for the fault injection
(``faults.Faults``), journals it as started, runs it, counts the point between the
operation and its journal write, and journals it done. ``EB_STAGED_REBUILD_CRASH_AT=<step>``
is a test-only hook: the process kills itself with SIGKILL right after recording that step
as started, which is how the crash tests stop the tool at every journaled step.

The recovery rule, beside the code: a run in an ``INTERRUPTED`` state is finished or
reversed by ``resume`` from the disk itself (the inodes above, the module file's hash, the
fallback's hold name), never from the journal's word alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import json
import os
import signal
import stat
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Tuple

from ..common import errors
from ..common.errors import setting
from . import fsutil, paths, records, settings
from .backends import BACKENDS
from .faults import Faults
from .records import AbsPath, Sha256, Timestamp
from .request import RebuildRequest
from .slurmjob import JOB_ID

SCHEMA_SWAP = 2
SCHEMA_SWAP_LEDGER = 4
SUPPORTED_SCHEMAS = (SCHEMA_SWAP, SCHEMA_SWAP_LEDGER)
_REFUSED_SCHEMAS = {
    1: "schema 1 is a generation-pointer journal (live path as a symlink to a generation)",
    3: "schema 3 is a generation-pointer journal with a ledger",
}
JOURNAL = "journal.json"
# The hidden name a run directory has while its first journal is written (``Journal.create``).
CREATING = ".creating-"
CRASH_HOOK = "EB_STAGED_REBUILD_CRASH_AT"
# A journal nests four levels (run, modules, entry, class links); anything far deeper is
# not one, and is refused before the typed load walks it.
MAX_DEPTH = 8
# The largest journal read: thousands of modules fit; a file beyond it is not a journal.
MAX_BYTES = 64 * 1024 * 1024

now = records.now


class RunKind(enum.Enum):
    PUBLISH = "publish"
    RETIRE = "retire"


class RunState(enum.Enum):
    BUILDING = "building"
    PLANNING = "planning"
    PUBLISHING = "publishing"
    PUBLISHED = "published"
    FAILED = "failed"  # reversed after an error
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    RETIRING = "retiring"
    RETIRED = "retired"
    # A run made for a batch job, waiting for it to start (``rebuild.queue``).
    QUEUED = "queued"
    # Built and planned, its stage beside the live tree, waiting to be published together
    # with other runs (``staged.publish_staged``) or discarded.
    STAGED = "staged"


# States in which a run holds work that resume must finish or reverse. A queued run waits
# for its job and a staged one for ``publish`` or ``discard``: neither is interrupted.
INTERRUPTED = frozenset(
    {RunState.BUILDING, RunState.PLANNING, RunState.PUBLISHING, RunState.ROLLING_BACK, RunState.RETIRING}
)


class StepStatus(enum.Enum):
    STARTED = "started"
    DONE = "done"


class StepKind(enum.Enum):
    """Every operation a run journals; the value is how a step's name begins."""

    BUILD = "build"
    RELOCATE = "relocate"
    MARKER = "marker"
    PREPARE_MODULE = "prepare-module"
    BACKUP = "backup"
    STAGE_MOVE = "stage-move"
    PREPARE_PROGRAM = "prepare-program"
    SWAP = "swap"
    # The three renames of the exchange's fallback (``swap.FALLBACK_STEPS``).
    FALLBACK_LIVE_TO_HOLD = "fallback-1-live-to-hold"
    FALLBACK_STAGED_TO_LIVE = "fallback-2-staged-to-live"
    FALLBACK_HOLD_TO_STAGED = "fallback-3-hold-to-staged"
    MODULE = "module"
    CLASS_LINK = "class-link"
    LEDGER = "ledger"
    ROLLBACK_CLASS_LINK = "rollback class-link"
    ROLLBACK_MODULE = "rollback module"
    ROLLBACK_SWAP = "rollback swap"
    RESUME_RECOVER_FALLBACK = "resume recover-fallback"
    RESUME_CLASS_LINK = "resume class-link"
    RESUME_MODULE = "resume module"
    RESUME_SWAP = "resume swap"

    @property
    def has_module(self) -> bool:
        return self not in _RUN_WIDE

    @property
    def has_class(self) -> bool:
        return self in _WITH_CLASS


_RUN_WIDE = frozenset({StepKind.BUILD, StepKind.RELOCATE, StepKind.PREPARE_PROGRAM, StepKind.LEDGER})
_WITH_CLASS = frozenset({StepKind.CLASS_LINK, StepKind.ROLLBACK_CLASS_LINK, StepKind.RESUME_CLASS_LINK})
# Longest first: "rollback class-link" must not be read as a kind "rollback ..." it is not.
_KINDS_BY_LENGTH = sorted(StepKind, key=lambda kind: len(kind.value), reverse=True)
_UNDO = "undo "


@dataclasses.dataclass(frozen=True)
class StepName:
    """What a step does and to what: ``swap TinyApp/1.0``, ``undo module TinyApp/1.0``."""

    kind: StepKind
    module: Optional[str] = None
    module_class: Optional[str] = None
    undo: bool = False

    def __str__(self) -> str:
        words = [_UNDO.strip()] if self.undo else []
        words.append(self.kind.value)
        words.extend(word for word in (self.module_class, self.module) if word is not None)
        return " ".join(words)

    def undone(self) -> StepName:
        return dataclasses.replace(self, undo=True)

    def to_json(self) -> str:
        return str(self)

    @classmethod
    def from_json(cls, value: Any, where: str) -> StepName:
        if not isinstance(value, str):
            raise records.wrong_type(where, "a string", value)
        undo = value.startswith(_UNDO)
        words = (value[len(_UNDO) :] if undo else value).split(" ")
        for kind in _KINDS_BY_LENGTH:
            prefix = kind.value.split(" ")
            if words[: len(prefix)] == prefix:
                break
        else:
            raise records.RecordError(f"{where} is {value!r}, not a step this version knows")
        words = words[len(prefix) :]
        expected = int(kind.has_class) + int(kind.has_module)
        if len(words) != expected:
            raise records.RecordError(
                f"{where} is {value!r}: a {kind.value} step names {expected} more words"
            )
        module_class = words.pop(0) if kind.has_class else None
        module = words.pop(0) if kind.has_module else None
        if module is not None:
            try:
                paths.parse_module_name(module)
            except errors.UsageError:
                raise records.RecordError(f"{where} is {value!r}: {module!r} is not NAME/VERSION") from None
        return cls(kind, module, module_class, undo)


@dataclasses.dataclass
class Step:
    step: StepName
    status: StepStatus
    at: Timestamp
    # The ledger's length before a ledger step appended to it: resume cuts back to it.
    ledger_length: Optional[int] = None


@dataclasses.dataclass
class ModuleEntry:
    """One module of a publish run; the fields after ``module_file`` are filled as it goes."""

    module: str
    name: str
    version: str
    stable_path: AbsPath
    # The staged sibling before the swap, the old tree after it.
    retired_path: AbsPath
    module_file: AbsPath
    # The SHA-256 of every live file before the build (None: --skip-live-check).
    live_record: Optional[AbsPath] = None
    prepared_module: Optional[AbsPath] = None
    new_module_sha256: Optional[Sha256] = None
    class_links: List[str] = dataclasses.field(default_factory=list)
    # None: there was no module file before this run.
    module_backup: Optional[AbsPath] = None
    old_module_sha256: Optional[Sha256] = None
    stage_ino: Optional[int] = None
    live_ino: Optional[int] = None
    # Each module-class link's target before the publish changed it (None: there was none).
    class_link_previous: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, module_paths: paths.ModulePaths) -> ModuleEntry:
        return cls(
            module=module_paths.module,
            name=module_paths.name,
            version=module_paths.version,
            stable_path=AbsPath(module_paths.stable_path),
            retired_path=AbsPath(module_paths.retired_path),
            module_file=AbsPath(module_paths.module_file()),
        )

    # Where a run keeps this module's files in its run directory (relative to it): the
    # planner writes them there, and a loaded journal that names any other place is
    # refused (``check_paths``).
    def live_record_name(self) -> str:
        return os.path.join("live", self.name, self.version + ".json")

    # By the module's directory under modules/all, which is ``Name`` in the flat scheme.
    def prepared_module_name(self) -> str:
        return os.path.join("prepared", os.path.dirname(self.module), os.path.basename(self.module_file))

    def module_backup_name(self) -> str:
        return os.path.join("backup", os.path.dirname(self.module), os.path.basename(self.module_file))

    def check_paths(self, where: str, trees: paths.Trees, run_id: str, run_dir: str, state_root: str) -> None:
        """Every path of the entry is where this run put it, with no link on the way there."""
        expected = paths.ModulePaths(trees, self.module, self.install_subdir, run_id)
        _require_equal(
            f"{where}.stable_path", self.stable_path, expected.stable_path, "<software>", trees.software
        )
        _require_equal(
            f"{where}.retired_path", self.retired_path, expected.retired_path, "<software>", trees.software
        )
        names = expected.module_file_names()
        if self.module_file not in names:
            raise records.RecordError(
                f"{where}.module_file {self.module_file} is not "
                + " or ".join(_shown(name, "<modules>", trees.modules) for name in names)
            )
        _require_no_link(f"{where}.stable_path", self.stable_path, trees.software)
        _require_no_link(f"{where}.retired_path", self.retired_path, trees.software)
        _require_no_link(f"{where}.module_file", self.module_file, trees.modules)
        for field, place in (
            ("live_record", os.path.join(run_dir, self.live_record_name())),
            ("prepared_module", os.path.join(run_dir, self.prepared_module_name())),
            ("module_backup", os.path.join(run_dir, self.module_backup_name())),
        ):
            value = getattr(self, field)
            if value is not None:
                _require_equal(f"{where}.{field}", value, place, "<run>", run_dir)
                _require_no_link(f"{where}.{field}", value, state_root)
        for index, module_class in enumerate(self.class_links):
            _require_class(f"{where}.class_links[{index}]", module_class)
        for module_class in self.class_link_previous:
            _require_class(f"{where}.class_link_previous", module_class)

    @property
    def install_subdir(self) -> str:
        """``<Name>/<dir>`` of the install under the software root (``paths.ModulePaths``)."""
        return f"{self.name}/{self.version}"

    def check(self, where: str) -> None:
        try:
            paths.parse_module_name(self.module)
        except errors.UsageError:
            raise records.RecordError(f"{where}.module {self.module!r} is not NAME/VERSION") from None
        try:
            paths.parse_module(self.install_subdir)
        except errors.UsageError:
            raise records.RecordError(
                f"{where}.name and .version {self.install_subdir!r} are not an install's NAME/VERSION"
            ) from None
        # The flat scheme names the module as its install; a hierarchy by the install's Name.
        if self.module.count("/") == 1 and self.module != self.install_subdir:
            raise records.RecordError(f"{where}.module {self.module!r} is not its name/version")
        if self.module.split("/")[-2] != self.name:
            raise records.RecordError(f"{where}.module {self.module!r} is not a module of {self.name}")


@dataclasses.dataclass
class JobRecord:
    """The batch job of a run: recorded when the run is queued (``submitted``), when the
    scheduler answers (``job_id``: digits), and when the job starts on its ``node``."""

    submitted: Timestamp
    job_id: Optional[str] = None
    # The site's name of the CPU target the job builds for (a plain name), if any.
    target: Optional[str] = None
    node: Optional[str] = None
    started: Optional[Timestamp] = None

    def check(self, where: str) -> None:
        if self.job_id is not None and not JOB_ID.match(self.job_id):
            raise records.RecordError(f"{where}.job_id {self.job_id!r} is not a job id (digits)")
        for field in ("target", "node"):
            value = getattr(self, field)
            if value is not None and not paths.is_plain_name(value):
                raise records.RecordError(f"{where}.{field} {value!r} is not a plain name")


def failure_reason(err: BaseException) -> str:
    """The one line a run that ended ``failed`` because of ``err`` records as its ``error``:
    the message the command line showed (``errors.message``, a setting spelt as its flag), its
    whitespace folded, so that a report gives each run one line."""
    return " ".join(errors.message(err, settings.flag).split())


@dataclasses.dataclass
class Run:
    """One run: a publish (a rebuild) or a retire. The last two groups belong to one kind each."""

    schema: int
    kind: RunKind
    run_id: str
    state: RunState
    created: Timestamp
    updated: Timestamp
    modules: List[ModuleEntry]
    steps: List[Step]
    state_since: Optional[Timestamp] = None
    # publish
    trees: Optional[paths.Trees] = None
    request: Optional[RebuildRequest] = None
    backend: Optional[str] = None
    relocated_files: Optional[int] = None
    refused: Optional[bool] = None
    resumed: Optional[Timestamp] = None
    # A run made for a batch job: the job (``JobRecord``).
    job: Optional[JobRecord] = None
    # A failed run: the one line it failed with (``failure_reason``), and whether it ended
    # because the process was told to stop (SIGTERM: scancel, systemd).
    error: Optional[str] = None
    cancelled: Optional[bool] = None
    # retire
    module_file: Optional[AbsPath] = None
    retired_to: Optional[AbsPath] = None
    module_sha256: Optional[Sha256] = None
    software_dir: Optional[AbsPath] = None
    reason: Optional[str] = None
    retired_at: Optional[Timestamp] = None

    @property
    def changed_since(self) -> Timestamp:
        """When the state last changed (gc's grace period counts from it)."""
        return self.state_since or self.created

    def check(self) -> None:
        if self.schema not in SUPPORTED_SCHEMAS:
            raise records.RecordError(_schema_problem(self.schema))
        try:
            paths.check_run_id(self.run_id)
        except errors.UsageError as err:
            raise records.RecordError(f"run_id: {err}") from None
        for name in _PUBLISH_FIELDS if self.kind is RunKind.PUBLISH else _RETIRE_FIELDS:
            if getattr(self, name) is None:
                raise records.RecordError(f"{name} is missing (a {self.kind.value} run has it)")
        invariant = STATE_INVARIANTS.get((self.kind, self.state))
        if invariant is None:
            raise records.RecordError(f"state {self.state.value!r} is not a state of a {self.kind.value} run")
        if self.kind is RunKind.RETIRE and self.job is not None:
            raise records.RecordError("job is set, but a retire run has no batch job")
        if self.job is not None:
            self.job.check("job")
        self._check_backends()
        for index, entry in enumerate(self.modules):
            entry.check(f"modules[{index}]")
        invariant.check(self)
        modules = {entry.module for entry in self.modules}
        for index, step in enumerate(self.steps):
            if step.step.module is not None and step.step.module not in modules:
                raise records.RecordError(
                    f"steps[{index}] acts on {step.step.module}, which the run does not have"
                )

    def _check_backends(self) -> None:
        """The backend a run built with is one that exists (a name shown and, in the request,
        chosen again by resume): a closed set, so no text but these names reaches the output."""
        if self.backend is not None and self.backend not in BUILT_WITH:
            raise records.RecordError(f"backend {self.backend!r} is not one of {', '.join(BUILT_WITH)}")
        if self.request is not None and self.request.backend not in BACKENDS:
            raise records.RecordError(
                f"request.backend {self.request.backend!r} is not one of {', '.join(BACKENDS)}"
            )

    def record_failure(self, err: BaseException) -> None:
        """Keep why the run is about to end ``failed`` (saved with that state)."""
        self.error = failure_reason(err)
        if isinstance(err, errors.Terminated):
            self.cancelled = True

    def check_paths(self, state_root: str) -> None:
        """Refuse a run whose paths are not where this state root's runs put them.

        A journal edited by hand could otherwise make rollback, resume or gc move or delete
        whatever it names. A publish run's paths follow from its trees, its module names and
        its run id (``paths.ModulePaths``, the run directory); a retire's file is kept where
        ``paths.retired_module_path`` says and came from a module tree
        (``paths.software_root_of``). No component below the tree (or the state root) that
        a path lies in may be a symbolic link. Whether the trees are the ones the command
        was given is ``check_trees``'s question.
        """
        run_dir = os.path.join(state_root, "runs", self.run_id)
        if self.kind is RunKind.RETIRE:
            self._check_retire_paths(state_root)
            return
        if self.trees is None or self.request is None:  # refused by ``check`` already
            return
        if self.request.trees != self.trees:
            raise records.RecordError(
                f"trees ({self.trees.software}, {self.trees.modules}) are not the request's "
                f"({self.request.software}, {self.request.modules})"
            )
        planned = "module_backup" in STATE_INVARIANTS[(self.kind, self.state)].entry_fields
        for index, entry in enumerate(self.modules):
            entry.check_paths(f"modules[{index}]", self.trees, self.run_id, run_dir, state_root)
            backup = os.path.join(run_dir, entry.module_backup_name())
            # Both fields null says "no module file before"; the backup planning wrote says otherwise.
            if planned and entry.module_backup is None and os.path.lexists(backup):
                raise records.RecordError(
                    f"modules[{index}].module_backup is missing, but the run's backup {backup} exists"
                )
        for index, step in enumerate(self.steps):
            if step.step.module_class is not None:
                _require_class(f"steps[{index}]", step.step.module_class)

    def _check_retire_paths(self, state_root: str) -> None:
        module_file, retired_to, software_dir = self.module_file, self.retired_to, self.software_dir
        if module_file is None or retired_to is None or software_dir is None:  # refused by ``check``
            return
        if not self.run_id.startswith(paths.RETIRE_RUN_PREFIX):
            raise records.RecordError(f"run_id {self.run_id!r} of a retire run does not begin with 'retire-'")
        place = paths.retired_module_path(state_root, self.run_id, module_file)
        if retired_to != place:
            raise records.RecordError(
                f"retired_to {retired_to} is not where run {self.run_id} keeps {module_file} ({place})"
            )
        try:
            software_root = paths.software_root_of(module_file)
        except errors.UsageError:
            raise records.RecordError(
                f"module_file {module_file} is not in a module tree <installpath>/modules/all/<Name>/"
            ) from None
        normal = os.path.normpath(software_dir)
        if not paths.is_inside(normal, software_root) or normal == software_root:
            raise records.RecordError(
                f"software_dir {software_dir} is not under {software_root}, "
                f"the software root of {module_file}"
            )
        modules_root = os.path.dirname(os.path.dirname(os.path.dirname(module_file)))
        _require_no_link("module_file", module_file, modules_root)
        _require_no_link("retired_to", retired_to, state_root)

    def check_trees(self, trees: Optional[paths.Trees]) -> None:
        """Refuse a run of other trees than ``trees``, the ones the command was given or
        configured (None: none was, and the journal's own trees are used)."""
        if trees is None:
            return
        if self.kind is RunKind.PUBLISH and self.trees != trees:
            shown = self.trees or paths.Trees(AbsPath("/"), AbsPath("/"))
            raise records.RecordError(
                f"trees.software {shown.software} and trees.modules {shown.modules} are not the trees "
                f"given ({trees.software}, {trees.modules})"
            )
        module_file = self.module_file
        if self.kind is RunKind.RETIRE and module_file and not paths.is_inside(module_file, trees.modules):
            raise records.RecordError(
                f"module_file {module_file} is not under the module tree given ({trees.modules})"
            )


def _shown(path: str, label: str, root: str) -> str:
    return label + path[len(root) :] if paths.is_inside(path, root) else path


def _require_equal(where: str, value: str, expected: str, label: str, root: str) -> None:
    if value != expected:
        raise records.RecordError(f"{where} {value} is not {_shown(expected, label, root)}")


def _require_no_link(where: str, path: str, root: str) -> None:
    try:
        fsutil.refuse_symlink_components(path, stop_at=root)
    except errors.UsageError as err:
        raise records.RecordError(f"{where}: {err}") from None


def _require_class(where: str, module_class: str) -> None:
    # A class is one directory beside ``all``; ``all`` itself would name the module file.
    if not paths.is_plain_name(module_class) or module_class == "all":
        raise records.RecordError(
            f"{where}: {module_class!r} is not a module class (a plain name, not 'all')"
        )


# What every run of a kind has, in every state: written when the run is created. A publish
# run's ``backend`` is chosen when it starts to build (``Invariant.run_fields``).
_PUBLISH_FIELDS = ("trees", "request")
_RETIRE_FIELDS = ("module_file", "retired_to", "module_sha256", "software_dir", "reason", "retired_at")
# The backends a run is built with (``backends.select``'s answers; the request may say auto).
BUILT_WITH = tuple(name for name in BACKENDS if name != "auto")


@dataclasses.dataclass(frozen=True)
class Invariant:
    """What a run in one state always has, beyond its kind's fields: at least ``modules``
    module entries, and in each entry the ``entry_fields`` (each but where ``EXCEPT_WHEN``
    says it may be null). ``check`` refuses a run that lacks one, naming the field."""

    modules: int = 0
    entry_fields: Tuple[str, ...] = ()
    run_fields: Tuple[str, ...] = ()

    def check(self, run: Run) -> None:
        state = f"a {run.kind.value} run in state {run.state.value}"
        for name in self.run_fields:
            if getattr(run, name) is None:
                raise records.RecordError(f"{name} is missing ({state} has it)")
        if len(run.modules) < self.modules:
            raise records.RecordError(f"modules is empty ({state} has at least one module)")
        for index, entry in enumerate(run.modules):
            for name in self.entry_fields:
                if getattr(entry, name) is not None:
                    continue
                excuse, excused = EXCEPT_WHEN.get(name, ("", None))
                if excused is not None and excused(run, entry):
                    continue
                unless = f" unless {excuse}" if excuse else ""
                raise records.RecordError(f"modules[{index}].{name} is missing ({state} has it{unless})")


# The fields planning writes into each module entry before any swap (``planner.plan``): the
# prepared module file and its hash, the old module file's backup and hash, and the inodes of
# the stage and of the live tree, by which resume, rollback and gc tell the trees apart.
PLANNED = (
    "live_record",
    "prepared_module",
    "new_module_sha256",
    "module_backup",
    "old_module_sha256",
    "stage_ino",
    "live_ino",
)
# When an entry may lack one of those fields, and the words that say so.
EXCEPT_WHEN: Dict[str, Tuple[str, Callable[[Run, ModuleEntry], bool]]] = {
    "live_record": (
        "its request skipped the live-change check",
        lambda run, entry: bool(run.request and run.request.skip_live_check),
    ),
    # Both null: there was no module file before the run.
    "module_backup": ("old_module_sha256 is null too", lambda run, entry: entry.old_module_sha256 is None),
    "old_module_sha256": ("module_backup is null too", lambda run, entry: entry.module_backup is None),
}
_BUILT = ("backend",)
_PUBLISHED = Invariant(modules=1, entry_fields=PLANNED, run_fields=_BUILT)
# Each state a run of each kind can be in, and what it always has there. A state missing
# from the table is no state of that kind.
STATE_INVARIANTS: Dict[Tuple[RunKind, RunState], Invariant] = {
    # Made on the submit host for a batch job: no backend (the job's node picks it), no modules.
    (RunKind.PUBLISH, RunState.QUEUED): Invariant(run_fields=("job",)),
    # Created without modules; its entries saved with their live-change records in one write.
    (RunKind.PUBLISH, RunState.BUILDING): Invariant(entry_fields=("live_record",), run_fields=_BUILT),
    # Planning fills each entry in turn: a crash leaves some entries planned, some not.
    (RunKind.PUBLISH, RunState.PLANNING): Invariant(
        modules=1, entry_fields=("live_record",), run_fields=_BUILT
    ),
    # Planned, as a run about to publish is, and stopped there.
    (RunKind.PUBLISH, RunState.STAGED): _PUBLISHED,
    (RunKind.PUBLISH, RunState.PUBLISHING): _PUBLISHED,
    (RunKind.PUBLISH, RunState.PUBLISHED): _PUBLISHED,
    (RunKind.PUBLISH, RunState.ROLLING_BACK): _PUBLISHED,
    (RunKind.PUBLISH, RunState.ROLLED_BACK): _PUBLISHED,
    # Refused or reversed wherever it was: queued, building, planning, staged or publishing
    # (a queued run ended failed before it built has no backend).
    (RunKind.PUBLISH, RunState.FAILED): Invariant(),
    (RunKind.RETIRE, RunState.RETIRING): Invariant(),
    (RunKind.RETIRE, RunState.RETIRED): Invariant(),
    (RunKind.RETIRE, RunState.ROLLED_BACK): Invariant(),
}


def _schema_problem(schema: Any) -> str:
    # JSON true is an int that equals 1, and a list is unhashable: only a real int counts.
    known = isinstance(schema, int) and not isinstance(schema, bool)
    if known and schema in _REFUSED_SCHEMAS:
        return f"{_REFUSED_SCHEMAS[schema]}; this version only swaps directories (schemas 2 and 4)"
    return f"unknown schema {schema!r} (known: 2, 4)"


def _refuse_duplicates(pairs: List[Any]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise records.RecordError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _refuse_constant(name: str) -> None:
    raise records.RecordError(f"{name} is not a JSON number")


def parse(raw: bytes) -> Run:
    """The run a journal file's bytes hold; raises RecordError saying what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise records.RecordError(f"not UTF-8 ({len(raw)} bytes)") from None
    try:
        document = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except RecursionError:
        raise records.RecordError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        if isinstance(err, records.RecordError):
            raise
        raise records.RecordError(f"truncated or not JSON ({len(raw)} bytes)") from None
    if not isinstance(document, dict) or "schema" not in document:
        raise records.RecordError("no schema field")
    if document["schema"] not in SUPPORTED_SCHEMAS or isinstance(document["schema"], bool):
        raise records.RecordError(_schema_problem(document["schema"]))
    if records.depth(document) > MAX_DEPTH:
        raise records.RecordError(f"nested deeper than {MAX_DEPTH} levels")
    run = records.load(Run, document)
    run.check()
    return run


class StepHandle:
    """A step journaled as started; ``done()`` records it done (after its fault point)."""

    def __init__(self, journal: Journal, entry: Step) -> None:
        self.journal = journal
        self.entry = entry

    def done(self) -> None:
        if not self.entry.step.undo:
            self.journal.faults.before("journal " + str(self.entry.step))
        self.entry.status = StepStatus.DONE
        self.journal.save()


class Journal:
    """One run's journal; every change is written through before the caller goes on."""

    def __init__(self, path: str, run: Run, faults: Optional[Faults] = None) -> None:
        self.path = path
        self.run = run
        self.faults = faults if faults is not None else Faults()

    @property
    def run_dir(self) -> str:
        return os.path.dirname(self.path)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def state(self) -> RunState:
        return self.run.state

    @property
    def modules(self) -> List[ModuleEntry]:
        return self.run.modules

    @property
    def trees(self) -> paths.Trees:
        """The live trees of a publish run (``Run.check`` refused a publish run without them)."""
        if self.run.trees is None:
            raise errors.JournalError(f"journal {self.path}: a {self.run.kind.value} run has no trees")
        return self.run.trees

    @property
    def request(self) -> RebuildRequest:
        """The request of a publish run (``Run.check`` refused a publish run without one)."""
        if self.run.request is None:
            raise errors.JournalError(f"journal {self.path}: a {self.run.kind.value} run has no request")
        return self.run.request

    @classmethod
    def create(cls, runs_dir: str, run_id: str, kind: RunKind, state: RunState, **fields: Any) -> Journal:
        """Create ``runs_dir/run_id/`` together with its first journal; refuse an existing run id.

        The directory is made under a hidden, unpredictable name (``.creating-<random>``, mode
        0700), the journal written and fsynced in it, and only then renamed to the run id and
        ``runs_dir`` fsynced: a crash or a full disk leaves no run directory without a journal,
        only a hidden leftover that ``run_journals`` skips. ``os.rename`` onto a non-empty
        directory fails (ENOTEMPTY/EEXIST); onto an empty one it would succeed, so an existing
        name is refused before, under the lock every creator holds.

        Every step is made through the descriptor of ``runs_dir``, opened from the state root
        without following a link (``fsutil.Directory``): a ``runs`` swapped for a link cannot
        take the run into another tree.
        """
        with fsutil.Directory.open(runs_dir, os.path.dirname(runs_dir)) as runs:
            return cls._create_in(runs, run_id, kind, state, fields)

    @classmethod
    def _create_in(
        cls, runs: fsutil.Directory, run_id: str, kind: RunKind, state: RunState, fields: Dict[str, Any]
    ) -> Journal:
        run_dir = runs.join(run_id)
        if runs.lstat(run_id) is not None:
            raise _exists_already(run_id, run_dir)
        stamp = now()
        request = fields.get("request")
        schema = SCHEMA_SWAP_LEDGER if request is not None and request.ledger_config else SCHEMA_SWAP
        run = Run(
            schema=schema,
            kind=kind,
            run_id=run_id,
            state=state,
            created=stamp,
            updated=stamp,
            state_since=stamp,
            modules=[],
            steps=[],
            **fields,
        )
        temp = CREATING + os.urandom(8).hex()  # an unpredictable name; mkdir fails on a planted one
        try:
            runs.mkdir(temp, 0o700)
            journal = cls(os.path.join(runs.join(temp), JOURNAL), run)
            journal.save()
            runs.rename(temp, runs, run_id)
        except BaseException as err:
            with contextlib.suppress(OSError):
                runs.remove_tree(temp)
            if isinstance(err, OSError) and err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise _exists_already(run_id, run_dir) from None
            if isinstance(err, OSError):
                raise errors.JournalError(
                    f"cannot write the first journal of run {run_id} in {runs.path}: {err.strerror}; "
                    "no run was created"
                ) from None
            raise
        journal.path = os.path.join(run_dir, JOURNAL)
        runs.sync()
        return journal

    @classmethod
    def load(cls, path: str) -> Journal:
        """The journal at ``path``; anything that is not a journal of this version is refused."""
        try:
            fd = fsutil.open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
        except errors.UsageError:  # open_nofollow's refusal of a link, which is not followed
            raise errors.JournalError(f"journal {path}: a symbolic link; refusing to follow it") from None
        except OSError as err:
            raise errors.JournalError(f"journal {path}: cannot read it: {err.strerror}") from None
        # Checked on the descriptor before a file object is made of it: io refuses a directory
        # with an OSError of its own, which would escape as no journal refusal.
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise errors.JournalError(f"journal {path}: not a regular file")
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        try:
            if len(raw) > MAX_BYTES:
                raise records.RecordError(f"larger than {MAX_BYTES} bytes")
            run = parse(raw)
            if _in_runs_dir(path):
                if run.run_id != os.path.basename(os.path.dirname(path)):
                    raise records.RecordError(f"run_id {run.run_id!r} is not its directory's name")
                run.check_paths(os.path.abspath(os.path.dirname(os.path.dirname(os.path.dirname(path)))))
        except records.RecordError as err:
            raise errors.JournalError(f"journal {path}: {err}") from None
        return cls(path, run)

    def check_trees(self, trees: Optional[paths.Trees]) -> None:
        """Refuse, in one line, a run of other trees than the ones the command was given."""
        try:
            self.run.check_trees(trees)
        except records.RecordError as err:
            raise errors.JournalError(f"journal {self.path}: {err}") from None

    @property
    def state_root(self) -> str:
        """``<state-root>`` of ``<state-root>/runs/<run-id>/journal.json``."""
        return os.path.dirname(os.path.dirname(self.run_dir))

    def write_file(self, relative: str, data: bytes) -> str:
        """Write ``data`` durably to ``<run-dir>/<relative>`` (a record of the run: the
        live-change record, a prepared module file, a backup) and return its path; the
        directories are opened, or made, from the state root without following a link."""
        path = os.path.join(self.run_dir, relative)
        fsutil.makedirs(os.path.dirname(path), root=self.state_root, mode=0o755)
        fsutil.atomic_write(path, data, root=self.state_root)
        return path

    def save(self) -> None:
        self.run.updated = now()
        data = json.dumps(records.dump(self.run), sort_keys=True).encode("utf-8")
        # runs/ and runs/<run-id> are opened from the state root without following a link.
        fsutil.atomic_write(self.path, data, root=self.state_root)

    def set_state(self, state: RunState) -> None:
        self.run.state = state
        # gc's grace clock starts when the run last changed state, not at any later save.
        self.run.state_since = now()
        self.save()

    def begin(self, name: StepName, **fields: Any) -> StepHandle:
        """Count ``name`` for the fault injection, then record it as started (durably)."""
        text = str(name)
        # A reversal's steps are no fault points: the reversal is what a fault tests.
        if not name.undo:
            self.faults.before(text)
        entry = Step(step=name, status=StepStatus.STARTED, at=now(), **fields)
        self.run.steps.append(entry)
        self.save()
        if os.environ.get(CRASH_HOOK) == text:
            os.kill(os.getpid(), signal.SIGKILL)
        return StepHandle(self, entry)

    def step(
        self,
        kind: StepKind,
        entry: Optional[ModuleEntry] = None,
        module_class: Optional[str] = None,
        **fields: Any,
    ) -> ContextManager[StepHandle]:
        """``with journal.step(kind, entry):`` the block is one journaled step of ``entry``'s module.

        Recorded as started before the block runs and done after it returns; a block that
        raises leaves the step ``started``, the mark of the operation a failure interrupted.
        """
        return self.step_named(step_name(kind, entry, module_class), **fields)

    @contextlib.contextmanager
    def step_named(self, name: StepName, **fields: Any) -> Iterator[StepHandle]:
        handle = self.begin(name, **fields)
        yield handle
        handle.done()

    def step_names(self) -> List[str]:
        return [str(entry.step) for entry in self.run.steps]

    def steps_of(self, kind: StepKind) -> List[Step]:
        return [entry for entry in self.run.steps if entry.step.kind is kind and not entry.step.undo]


def step_name(
    kind: StepKind, entry: Optional[ModuleEntry] = None, module_class: Optional[str] = None
) -> StepName:
    return StepName(kind, entry.module if entry is not None else None, module_class)


def _in_runs_dir(path: str) -> bool:
    return os.path.basename(os.path.dirname(os.path.dirname(path))) == "runs"


def _exists_already(run_id: str, run_dir: str) -> errors.UsageError:
    return errors.UsageError(f"run {run_id} exists already ({run_dir}); pick another {setting('run_id')}")


def _runs_entries(state_root: str) -> Tuple[List[str], List[Dict[str, Any]]]:
    """What ``state_root/runs`` holds: the run directories (real directories named as a run
    id), and every other entry with what it is and what to do about it (``unlisted``).

    Nothing is followed or skipped without a word: a partial list never hides a run. A link
    named as a run is no run directory (a journal is never read through one), a
    ``.creating-*`` directory is a creation that was interrupted (or is under way), and
    anything else is nothing this tool wrote; each is listed beside the runs.
    """
    runs_dir = os.path.join(state_root, "runs")
    try:
        names = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return [], []
    found: List[str] = []
    others: List[Dict[str, Any]] = []
    for name in names:
        path = os.path.join(runs_dir, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # removed since it was listed: a run being created is renamed, not removed
        is_run_id = paths.RUN_ID.match(name) is not None
        if is_run_id and stat.S_ISDIR(mode):
            found.append(path)
        elif name.startswith(CREATING) and stat.S_ISDIR(mode):
            others.append(_unlisted(path, None, "leftover", _LEFTOVER))
        else:
            others.append(
                _unlisted(path, name if is_run_id else None, "unreadable", _not_a_run(mode, is_run_id))
            )
    return found, others


def _run_dirs(state_root: str) -> List[str]:
    return _runs_entries(state_root)[0]


def _unlisted(path: str, run_id: Optional[str], kind: str, why: str) -> Dict[str, Any]:
    return {"path": path, "run_id": run_id, "kind": kind, "why": why}


_NO_JOURNAL = (
    "a run directory without a journal (left by a crash or a full disk while an earlier release created it)"
)
_LEFTOVER = (
    "what a run's creation left when it was interrupted (its journal is written there, then the "
    "directory renamed to the run id): it never became a run and nothing of it was built or "
    "published; once no rebuild or retire is running, remove it by hand"
)


def _not_a_run(mode: int, is_run_id: bool) -> str:
    """Why an entry of ``runs/`` that is neither a run directory nor a creation's leftover is
    not read, and what to do."""
    if stat.S_ISLNK(mode):
        return (
            "a symbolic link where a run directory should be: a journal is never read through a "
            "link, so no run of it is listed or resumed; see where it points (a run moved away "
            "goes back as a directory of its own), then remove the link by hand"
        )
    if not stat.S_ISDIR(mode):
        return "not a directory, so no run: nothing of this tool writes one there; remove it by hand"
    return (
        "a directory whose name is no run id (letters, digits, '.', '_' and '-', starting "
        "with a letter or digit), so no run of this tool: remove it by hand"
    )


def incomplete(state_root: str) -> List[Dict[str, Any]]:
    """Every entry of ``runs/`` that is not a run with a journal, each with its ``path``, its
    ``run_id`` (None for a name that is none), its ``kind`` and ``why``: reported by status
    and gc (a warning each), never loaded, never removed by the tool.

    ``kind`` is ``incomplete`` for a run directory without one (this release creates a run
    directory together with its journal, ``Journal.create``; an earlier one made the
    directory first, so a crash or ENOSPC between the two left it empty: nothing in it was
    published), ``leftover`` for a ``.creating-*`` directory and ``unreadable`` for anything
    else (a link named as a run, a file); remove each by hand.
    """
    run_dirs, others = _runs_entries(state_root)
    journal_less = [
        _unlisted(run_dir, os.path.basename(run_dir), "incomplete", _NO_JOURNAL + "; remove it by hand")
        for run_dir in run_dirs
        if not os.path.lexists(os.path.join(run_dir, JOURNAL))
    ]
    return sorted(journal_less + others, key=lambda entry: entry["path"])


def run_journals(state_root: str) -> List[Journal]:
    """Every journal under ``state_root/runs``, oldest run first; one bad journal stops it.

    A partial list would hide the broken run, so a journal that does not load raises. What
    is not a run with a journal is not loaded: ``incomplete`` reports each (a run directory
    without a journal, a creation's leftover, a link or a file where a run should be).
    """
    journals = [
        Journal.load(os.path.join(run_dir, JOURNAL))
        for run_dir in _run_dirs(state_root)
        if os.path.lexists(os.path.join(run_dir, JOURNAL))
    ]
    journals.sort(key=lambda journal: (journal.run.created, journal.run_id))
    return journals


def check_all(state_root: str, trees: Optional[paths.Trees] = None) -> None:
    """Load every journal, without the lock: one that does not load (or names other trees
    than ``trees``) refuses the command before it writes the lock file (the command reads
    them again under the lock). A run that the lock's holder is creating is hidden until its
    journal is in it, so it is skipped like any hidden entry."""
    for journal in run_journals(state_root):
        journal.check_trees(trees)


def find(state_root: str, run_id: str) -> Journal:
    """The journal of ``run_id``; a run id that is not a plain name (``../x``) is refused."""
    paths.check_run_id(run_id)
    path = os.path.join(state_root, "runs", run_id, JOURNAL)
    run_dir = os.path.dirname(path)
    try:
        mode = os.lstat(run_dir).st_mode
    except FileNotFoundError:
        raise errors.UsageError(
            "no run {} under {}".format(run_id, os.path.join(state_root, "runs"))
        ) from None
    if not stat.S_ISDIR(mode):
        raise errors.JournalError(f"run {run_id}: {run_dir} is {_not_a_run(mode, True)}")
    if not os.path.lexists(path):
        raise errors.JournalError(f"run {run_id}: {_NO_JOURNAL}; remove {run_dir} by hand")
    return Journal.load(path)


def interrupted(state_root: str) -> List[Journal]:
    return [journal for journal in run_journals(state_root) if journal.state in INTERRUPTED]


def chain_plan(run: Run) -> Optional[Dict[str, Any]]:
    """A stack rebuild's plan as ``rebuild --json`` shows it (``dependants.Plan.to_result``);
    None for any other run."""
    chain = run.request.chain if run.request is not None else None
    return chain.to_result() if chain is not None else None


def summary(journal: Journal, detail: bool = False) -> Dict[str, Any]:
    """What ``status`` shows of a run: the whole record with ``detail``, else its headline.
    A stack rebuild's shows its ``plan`` (``chain_plan``) in both: the chain's members are
    its modules, and the plan says why each is one."""
    run = journal.run
    if detail:
        result = records.dump(run)
        result["journal"] = journal.path
        for entry, dumped in zip(run.modules, result["modules"]):
            dumped["retired_path_exists"] = os.path.lexists(entry.retired_path)
        _add_plan(result, run)
        return result
    headline: Dict[str, Any] = {
        "run_id": run.run_id,
        "kind": run.kind.value,
        "schema": run.schema,
        "state": run.state.value,
        "created": run.created,
        "state_since": run.changed_since,
    }
    if run.kind is RunKind.RETIRE:
        headline.update(
            module_file=run.module_file,
            retired_to=run.retired_to,
            software_dir=run.software_dir,
            reason=run.reason,
        )
    else:
        headline.update(
            job=records.dump(run.job) if run.job is not None else None,
            error=run.error,
            cancelled=run.cancelled,
        )
        headline["modules"] = [
            {
                "module": entry.module,
                "stable_path": entry.stable_path,
                "retired_path": entry.retired_path,
                "retired_path_exists": os.path.lexists(entry.retired_path),
            }
            for entry in run.modules
        ]
        _add_plan(headline, run)
    return headline


def _add_plan(shown: Dict[str, Any], run: Run) -> None:
    plan = chain_plan(run)
    if plan is not None:
        shown["plan"] = plan
