# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What eb-staged-rebuild prints for people; ``--json`` prints the result dicts instead.

A command's result dict is the one ``--json`` prints and the modules return, and it stays
so. These functions word it the way the tools an administrator already reads do (borg's
``list`` and ``info``, spack's ``find``, ``squeue``): a table with a header for many runs,
a block of ``Label: value`` lines for one, a few sentences for a change, each change ending
with the command that undoes it. What a result does not carry and a person wants next (the
inodes of a swap, when a grace period ends) is read from the run's journal after the
command (``Context.journal``).

Every value is shown through ``printable`` (``common.printable``): a control character, a
byte that is not UTF-8 or another character a terminal could obey is shown escaped
(``\x1b``, ``\n``, ``\xff``), so that no value another user chose (a process's
``SLURM_JOB_ID``, a module file's root, a journal edited by hand) drives the terminal or
fails the write. A command to paste is made of ``shell_word``s instead, which a shell reads
back into the same arguments.

Lines fit ``WIDTH`` columns; a path is never cut: text wraps between words only, and a
path too long for its line goes on a line of its own, whole. Times are local, to the
second, with how long ago. Colour only on a terminal and without ``NO_COLOR``
(``Style.for_stream``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import textwrap
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..common.printable import printable, shell_word
from . import backends, paths
from . import gc as gc_module
from . import journal as journals
from .journal import RunKind, RunState

WIDTH = 100
_GAP = "  "


@dataclasses.dataclass(frozen=True)
class Style:
    """ANSI colour where it helps a person scan (states, headers), or none at all."""

    colour: bool = False

    @classmethod
    def for_stream(cls, stream, environ: Mapping[str, str]) -> Style:
        """Colour only on a terminal, and never when ``NO_COLOR`` is set (no-color.org)."""
        isatty = getattr(stream, "isatty", None)
        return cls(bool(isatty and isatty()) and "NO_COLOR" not in environ and environ.get("TERM") != "dumb")

    def _code(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour and text else text

    def bold(self, text: str) -> str:
        return self._code("1", text)

    def state(self, text: str) -> str:
        """A run's state (or a tree's fate in gc), padded before it is coloured."""
        word = text.strip()
        if word in _GOOD:
            return self._code("32", text)
        if word in _BAD:
            return self._code("31", text)
        if word in _PENDING:
            return self._code("33", text)
        return text


_GOOD = {RunState.PUBLISHED.value, "removed"}
_BAD = {RunState.FAILED.value, "interrupted", "unreadable"}
_PENDING = {state.value for state in journals.INTERRUPTED} | {"manual", "incomplete", "leftover"}


@dataclasses.dataclass
class Context:
    """What wording a result needs beyond the result: the state root (to read a run's
    journal), the moment the command ran, how the user called the tool (its arguments, for
    the commands it suggests) and the style."""

    state_root: str
    now: datetime.datetime
    command: Tuple[str, ...] = ("eb-staged-rebuild",)
    style: Style = Style()

    def journal(self, run_id: str) -> journals.Journal:
        return journals.find(self.state_root, run_id)

    def suggest(self, *words: str) -> List[str]:
        """The tool's command line with ``words``, each as a shell reads it back."""
        return [shell_word(word) for word in (*self.command, *words)]

    def at(self, state_root: str) -> Context:
        """This context for the runs of ``state_root``: their journals, and suggested
        commands that name it."""
        return dataclasses.replace(
            self, state_root=state_root, command=(self.command[0], "--state-root", state_root)
        )


# Times


def _parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def local_time(moment: datetime.datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3 h 5 min``, ``2 days 4 h``: two units at most, rounded down."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 3600:
        return f"{minutes} min"
    if seconds < 86400:
        rest = minutes % 60
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    rest = hours % 24
    noun = "day" if days == 1 else "days"
    return f"{days} {noun} {rest} h" if rest else f"{days} {noun}"


def when(stamp: str, now: datetime.datetime) -> str:
    """``2026-12-02 17:17:04 (3 h 2 min ago)`` in local time."""
    moment = _parse(stamp)
    seconds = (now - moment).total_seconds()
    relative = f"{duration(seconds)} ago" if seconds >= 0 else f"{duration(-seconds)} from now"
    return f"{local_time(moment)} ({relative})"


# Lines


def wrap(text: str, indent: str = "", more: Optional[str] = None) -> List[str]:
    """``text`` wrapped at ``WIDTH`` between words only: a path is never cut."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  " if more is None else more,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def field(label: str, value: str, indent: str = "", label_width: int = 0) -> List[str]:
    """``Label:  value``; a value that does not fit beside its label goes on the next line."""
    head = f"{indent}{label + ':':<{label_width}}"
    line = f"{head} {value}" if value else head.rstrip()
    if len(line) <= WIDTH or not value:
        return [line]
    return [head.rstrip(), indent + "  " + value]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], style: Style) -> List[str]:
    """Columns two spaces apart; the last one wraps within what is left of ``WIDTH``, or,
    when too little is left (long run ids), goes on the lines under its row.

    ``style.state`` colours the column named STATE, after padding (colour codes take no room).
    """
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header) - 1)]
    start = sum(widths) + len(_GAP) * len(widths)
    room = WIDTH - start
    # A word of the last column (a module, with its comma) is never cut either.
    longest = max((len(word) for row in rows for word in row[-1].split()), default=0)
    below = room < max(_LAST_COLUMN, longest)
    state_column = list(header).index("STATE") if "STATE" in header else -1

    def cells_of(row):
        cells = [f"{cell:<{width}}" for cell, width in zip(row, widths)]
        if state_column >= 0 and row is not header:
            cells[state_column] = style.state(cells[state_column])
        return cells

    if below:
        lines = [style.bold(_GAP.join(cells_of(header)).rstrip()), style.bold("    " + header[-1])]
        for row in rows:
            lines.append(_GAP.join(cells_of(row)).rstrip())
            lines.extend(wrap(row[-1], "    ", "    "))
        return lines
    lines = [style.bold(_GAP.join([*cells_of(header), header[-1]]))]
    for row in rows:
        last = textwrap.wrap(row[-1], room, break_long_words=False, break_on_hyphens=False) or [""]
        lines.append(_GAP.join([*cells_of(row), last[0]]).rstrip())
        lines.extend(" " * start + part for part in last[1:])
    return lines


# The narrowest the last column of a table may be beside the others.
_LAST_COLUMN = 24


def command(label: str, words: Sequence[str]) -> List[str]:
    """``Label: <command>``; ``words`` are shell words (``shell_word``), joined by blanks. A
    command too long for one line goes under its label and continues with `` \\`` between
    two words, never inside one (a quoted word may hold blanks), so that it still pastes."""
    line = f"{label}: {' '.join(words)}"
    if len(line) <= WIDTH:
        return [line]
    parts = ["  " + words[0]]
    for word in words[1:]:
        # Room for the continuation: WIDTH - 2 columns, as a word too long for any line
        # stays whole on its own.
        if len(parts[-1]) + 1 + len(word) <= WIDTH - 2:
            parts[-1] += " " + word
        else:
            parts.append("    " + word)
    return [f"{label}:", *(part + " \\" for part in parts[:-1]), parts[-1]]


def _done(lines: List[str]) -> str:
    return "\n".join(lines) + "\n"


# status


def _run_modules(run: Mapping[str, Any]) -> List[str]:
    """The modules a run names: a publish run's entries, or the module a retire moved away
    (named ``Name/version`` from its software directory, as EasyBuild lays it out)."""
    if run["kind"] == RunKind.RETIRE.value:
        return ["/".join(run["software_dir"].rstrip("/").split("/")[-2:])]
    return [entry["module"] for entry in run["modules"]]


def status(result: Mapping[str, Any], context: Context) -> str:
    """``status``: a table of every run, then the run directories without a journal; with a
    run, its block (``run_block``); with ``--target``, that for each target's state root."""
    if "targets" in result:
        return _targets_status(result, context)
    if "run" in result:
        return run_block(result, context)
    runs = result["runs"]
    if runs:
        with_jobs = any(run.get("job") for run in runs)
        rows = [
            (
                printable(run["run_id"]),
                printable(run["kind"]),
                printable(run["state"]),
                when(run["created"], context.now),
                *([job_state(run.get("job"))] if with_jobs else []),
                ", ".join(map(printable, _run_modules(run))),
            )
            for run in runs
        ]
        header = ("RUN", "KIND", "STATE", "CREATED", *(["JOB"] if with_jobs else []), "MODULES")
        lines = table(header, rows, context.style)
    else:
        lines = [f"No runs in {printable(context.state_root)}."]
    lines.extend(_incomplete(result["incomplete"], context.style))
    for run in runs:
        if RunState(run["state"]) is RunState.STAGED:
            lines += [
                "",
                *wrap(printable(f"Run {run['run_id']} is staged; next:")),
                *_staged_commands(run["run_id"], context),
            ]
        if RunState(run["state"]) in journals.INTERRUPTED:
            lines += [
                "",
                *command(
                    printable(f"Run {run['run_id']} is interrupted ({run['state']}); next"),
                    _next_command(run["run_id"], RunKind(run["kind"]), context),
                ),
            ]
    return _done(lines)


def job_state(job: Optional[Mapping[str, Any]]) -> str:
    """A run's job in a few words: ``123 zen3 RUNNING on node1``, ``124 PENDING (Dependency)``,
    ``125 unknown (finished)``; the id alone where Slurm was not asked (the run has ended)."""
    if not job:
        return ""
    words = [printable(job.get("job_id") or "not submitted")]
    if job.get("target"):
        words.append(printable(job["target"]))
    slurm = job.get("slurm")
    if slurm:
        words.append(printable(slurm["state"]))
        if slurm.get("node"):
            words.append(f"on {printable(slurm['node'])}")
        detail = slurm.get("reason") or slurm.get("why")
        if detail:
            words.append(f"({printable(detail)})")
    elif job.get("node"):
        words.append(f"ran on {printable(job['node'])}")
    return " ".join(words)


def _targets_status(result: Mapping[str, Any], context: Context) -> str:
    """``status --target``: each target's runs under its name and state root."""
    blocks = []
    for entry in result["targets"]:
        shown = context.at(entry["state_root"])
        title = f"Target {printable(entry['target'])} ({printable(entry['state_root'])})"
        blocks.append(f"{context.style.bold(title)}\n{status(entry, shown)}")
    return "\n".join(blocks)


def _incomplete(incomplete, style: Style) -> List[str]:
    lines: List[str] = []
    for entry in incomplete:
        lines += [
            "",
            *field(style.state(entry["kind"]), printable(entry["path"])),
            *wrap(printable(entry["why"]), "  "),
        ]
    return lines


_LABEL = 12


def _fields(pairs, indent: str = "", label_width: int = _LABEL) -> List[str]:
    """``field`` for each ``(label, value)``; each value shown already (``printable``)."""
    lines: List[str] = []
    for label, value in pairs:
        lines.extend(field(label, value, indent, label_width))
    return lines


def _exists(path: str) -> str:
    return f"{printable(path)} ({'exists' if os.path.lexists(path) else 'gone'})"


def _backend(name: str) -> str:
    return f"{printable(name)}, {'sandboxed' if name in backends.SANDBOXED else 'no sandbox'}"


def run_block(result: Mapping[str, Any], context: Context) -> str:
    """``status RUN``: the run's facts, each module's paths, its steps, and what comes next
    (from the run's journal: ``--json`` shows every field of it)."""
    journal = context.journal(result["run"]["run_id"])
    run = journal.run
    backend = f", backend {_backend(run.backend)}" if run.backend else ""
    lines = _fields(
        [
            ("Run", printable(run.run_id)),
            ("Kind", run.kind.value + backend),
            ("State", f"{context.style.state(run.state.value)} since {when(run.changed_since, context.now)}"),
            ("Created", when(run.created, context.now)),
            ("Journal", printable(journal.path)),
        ]
    )
    shown = result["run"]
    if shown.get("job"):
        lines += _fields([("Job", job_state(shown["job"]))])
    if shown.get("error"):
        cancelled = " (cancelled)" if shown.get("cancelled") else ""
        lines += _fields([("Error", printable(shown["error"]) + cancelled)])
    if run.kind is RunKind.RETIRE:
        retired_to = run.retired_to or ""
        lines += _fields(
            [
                ("Module file", printable(run.module_file or "")),
                ("Retired to", _exists(retired_to) if retired_to else ""),
                ("Software", printable(run.software_dir or "")),
                ("Reason", printable(run.reason or "")),
            ]
        )
    plan = journals.chain_plan(run)
    if plan is not None:
        # A stack rebuild: its modules are the chain's members, and the plan says why.
        lines += ["", *chain_plan(plan)]
    for entry in run.modules:
        lines += ["", f"Module {printable(entry.module)}"]
        lines += _fields(
            [
                ("Live", printable(entry.stable_path)),
                ("Retired", _exists(entry.retired_path)),
                ("Module file", printable(entry.module_file)),
            ],
            "  ",
        )
    if run.steps:
        lines += ["", "Steps:"]
        for step in run.steps:
            unfinished = "" if step.status is journals.StepStatus.DONE else "  (started, not done)"
            lines.append(f"  {local_time(_parse(step.at))}  {printable(str(step.step))}{unfinished}")
    lines += _next(run.run_id, run.kind, run.state, context)
    return _done(lines)


def _next_command(run_id: str, kind: RunKind, context: Context) -> List[str]:
    """What finishes an interrupted run: ``resume`` for a rebuild, ``rollback RUN`` for a retire."""
    if kind is RunKind.RETIRE:
        return context.suggest("rollback", run_id)
    return context.suggest("resume")


def _next(run_id: str, kind: RunKind, state: RunState, context: Context) -> List[str]:
    """The command that comes next for a run in ``state``: finish it, or undo it."""
    if state in journals.INTERRUPTED:
        return ["", *command("Next", _next_command(run_id, kind, context))]
    if state in (RunState.PUBLISHED, RunState.RETIRED):
        return ["", *command("Undo", context.suggest("rollback", run_id))]
    if state is RunState.STAGED:
        return ["", *_staged_commands(run_id, context)]
    return []


def _staged_commands(run_id: str, context: Context) -> List[str]:
    """What decides a staged run: publish it (with the other targets' runs), or discard it."""
    return [
        *command("Publish", context.suggest("publish", run_id)),
        *command("Discard", context.suggest("discard", run_id)),
    ]


# rebuild, resume, rollback, retire


def _published_modules(journal: journals.Journal) -> List[str]:
    """Each module of a published run: its live path, the inode there now and before, and
    where the previous tree and module file are kept."""
    lines: List[str] = []
    for entry in journal.modules:
        backup = (
            printable(entry.module_backup)
            if entry.module_backup
            else "none (there was no module file before)"
        )
        lines += _module_block(
            entry,
            ("Inode", f"{entry.stage_ino}, was {entry.live_ino}"),
            ("Previous", printable(entry.retired_path)),
            ("Previous file", backup),
        )
    return lines


def _module_block(entry, inode, tree, module_file) -> List[str]:
    """A module's lines after a swap: its live path, ``inode``, where the other tree is
    (``tree``), its module file and where the other module file is (``module_file``)."""
    rows = [
        ("Live", printable(entry.stable_path)),
        inode,
        tree,
        ("Module file", printable(entry.module_file)),
        module_file,
    ]
    return ["", printable(entry.module), *_fields(rows, "  ", _MODULE_LABEL)]


# The widest label of a module's lines, and the colon.
_MODULE_LABEL = len("Previous file:")


def rebuild(result: Mapping[str, Any], context: Context) -> str:
    """A published rebuild: what is live now, what is kept, and how to undo it."""
    if "jobs" in result:
        return submitted(result, context)
    if result.get("dry_run"):
        return _rebuild_dry_run(result)
    journal = context.journal(result["run_id"])
    count = len(journal.modules)
    noun = "module" if count == 1 else "modules"
    lines = wrap(
        f"Published run {printable(result['run_id'])}: {count} {noun} swapped in "
        f"(backend {_backend(result['backend'])})."
    )
    lines += _published_modules(journal)
    lines += [
        "",
        *wrap(
            "The previous trees stay for the jobs still running from them and for rollback, until gc "
            "removes them."
        ),
        *command("Undo", context.suggest("rollback", result["run_id"])),
    ]
    return _done(lines)


def _rebuild_dry_run(result: Mapping[str, Any]) -> str:
    lines = wrap(
        f"Dry run: would rebuild {', '.join(map(printable, result['modules']))} with backend "
        f"{_backend(result['backend'])}, building in {printable(result['generation'])}; nothing was built "
        "or changed."
    )
    # One argument a line, continued as a shell would read it: a long path stays whole.
    words = [shell_word(word) for word in result["command"]]
    lines += ["EasyBuild's command:", *(f"  {word} \\" for word in words[:-1]), f"  {words[-1]}"]
    if result["removed_options"]:
        lines += wrap(
            "Left out of EasyBuild's options: " + " ".join(map(printable, result["removed_options"]))
        )
    if result["removed_environment"]:
        removed = " ".join(map(printable, result["removed_environment"]))
        lines += wrap("Left out of EasyBuild's environment: " + removed)
    configuration = result.get("easybuild_configuration")
    if configuration and configuration["text"] is not None:
        lines.append("EasyBuild's configuration for this build (eb --show-config):")
        lines += [f"  {printable(line)}" for line in configuration["text"].splitlines() if line.strip()]
    elif configuration:
        lines += wrap(f"EasyBuild's configuration could not be shown: {printable(configuration['error'])}")
    if result.get("plan"):
        lines += chain_plan(result["plan"])
    return _done(lines)


def chain_plan(plan: Mapping[str, Any]) -> List[str]:
    """A chain's plan: each member in build order, why it is in, and what it is rebuilt from."""
    members = plan["members"]
    noun = "module" if len(members) == 1 else "modules"
    lines = [f"plan: {len(members)} {noun}, in build order"]
    for number, member in enumerate(members, 1):
        if member["module"] == plan["target"]:
            why = "named"
        else:
            why = "depends on " + " -> ".join(map(printable, member["reason"][1:]))
            if member["kind"] == "build":
                why += ", to build"
        source = printable(member["easyconfig"] or "(no easyconfig given)")
        lines.append(f"  {number}. {printable(member['module'])} ({why}) from {source}")
    for module in plan["excluded"]:
        lines.append(f"  left out: {printable(module)} (keeps linking the old {printable(plan['target'])})")
    return lines


def resume(result: Mapping[str, Any], context: Context) -> str:
    """Each run that resume finished or reversed; a line when there was none."""
    changed = [run for run in result["runs"] if run["changed"]]
    waiting = [run for run in result["runs"] if not run["changed"] and run["actions"]]
    lines: List[str] = []
    for run in changed:
        if lines:
            lines.append("")
        state = RunState(run["state"])
        lines += wrap(f"Resumed run {printable(run['run_id'])}: {context.style.state(state.value)}.")
        lines += [line for action in run["actions"] for line in wrap(printable(action), "  ")]
        if state is RunState.PUBLISHED:
            lines += _published_modules(context.journal(run["run_id"]))
            lines += ["", *command("Undo", context.suggest("rollback", run["run_id"]))]
        else:
            lines += wrap("The trees are as they were before the run; there is nothing to undo.", "  ")
    for run in waiting:
        lines += wrap(printable(f"Run {run['run_id']} ({run['state']}): {run['actions'][0]}"))
    if not changed and not waiting:
        lines = ["Nothing to resume: no run is interrupted."]
    return _done(lines)


def rollback(result: Mapping[str, Any], context: Context) -> str:
    """A rollback: what is live again, what is kept, and the command that publishes it again."""
    run_id = result["run_id"]
    if not result["changed"]:
        return _done(
            wrap(printable(f"Run {run_id} is {result['state']}: nothing to roll back, nothing changed."))
        )
    journal = context.journal(run_id)
    if journal.run.kind is RunKind.RETIRE:
        module_file = str(journal.run.module_file)
        lines = wrap(printable(f"Rolled back run {run_id}: module file {module_file} is back in place."))
        undo = context.suggest("retire", module_file, "--reason", journal.run.reason or "")
        return _done([*lines, "", *command("Undo", undo)])
    lines = wrap(f"Rolled back run {printable(run_id)}: the previous trees are live again.")
    for entry in journal.modules:
        restored = (
            printable(entry.module_backup)
            if entry.module_backup
            else "none: the module file is removed, as there was none before"
        )
        lines += _module_block(
            entry,
            ("Inode", f"{entry.live_ino} again, was {entry.stage_ino}"),
            ("Rolled back", printable(entry.retired_path)),
            ("Restored from", restored),
        )
    lines += [
        "",
        *wrap("The rolled-back builds stay until gc removes them."),
        *command("Undo (build and publish again)", _rebuild_command(journal, context)),
    ]
    return _done(lines)


def _rebuild_command(journal: journals.Journal, context: Context) -> List[str]:
    request = journal.request
    trees = journal.trees
    installpath = os.path.dirname(trees.software)
    if trees == paths.Trees.from_installpath(installpath):
        where = [f"--installpath={installpath}"]
    else:
        where = [f"--installpath-software={trees.software}", f"--installpath-modules={trees.modules}"]
    if request.chain is not None:
        # A stack rebuild again: its named module with its dependants as they are then, not
        # the members of this run (whose easyconfig copies EasyBuild is not given).
        chain = [f"--module={request.chain.target}", "--with-dependants"]
        modules = chain + [f"--exclude={module}" for module in request.exclude]
    else:
        modules = [f"--module={module}" for module in request.modules_requested]
    return context.suggest("rebuild", *where, *modules, "--", *request.eb_args)


def retire(result: Mapping[str, Any], context: Context) -> str:
    """A retire: where the module file went, what stays, and how to undo it."""
    run_id = result["run_id"]
    if not result["changed"]:
        return _done(
            wrap(printable(f"{result['module_file']} is already retired by run {run_id}: nothing changed."))
        )
    journal = context.journal(run_id)
    lines = wrap(f"Retired run {printable(run_id)}: the module file is out of MODULEPATH's way.")
    lines += _fields(
        [
            ("Module file", printable(result["module_file"])),
            ("Kept at", printable(result["retired_to"])),
            ("Software", printable(journal.run.software_dir or "")),
        ],
        "  ",
    )
    lines += [
        "",
        *wrap(
            "The software directory stays: gc names it for removal by hand once no tracked module "
            "uses it and the grace period is over."
        ),
        *command("Undo", context.suggest("rollback", run_id)),
    ]
    return _done(lines)


# gc


def _fate(kind: str, dry_run: bool) -> str:
    return "would remove" if dry_run and kind == "removed" else kind


def collected(report: Mapping[str, Any], context: Context) -> str:
    """gc: each tree removed, kept or left to the administrator, with why in words and, for
    the grace period, the time left; then what gc could see and a final count."""
    dry_run = report["dry_run"]
    runs: Dict[str, journals.Journal] = {}

    def run_of(run_id: str) -> journals.Journal:
        if run_id not in runs:
            runs[run_id] = context.journal(run_id)
        return runs[run_id]

    lines: List[str] = []
    width = len("would remove") if dry_run else len("removed")
    for kind in ("removed", "kept", "manual"):
        for entry in report[kind]:
            label = context.style.state(f"{_fate(kind, dry_run):<{width}}")
            lines.append(f"{label}  {printable(entry['path'])}")
            # An old tree's name ends with its run's id; a retired software directory's does not.
            run = "" if entry["path"].endswith("." + entry["run_id"]) else f"run {entry['run_id']}"
            reason = "" if kind == "removed" else _reason(entry, report["grace_hours"], run_of, context.now)
            said = ": ".join(part for part in (run, reason) if part)
            if said:
                lines += wrap(printable(said), " " * (width + 2))
    for entry in report["interrupted"]:
        said = printable(f"run {entry['run_id']} ({entry['state']}): {entry['why']}")
        lines += wrap(f"{context.style.state('interrupted')}  {said}")
    lines += _incomplete(report["incomplete"], context.style)
    if lines:
        lines.append("")
    lines += _seen(report)
    lines.append(_count(report))
    return _done(lines)


def _reason(entry, grace_hours: float, run_of: Callable[[str], journals.Journal], now) -> str:
    why = entry["why"]
    if why != "grace period":
        return why
    ends = gc_module.grace_ends(run_of(entry["run_id"]), grace_hours)
    left = (ends - now).total_seconds()
    return f"grace period of {grace_hours:g} h: {duration(max(left, 0))} left, until {local_time(ends)}"


def _seen(report: Mapping[str, Any]) -> List[str]:
    """What gc looked at: this node's processes, Slurm's jobs, the fleet's answers."""
    processes = report["processes"]
    unreadable = f", {processes['unreadable']} unreadable" if processes["unreadable"] else ""
    lines = wrap(printable(f"Processes: {processes['scanned']} checked ({processes['seen']}{unreadable})."))
    slurm = report["slurm"]
    if slurm["answered"]:
        noun = "job" if slurm["running"] == 1 else "jobs"
        lines += wrap(
            f"Slurm: {slurm['running']} running {noun}; a tree goes once no job that "
            "started before its swap runs."
        )
    else:
        lines += wrap(printable(f"Slurm: {slurm['why']}; trees are kept for the grace period."))
    fleet = report.get("fleet")
    if fleet is not None and fleet["unanswered"]:
        lines += wrap(
            printable(f"Fleet: no answer from {', '.join(fleet['unanswered'])}: every tree is kept.")
        )
    return lines


def _count(report: Mapping[str, Any]) -> str:
    counts = [
        f"{len(report['removed'])} {'would be removed' if report['dry_run'] else 'removed'}",
        f"{len(report['kept'])} kept",
        f"{len(report['manual'])} to remove by hand",
    ]
    if report["interrupted"]:
        counts.append(f"{len(report['interrupted'])} interrupted")
    return ", ".join(counts) + "."


# probe


def probed(result: Mapping[str, Any], context: Context) -> str:
    """probe: what the filesystem and this host can do, and what to change."""
    yes = {True: "works", False: "fails"}
    lines = _fields(
        [
            ("Path", printable(result["path"])),
            ("Filesystem", printable(result["filesystem"])),
            (
                "Exchange",
                yes[result["exchange"]]
                + (f" ({printable(result['exchange_errno'])})" if result["exchange_errno"] else ""),
            ),
            ("Publish", printable(result["publish_method"])),
            ("bwrap", yes[result["bwrap"]]),
            (
                "userns",
                yes[result["userns"]]
                + printable(f" (user.max_user_namespaces = {result['max_user_namespaces']})"),
            ),
            ("Backend", f"auto picks {printable(result['auto_backend'])}"),
            ("EasyBuild", printable(result["easybuild_version"] or "not found")),
        ]
    )
    for line in result["recommendations"]:
        lines += wrap(f"Recommended: {printable(line)}")
    return _done(lines)


# rebuild --job, job-start, publish, discard


def submitted(result: Mapping[str, Any], context: Context) -> str:
    """``rebuild --job``: the run and its jobs, one line; with ``--dry-run`` each sbatch
    command and the script it would be given."""
    run_id = printable(result["run_id"])
    if result.get("dry_run"):
        lines = wrap(
            f"Dry run: would queue run {run_id} and submit {len(result['jobs'])} jobs; nothing was submitted."
        )
        for job in result["jobs"]:
            what = (
                "publish job" if job["publish"] else f"job of {printable(job['target'] or 'the trees given')}"
            )
            lines += ["", *command(what[0].upper() + what[1:], [shell_word(word) for word in job["sbatch"]])]
            lines += ["  " + printable(line) for line in job["script"].splitlines()]
        return _done(lines)
    jobs = [
        f"job {printable(job['job_id'])}" + (f" ({printable(job['target'])})" if job["target"] else "")
        for job in result["jobs"]
    ]
    if result.get("publish_job"):
        jobs.append(f"publish job {printable(result['publish_job'])}")
    lines = wrap(f"submitted run {run_id}: {', '.join(jobs)}")
    return _done([*lines, *command("Status", context.suggest("status", result["run_id"]))])


def job_started(result: Mapping[str, Any], context: Context) -> str:
    """``job-start``: the run's end in its job, as ``rebuild`` words a published one."""
    if result.get("state") == RunState.STAGED.value:
        lines = wrap(
            f"Run {printable(result['run_id'])} is staged in {printable(context.state_root)}: built, "
            "checked and planned; nothing live changed."
        )
        return _done([*lines, *_staged_commands(result["run_id"], context)])
    return rebuild(result, context)


def published_staged(result: Mapping[str, Any], context: Context) -> str:
    """``publish RUN``: every staged run published, each with the command that undoes it."""
    lines: List[str] = []
    for ref in result["published"]:
        lines += wrap(f"Published run {printable(ref['run_id'])} in {printable(ref['state_root'])}.")
        lines += command("Undo", context.at(ref["state_root"]).suggest("rollback", ref["run_id"]))
    return _done(lines)


def discarded(result: Mapping[str, Any], context: Context) -> str:
    """``discard RUN``: each staged build removed, its run ended failed; nothing live changed."""
    lines = [
        line
        for ref in result["discarded"]
        for line in wrap(
            f"Discarded run {printable(ref['run_id'])} in {printable(ref['state_root'])}: its staged "
            "build is removed; nothing live changed."
        )
    ]
    return _done(lines)
