"""Malformed journals: every command that reads one refuses it in one line and changes nothing.

Every command reads a journal through the same typed loader (``journal.load``, whose own
table of refusals is in the unit tests), so the matrix is not every variant times every
command: every variant below goes through ``status`` and ``staged_info``, which read every
journal of the state root (the command line's and the modules' way of saying what is
wrong), and each class of damage (a wrong type, a missing key, a wrong shape, deep nesting,
a bad time, an unknown value, a duplicate key, a bad path, a bad run id, raw bytes) goes
through every family of commands that reads journals once (``status``, ``resume``,
``rollback``, ``gc``, ``rebuild`` and each module), the classes taking each family's commands
in turn. A variant is one small change to one real journal: the
journals of a test site made once per test process by the real command (a publish run,
schema 2; a publish run with a ledger, schema 4; a refused build; a build that crashed
while publishing and that resume reversed; a retire run), the other runs staying intact
beside the broken one. The changes: a wrong JSON type for
each top-level field, each module-entry field, each step field and each field of ``trees``
and ``request`` (``true`` is not an int, an int is not a bool); missing keys; entries that
are not objects; nesting 100 000 levels deep and 64 levels deep where a string belongs;
timestamps that are prose, numbers, impossible dates or without a time zone (the tool
writes UTC with its offset, so a time without one is refused); unknown step kinds,
statuses, states, kinds and schemas; duplicate keys; relative paths, paths with ``..``
and absolute paths elsewhere than where the state root's runs put them; a run id that
differs from its directory or is not a plain name; and raw bytes that are not a JSON object
(invalid UTF-8, truncated, empty, an array, NaN, Infinity, trailing text).

For each (variant, command) the matrix requires:

* the command line: exit status 2; on stderr exactly one line,
  ``eb-staged-rebuild: journal <path of the journal>: <what is wrong>``; no traceback; nothing
  on stdout, with ``--json`` too (an error prints no document);
* a module: ``failed`` with a one-line ``msg`` ``journal <path>: <what is wrong>``, no
  ``exception``, nothing on stderr;
* nothing changed on disk: every entry under the site (live trees, state root, ledger, the
  working directory) keeps its type, mode, owner, inode and bytes or link target (the
  state root's ``.lock`` is rewritten in place while a command holds it and cleared after:
  its bytes are compared, so a cleared record is unchanged); a rebuild never starts
  EasyBuild.

The commands run in this process (``cli.main`` and the modules' ``main()``), on a copy of a
site made once per session; a few cases run the real command as a process, to show that no
traceback reaches a user. ``test_the_intact_site_passes_every_command`` shows that every
command gets past the journals of the intact site, so each refusal here is the variant's
doing; ``test_every_field_of_a_real_journal_has_a_wrong_type_variant`` fails when a field
appears in a freshly written journal without a wrong-type variant here.

The site lives at one path per test process (a journal records absolute paths). It is
copied from the template first and after any case that changed it, with the inodes its
journals record set to those of the same paths in the copy; between two variants only the
broken journal's bytes are exchanged, in place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli, rebuild
from ansible_collections.hpcstack.ops.plugins.modules import (
    staged_gc,
    staged_info,
    staged_rebuild,
    staged_resume,
    staged_retire,
    staged_rollback,
)
from tests.integration.harness.staged_checks import DEFAULTS, refusal_line, run_tool
from tests.support.module_runner import run_module
from tests.support.staged import FAKE_EB, StagedSite, fake_eb_request

PREFIX = "eb-staged-rebuild: "
APP = "TinyApp/1.0"  # published by the schema-2 run
LIB = "TinyLib/1.0"  # published by the schema-4 run, with a ledger
OLD = "TinyOld/1.0"  # its module file retired
NEW = "TinyNew/1.0"  # a refused build, then a crashed one that resume reversed; the rebuild's module
# The runs of the site: two published (schemas 2 and 4), a refused one (failed), one that
# crashed while publishing and that resume reversed (failed, resumed), and a retire.
PUBLISH, LEDGER, FAILED, RESUMED, RETIRE = "publish", "ledger", "failed", "resumed", "retire"
QUEUED = "queued"  # a run made for a batch job, with the job's record
RUN_IDS = {
    PUBLISH: "20250101T000000Z-schema2",
    LEDGER: "20250101T000001Z-schema4",
    FAILED: "20250101T000002Z-refused",
    RESUMED: "20250101T000003Z-resumed",
    QUEUED: "20250101T000004Z-queued",
}
# The variables that would give the commands a default from the host running the tests.
HOST_VARIABLES = (*DEFAULTS, "EB_STAGED_REBUILD_EB", "FAKE_EB_ARGS_LOG")


# --- the site ---------------------------------------------------------------------------


@dataclass
class Template:
    """The site at ``root`` made by the real command, and a pristine copy of it at ``copy``."""

    root: Path
    copy: Path
    package_root: Path
    run_ids: dict
    journals: dict  # run -> its journal as the command wrote it
    inodes: dict  # run -> [(module index, field, the path whose inode the field records)]

    @property
    def site(self) -> StagedSite:
        return StagedSite(
            installpath=self.root / "apps", state_root=self.root / "state", package_root=self.package_root
        )

    def journal_path(self, run) -> Path:
        return self.root / "state" / "runs" / self.run_ids[run] / "journal.json"


def _dump(data) -> bytes:
    """JSON with sorted keys, as the tool writes a journal (indented, as a hand-edited one may be)."""
    return (json.dumps(data, sort_keys=True, indent=2) + "\n").encode()


def _tool(site, args, status, env=None):
    done = run_tool(site, args, env=env)
    assert done.returncode == status, (args, done.returncode, done.stderr)
    return done


def _recorded_inodes(data) -> list:
    """Which path each inode in a journal names (the stable path or the sibling)."""
    found = []
    for index, entry in enumerate(data["modules"]):
        for field in ("stage_ino", "live_ino"):
            if entry.get(field) is not None:
                (path,) = [
                    path
                    for path in (entry["stable_path"], entry["retired_path"])
                    if os.path.lexists(path) and os.lstat(path).st_ino == entry[field]
                ]
                found.append((index, field, path))
    return found


def _make_template(root: Path, package_root: Path) -> Template:
    site = StagedSite(installpath=root / "apps", state_root=root / "state", package_root=package_root)
    site.install(APP, LIB, OLD, NEW)
    ledger_config = root / "ledger.json"
    ledger_config.write_text(json.dumps({"path": str(root / "ledger.jsonl"), "site": "matrix"}))
    _tool(site, site.rebuild_args(APP, extra=("--run-id", RUN_IDS[PUBLISH])), 0)
    _tool(
        site,
        site.rebuild_args(LIB, extra=("--run-id", RUN_IDS[LEDGER], "--ledger-config", str(ledger_config))),
        0,
    )
    _tool(site, site.rebuild_args(NEW, extra=("--run-id", RUN_IDS[FAILED])), 2, env={"FAKE_EB_FAIL": "1"})
    crash = {"EB_STAGED_REBUILD_CRASH_AT": f"swap {NEW}"}
    _tool(site, site.rebuild_args(NEW, extra=("--run-id", RUN_IDS[RESUMED])), -signal.SIGKILL, env=crash)
    _tool(site, ["resume", RUN_IDS[RESUMED]], 0)
    retired = _tool(site, ["--json", "retire", str(site.module_file(OLD)), "--reason", "moved to /cvmfs"], 0)
    # A batch job's run as the submitting side leaves it: queued, with its job's id.
    queued = rebuild.queue(fake_eb_request(site, NEW, RUN_IDS[QUEUED]), str(site.state_root), target="zen3")
    rebuild.record_job(queued, "4242")
    (root / "cwd").mkdir()  # the commands' working directory: where a relative path would land
    run_ids = dict(RUN_IDS, retire=json.loads(retired.stdout)["run_id"])
    journals = {
        run: json.loads((root / "state" / "runs" / run_id / "journal.json").read_text())
        for run, run_id in run_ids.items()
    }
    # The premise: journals of the current release, in the states this matrix starts from.
    assert {run: (data["schema"], data["kind"], data["state"]) for run, data in journals.items()} == {
        PUBLISH: (2, "publish", "published"),
        LEDGER: (4, "publish", "published"),
        FAILED: (2, "publish", "failed"),
        RESUMED: (2, "publish", "failed"),
        RETIRE: (2, "retire", "retired"),
        QUEUED: (2, "publish", "queued"),
    }
    assert journals[FAILED]["refused"] is True
    assert journals[RESUMED]["resumed"] is not None
    assert journals[QUEUED]["job"]["job_id"] == "4242"
    return Template(
        root=root,
        copy=root.parent / "template",
        package_root=package_root,
        run_ids=run_ids,
        journals=journals,
        inodes={run: _recorded_inodes(data) for run, data in journals.items()},
    )


@pytest.fixture(scope="session")
def template(tmp_path_factory, package_root) -> Template:
    """The site, made once per test process at a path of its own; a copy to restore it from."""
    base = tmp_path_factory.getbasetemp() / "journal-matrix"
    made = _make_template(base / "site", package_root)
    shutil.copytree(made.root, made.copy, symlinks=True)
    return made


def restore(template: Template) -> dict:
    """The site as the template left it, its journals' inodes those of the same paths in the
    copy; returns each run's journal bytes."""
    if os.path.lexists(template.root):
        shutil.rmtree(template.root)
    shutil.copytree(template.copy, template.root, symlinks=True)
    for run, recorded in template.inodes.items():
        if recorded:
            path = template.journal_path(run)
            data = json.loads(path.read_text())
            for index, field, named in recorded:
                data["modules"][index][field] = os.lstat(named).st_ino
            path.write_bytes(_dump(data))
    return {run: template.journal_path(run).read_bytes() for run in template.run_ids}


def disk_state(root: Path) -> dict:
    """Every entry under ``root``: type, mode, owner, inode, and the SHA-256 of a file's bytes
    or a link's target (not times). Equal states mean nothing under ``root`` changed."""
    state = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            info = os.lstat(path)
            entry = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, info.st_ino)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    entry += (hashlib.sha256(handle.read()).hexdigest(),)
            elif stat.S_ISLNK(info.st_mode):
                entry += (os.readlink(path),)
            state[path] = entry
    return state


# --- the variants -------------------------------------------------------------------------

# What a mutation sees: the journal's data (a copy) and the site's root; it returns the bytes.
Mutation = Callable[[dict, Path], bytes]


@dataclass(frozen=True)
class Variant:
    name: str
    run: str  # whose journal it breaks (a key of RUN_IDS, or RETIRE)
    breaks: str
    mutate: Mutation
    field: tuple = ()  # for a wrong type: the field's path ("*" = the first list element with it)
    value: object = None  # for a wrong type: the value put there
    parses: bool = True  # whether Python's json module still reads the bytes


def _walk(data, field):
    """The container holding ``field``'s last key, and that key (``*`` picks an element)."""
    node = data
    for position, key in enumerate(field[:-1]):
        if key == "*":
            following = field[position + 1]
            node = next(item for item in node if following in item)
        else:
            node = node[key]
    return node, field[-1]


def field_value(data, field):
    node, key = _walk(data, field)
    return node[key]


def _set(field, value) -> Mutation:
    def mutate(data, root):
        node, key = _walk(data, field)
        node[key] = value(data, root) if callable(value) else value
        return _dump(data)

    return mutate


def _drop(field) -> Mutation:
    def mutate(data, root):
        node, key = _walk(data, field)
        del node[key]
        return _dump(data)

    return mutate


def _text(change) -> Mutation:
    """A change of the journal's text as the tool writes it: ``change(text, data, root) -> bytes``."""
    return lambda data, root: change(_dump(data).decode(), data, root)


def _nested(field, depth, leaf='"installpath"', opener="[", closer="]") -> Mutation:
    """``field`` holds ``leaf`` inside ``depth`` levels of arrays (or objects): raw text, since
    ``json.dumps`` itself recurses."""
    marker = "@@nested@@"

    def change(text, data, root):
        return text.replace(json.dumps(marker), opener * depth + leaf + closer * depth).encode()

    def mutate(data, root):
        node, key = _walk(data, field)
        node[key] = marker
        return _text(change)(data, root)

    return mutate


def _replace_once(pattern, replacement) -> Mutation:
    def change(text, data, root):
        changed, count = re.subn(pattern, replacement, text, count=1)
        assert count == 1, pattern
        return changed.encode()

    return _text(change)


def _duplicate_top_level_state(text, data, root):
    # A reader that keeps the last of two keys (Python's json) sees an interrupted run.
    assert text.endswith("\n}\n")
    return (text[: -len("\n}\n")] + ',\n  "state": "publishing"\n}\n').encode()


def _duplicate_stable_path(text, data, root):
    entry = data["modules"][0]
    real = f'"stable_path": {json.dumps(entry["stable_path"])}'
    assert text.count(real) == 1
    return text.replace(real, f'"stable_path": {json.dumps(entry["retired_path"])},\n      {real}').encode()


def wrong_type(run, field, value) -> Variant:
    dotted = ".".join("[]" if key == "*" else str(key) for key in field).replace(".[]", "[]")
    name = f"{run}:{dotted}={json_type(value)}"
    return Variant(name, run, f"{dotted} is {json_type(value)}", _set(field, value), field, value)


def json_type(value) -> str:
    """The JSON type of a value, with bool apart from number and an integer apart from a fraction."""
    if value is None:
        return "null"
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "array")):
        if isinstance(value, kind):
            return name
    assert isinstance(value, dict), value
    return "object"


def _live(root):
    return str(root / "apps" / "software" / APP)


WRONG_TYPES = [
    # top level, a publish run
    wrong_type(PUBLISH, ("schema",), True),  # JSON true equals 1: it must not read as schema 1
    wrong_type(PUBLISH, ("schema",), "2"),
    wrong_type(PUBLISH, ("kind",), 7),
    wrong_type(PUBLISH, ("run_id",), [RUN_IDS[PUBLISH]]),
    wrong_type(PUBLISH, ("created",), 1735689600),
    wrong_type(PUBLISH, ("updated",), None),
    wrong_type(PUBLISH, ("state_since",), ["2025-01-01T00:00:00+00:00"]),
    wrong_type(PUBLISH, ("state",), None),
    wrong_type(PUBLISH, ("modules",), {APP: {}}),
    wrong_type(PUBLISH, ("steps",), "build"),
    wrong_type(PUBLISH, ("trees",), ["software", "modules"]),
    wrong_type(PUBLISH, ("request",), "rebuild TinyApp/1.0"),
    wrong_type(PUBLISH, ("backend",), False),
    wrong_type(PUBLISH, ("relocated_files",), "1"),
    wrong_type(PUBLISH, ("relocated_files",), True),
    # written by a refused build and by resume
    wrong_type(FAILED, ("refused",), "yes"),
    wrong_type(FAILED, ("error",), 5),
    wrong_type(FAILED, ("cancelled",), "yes"),
    # a batch job's run
    wrong_type(QUEUED, ("job",), "4242"),
    wrong_type(QUEUED, ("job", "job_id"), 4242),
    wrong_type(QUEUED, ("job", "target"), ["zen3"]),
    wrong_type(QUEUED, ("job", "node"), 7),
    wrong_type(QUEUED, ("job", "submitted"), 1735689600),
    wrong_type(QUEUED, ("job", "started"), True),
    wrong_type(RESUMED, ("resumed",), 5),
    # top level, a retire run
    wrong_type(RETIRE, ("module_file",), 0),
    wrong_type(RETIRE, ("retired_to",), ["/nowhere"]),
    wrong_type(RETIRE, ("module_sha256",), 123),
    wrong_type(RETIRE, ("software_dir",), {"path": "/apps"}),
    wrong_type(RETIRE, ("reason",), None),
    wrong_type(RETIRE, ("retired_at",), 1.5),
    # a module entry
    wrong_type(PUBLISH, ("modules", "*", "module"), 42),
    wrong_type(PUBLISH, ("modules", "*", "name"), None),
    wrong_type(PUBLISH, ("modules", "*", "version"), 1.0),
    wrong_type(PUBLISH, ("modules", "*", "stable_path"), ["/apps/software/TinyApp/1.0"]),
    wrong_type(PUBLISH, ("modules", "*", "retired_path"), {"path": "/apps"}),
    wrong_type(PUBLISH, ("modules", "*", "module_file"), True),
    wrong_type(PUBLISH, ("modules", "*", "live_record"), 7),  # a path, or null
    wrong_type(PUBLISH, ("modules", "*", "prepared_module"), ["x.lua"]),
    wrong_type(PUBLISH, ("modules", "*", "new_module_sha256"), 0),
    wrong_type(PUBLISH, ("modules", "*", "old_module_sha256"), ["0" * 64]),
    wrong_type(PUBLISH, ("modules", "*", "class_links"), "tools"),
    wrong_type(PUBLISH, ("modules", "*", "module_backup"), 5),  # a path, or null
    wrong_type(PUBLISH, ("modules", "*", "stage_ino"), "2154730"),
    wrong_type(PUBLISH, ("modules", "*", "live_ino"), True),
    wrong_type(PUBLISH, ("modules", "*", "class_link_previous"), ["tools"]),
    wrong_type(PUBLISH, ("modules", "*", "class_links", 0), 7),
    wrong_type(PUBLISH, ("modules", "*", "class_link_previous", "tools"), 7),
    # a step
    wrong_type(PUBLISH, ("steps", "*", "step"), 3),
    wrong_type(PUBLISH, ("steps", "*", "status"), True),
    wrong_type(PUBLISH, ("steps", "*", "at"), 0),
    wrong_type(LEDGER, ("steps", "*", "ledger_length"), "0"),
    # trees
    wrong_type(PUBLISH, ("trees", "software"), 1),
    wrong_type(PUBLISH, ("trees", "modules"), None),
    # the request (resume builds a ``building`` run again from it)
    wrong_type(PUBLISH, ("request", "allow_unrelocated"), "no"),
    wrong_type(PUBLISH, ("request", "backend"), 1),
    wrong_type(PUBLISH, ("request", "eb"), [str(FAKE_EB)]),
    wrong_type(PUBLISH, ("request", "eb_args"), "TinyApp-1.0.eb"),
    wrong_type(LEDGER, ("request", "ledger_config"), 4),
    wrong_type(LEDGER, ("request", "ledger"), "/site/ledger.jsonl"),  # the configuration as read
    wrong_type(PUBLISH, ("request", "lock_timeout"), "0"),
    wrong_type(PUBLISH, ("request", "modules"), 0),
    wrong_type(PUBLISH, ("request", "modules_requested"), APP),
    wrong_type(PUBLISH, ("request", "prepare"), 3),  # a command, or null
    wrong_type(PUBLISH, ("request", "run_id"), 5),
    wrong_type(PUBLISH, ("request", "skip_live_check"), 0),  # an int is not a bool
    wrong_type(PUBLISH, ("request", "software"), []),
    wrong_type(PUBLISH, ("request", "with_dependants"), "yes"),
    wrong_type(PUBLISH, ("request", "exclude"), "TinyLib/1.0"),  # a list of modules
    wrong_type(PUBLISH, ("request", "chain"), "TinyLib/1.0"),  # a plan, or null
    wrong_type(PUBLISH, ("request", "publish_together"), "no"),
]

OTHERS = [
    # missing keys
    Variant("missing:schema", PUBLISH, "no schema", _drop(("schema",))),
    Variant("missing:kind", PUBLISH, "no kind", _drop(("kind",))),
    Variant("missing:created", PUBLISH, "no created", _drop(("created",))),
    Variant("missing:trees", PUBLISH, "a publish run without trees", _drop(("trees",))),
    Variant("missing:request", PUBLISH, "a publish run without its request", _drop(("request",))),
    Variant("missing:retire-retired_to", RETIRE, "a retire run without retired_to", _drop(("retired_to",))),
    Variant(
        "missing:retire-module_file", RETIRE, "a retire run without module_file", _drop(("module_file",))
    ),
    Variant(
        "missing:module-module", PUBLISH, "a module entry without module", _drop(("modules", 0, "module"))
    ),
    Variant(
        "missing:module-stable_path",
        PUBLISH,
        "a module entry without stable_path",
        _drop(("modules", 0, "stable_path")),
    ),
    Variant(
        "missing:module-retired_path",
        PUBLISH,
        "a module entry without retired_path",
        _drop(("modules", 0, "retired_path")),
    ),
    Variant("missing:step-step", PUBLISH, "a step without its kind", _drop(("steps", 0, "step"))),
    Variant("missing:step-status", PUBLISH, "a step without status", _drop(("steps", 0, "status"))),
    # entries that are not objects
    Variant("shape:module-entry-is-a-string", PUBLISH, "modules: [a string]", _set(("modules",), [APP])),
    Variant("shape:step-is-an-array", PUBLISH, "steps: [an array]", _set(("steps",), [["build", "done"]])),
    # nesting
    Variant(
        "deep:100000-levels",
        PUBLISH,
        "trees.software nested 100 000 arrays deep",
        _nested(("trees", "software"), 100_000),
        parses=False,
    ),
    Variant("deep:64-arrays", PUBLISH, "backend is a string 64 arrays deep", _nested(("backend",), 64)),
    Variant(
        "deep:64-objects",
        PUBLISH,
        "modules[].module_backup is a string 64 objects deep",
        _nested(("modules", 0, "module_backup"), 64, opener='{"a": ', closer="}"),
    ),
    # timestamps: the tool writes UTC ISO 8601 with its offset
    Variant("time:created-prose", PUBLISH, 'created is "yesterday"', _set(("created",), "yesterday")),
    Variant("time:state_since-number", PUBLISH, "state_since is 12", _set(("state_since",), 12)),
    Variant(
        "time:state_since-no-zone",
        PUBLISH,
        "state_since without a time zone",
        _set(("state_since",), "2025-01-01T00:00:00"),
    ),
    Variant(
        "time:updated-no-zone",
        PUBLISH,
        "updated without a time zone",
        _set(("updated",), "2025-01-01T00:00:00"),
    ),
    Variant(
        "time:retired_at-impossible",
        RETIRE,
        "retired_at is February 30th, 25:61",
        _set(("retired_at",), "2025-02-30T25:61:00+00:00"),
    ),
    Variant("time:step-at-empty", PUBLISH, "a step's at is empty", _set(("steps", 0, "at"), "")),
    # values outside their closed sets
    Variant(
        "unknown:step-kind",
        PUBLISH,
        'a step "frobnicate TinyApp/1.0"',
        lambda data, root: _dump(
            dict(
                data,
                steps=[
                    *data["steps"],
                    {"step": f"frobnicate {APP}", "status": "done", "at": data["created"]},
                ],
            )
        ),
    ),
    Variant(
        "unknown:step-module",
        PUBLISH,
        'a step "swap Ghost/1.0" for a module the run does not have',
        lambda data, root: _dump(
            dict(
                data,
                steps=[*data["steps"], {"step": "swap Ghost/1.0", "status": "done", "at": data["created"]}],
            )
        ),
    ),
    Variant(
        "unknown:step-status", PUBLISH, 'a step with status "paused"', _set(("steps", 0, "status"), "paused")
    ),
    Variant("unknown:state", PUBLISH, 'state "exploded"', _set(("state",), "exploded")),
    Variant(
        "unknown:state-of-the-other-kind",
        PUBLISH,
        'a publish run in state "retired"',
        _set(("state",), "retired"),
    ),
    Variant("unknown:kind", PUBLISH, 'kind "upgrade"', _set(("kind",), "upgrade")),
    Variant("unknown:schema", PUBLISH, "schema 9", _set(("schema",), 9)),
    # duplicate keys
    Variant(
        "duplicate:state",
        PUBLISH,
        'state twice: "published", then "publishing"',
        _text(_duplicate_top_level_state),
    ),
    Variant(
        "duplicate:module-stable_path",
        PUBLISH,
        "a module entry with stable_path twice (the sibling, then the stable path)",
        _text(_duplicate_stable_path),
    ),
    # paths
    Variant(
        "path:stable_path-relative",
        PUBLISH,
        "modules[].stable_path is relative",
        _set(("modules", 0, "stable_path"), "apps/software/TinyApp/1.0"),
    ),
    Variant(
        "path:retired_path-dotdot",
        PUBLISH,
        "modules[].retired_path has a .. component",
        _set(
            ("modules", 0, "retired_path"),
            lambda data, root: f"{_live(root)}/../1.0/../.1.0.{RUN_IDS[PUBLISH]}",
        ),
    ),
    Variant(
        "path:trees-software-relative",
        PUBLISH,
        "trees.software is relative",
        _set(("trees", "software"), "apps/software"),
    ),
    Variant(
        "path:retire-module_file-relative",
        RETIRE,
        "module_file is relative",
        _set(("module_file",), "apps/modules/all/TinyOld/1.0.lua"),
    ),
    # paths that are absolute, but not where the state root's runs put them
    Variant(
        "path:stable_path-elsewhere",
        PUBLISH,
        "modules[].stable_path in another tree",
        _set(("modules", 0, "stable_path"), lambda data, root: str(root / "elsewhere" / APP)),
    ),
    Variant(
        "path:module_backup-elsewhere",
        PUBLISH,
        "modules[].module_backup outside the run's directory",
        _set(("modules", 0, "module_backup"), lambda data, root: str(root / "elsewhere" / "1.0.lua")),
    ),
    Variant(
        "path:class_links-dotdot",
        LEDGER,
        "modules[].class_links names ../x",
        _set(("modules", 0, "class_links"), ["../x"]),
    ),
    Variant(
        "path:trees-software-elsewhere",
        PUBLISH,
        "trees.software another absolute tree than the request's",
        _set(("trees", "software"), lambda data, root: str(root / "elsewhere" / "software")),
    ),
    Variant(
        "path:retire-retired_to-elsewhere",
        RETIRE,
        "retired_to outside <state-root>/retired",
        _set(("retired_to",), lambda data, root: str(root / "elsewhere" / "1.0.lua")),
    ),
    Variant(
        "path:retire-software_dir-elsewhere",
        RETIRE,
        "software_dir outside the module tree's software root",
        _set(("software_dir",), lambda data, root: str(root / "elsewhere" / "software" / OLD)),
    ),
    # the run id
    Variant(
        "run_id:not-its-directory",
        PUBLISH,
        "run_id names another run than its directory",
        _set(("run_id",), "20250101T000009Z-another"),
    ),
    Variant(
        "run_id:not-a-plain-name",
        PUBLISH,
        "run_id leaves the runs directory",
        _set(("run_id",), f"../{RUN_IDS[LEDGER]}"),
    ),
    # bytes that are not one JSON object
    Variant(
        "raw:invalid-utf8",
        PUBLISH,
        "a byte that is not UTF-8 in a string",
        lambda data, root: _dump(data).replace(
            b'"backend": "installpath"', b'"backend": "install\xffpath"', 1
        ),
        parses=False,
    ),
    Variant(
        "raw:truncated",
        PUBLISH,
        "the first half of the file",
        lambda data, root: _dump(data)[: len(_dump(data)) // 2],
        parses=False,
    ),
    Variant("raw:empty", PUBLISH, "an empty file", lambda data, root: b"", parses=False),
    Variant("raw:array", PUBLISH, "the journal inside a JSON array", lambda data, root: _dump([data])),
    Variant("raw:string", PUBLISH, "a JSON string", lambda data, root: b'"journal"\n'),
    Variant(
        "raw:nan",
        PUBLISH,
        "relocated_files is NaN",
        _replace_once(r'"relocated_files": \d+', '"relocated_files": NaN'),
    ),
    Variant(
        "raw:infinity",
        PUBLISH,
        "stage_ino is Infinity",
        _replace_once(r'"stage_ino": \d+', '"stage_ino": Infinity'),
    ),
    Variant(
        "raw:trailing-text",
        PUBLISH,
        "a second object after the first",
        lambda data, root: _dump(data) + b"{}\n",
        parses=False,
    ),
]

VARIANTS = {variant.name: variant for variant in [*WRONG_TYPES, *OTHERS]}


# --- the commands -------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """A command that reads journals; ``args(site, run_id)`` builds its arguments."""

    name: str
    args: Callable
    module: object = None  # an Ansible module, else the command line
    check_mode: bool = False
    diff: bool = False


def _rebuild_args(root):
    return [
        "rebuild",
        "--installpath",
        str(root / "apps"),
        "--backend",
        "installpath",
        "--eb",
        str(FAKE_EB),
        "--module",
        NEW,
        "--",
        NEW.replace("/", "-") + ".eb",
    ]


def _module_rebuild(root, run_id):
    return {
        "modules": [NEW],
        "eb_args": [NEW.replace("/", "-") + ".eb"],
        "installpath": str(root / "apps"),
        "backend": "installpath",
        "eb": str(FAKE_EB),
        "rebuild": "always",
    }


CLI_COMMANDS = [
    Command("status", lambda root, run_id: ["status"]),
    Command("status-run", lambda root, run_id: ["status", run_id]),
    Command("status-json", lambda root, run_id: ["--json", "status"]),
    Command("resume", lambda root, run_id: ["resume"]),
    Command("resume-run", lambda root, run_id: ["resume", run_id]),
    Command("resume-json", lambda root, run_id: ["--json", "resume"]),
    Command("rollback-run", lambda root, run_id: ["rollback", run_id]),
    # Grace 0: a gc that went on would remove the other runs' retired trees.
    Command("gc", lambda root, run_id: ["gc", "--grace-hours", "0"]),
    Command("gc-dry-run", lambda root, run_id: ["gc", "--grace-hours", "0", "--dry-run"]),
    Command("rebuild", lambda root, run_id: _rebuild_args(root)),
]
MODULE_COMMANDS = [
    Command("staged_info", lambda root, run_id: {}, staged_info),
    Command("staged_info-run", lambda root, run_id: {"run_id": run_id}, staged_info),
    Command("staged_gc", lambda root, run_id: {"grace_hours": 0}, staged_gc),
    Command("staged_gc-check", lambda root, run_id: {"grace_hours": 0}, staged_gc, check_mode=True),
    Command("staged_resume", lambda root, run_id: {}, staged_resume),
    Command("staged_resume-run", lambda root, run_id: {"run_id": run_id}, staged_resume),
    Command("staged_resume-check", lambda root, run_id: {}, staged_resume, check_mode=True),
    Command("staged_rollback", lambda root, run_id: {"run_id": run_id}, staged_rollback),
    Command(
        "staged_rollback-check-diff",
        lambda root, run_id: {"run_id": run_id},
        staged_rollback,
        check_mode=True,
        diff=True,
    ),
    # already_retired_ok (always on in the module): the module file is gone, so it looks
    # through every journal for the retire run that moved it.
    Command(
        "staged_retire-already-retired",
        lambda root, run_id: {
            "module_file": str(root / "apps" / "modules" / "all" / "TinyOld" / "1.0.lua"),
            "reason": "x",
        },
        staged_retire,
    ),
    Command("staged_rebuild", _module_rebuild, staged_rebuild),
]
COMMANDS = {command.name: command for command in [*CLI_COMMANDS, *MODULE_COMMANDS]}


# --- running a case -----------------------------------------------------------------------


class Bench:
    """The site of this test process, holding one variant at a time.

    A full restore (``restore``) happens first and after any case that changed the site;
    otherwise the next variant only swaps one journal's bytes, written in place.
    """

    def __init__(self, template: Template):
        self.template = template
        self.pristine = None  # run -> the journal's bytes after the last full restore
        self.holds = None  # the variant the site holds exactly (None: unknown)
        self.before = None  # its disk state

    def forget(self):
        """The site is in an unknown state: the next case restores it fully."""
        self.holds = None

    def site_for(self, variant: Variant) -> dict:
        """Put ``variant`` on the site; returns the disk state to compare with after the command."""
        if self.holds is not None and self.holds.name == variant.name:
            self.holds = None  # until the case shows that it left the site as it was
            return self.before
        if self.holds is None:
            self.pristine = restore(self.template)
        else:
            self.template.journal_path(self.holds.run).write_bytes(self.pristine[self.holds.run])
        self.holds = None
        data = json.loads(self.pristine[variant.run])
        self.template.journal_path(variant.run).write_bytes(variant.mutate(data, self.template.root))
        self.before = disk_state(self.template.root)
        return self.before

    def unchanged(self, variant: Variant, before: dict) -> list:
        """The entries the case changed (none: the site is kept for the variant's next case)."""
        after = disk_state(self.template.root)
        if after == before:
            self.holds = variant
            return []
        root = str(self.template.root)
        return sorted(
            path.replace(root, "<site>", 1)
            for path in set(before) | set(after)
            if before.get(path) != after.get(path)
        )


@pytest.fixture(scope="session")
def bench(template) -> Bench:
    return Bench(template)


@dataclass
class Host:
    """The test's process environment: ``enter()`` moves into the site's working directory
    (once the site is restored: a restore replaces it); ``eb_log`` is where the test builder
    logs each start, outside the site, absent at first."""

    eb_log: Path
    enter: Callable


@pytest.fixture
def host(monkeypatch, template) -> Host:
    """No defaults from the host's variables (the commands would pick them up)."""
    for name in HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    eb_log = template.root.parent / "eb-args.jsonl"
    eb_log.unlink(missing_ok=True)
    monkeypatch.setenv("FAKE_EB_ARGS_LOG", str(eb_log))
    return Host(eb_log, lambda: monkeypatch.chdir(template.root / "cwd"))


def _dir_name(template, variant):
    return template.run_ids[variant.run]


@dataclass
class Answer:
    """What the command line did: its exit status, its output, and an exception it let out."""

    status: object
    out: str
    err: str
    escaped: object


def run_cli(capfd, argv) -> Answer:
    """``cli.main(argv)`` in this process."""
    capfd.readouterr()
    try:
        status, escaped = cli.main(argv), None
    except Exception as err:  # a user would see a traceback
        status, escaped = None, err
    out, err = capfd.readouterr()
    return Answer(status, out, err, escaped)


def cli_problems(template, variant, answer: Answer) -> list:
    """What is wrong with a command line's answer to ``variant``'s journal."""
    path = template.journal_path(variant.run)
    if answer.escaped is not None:
        return [f"raised {type(answer.escaped).__name__} (a traceback): {str(answer.escaped)[:200]}"]
    problems = []
    if answer.status != 2:
        problems.append(f"exit status {answer.status}, not 2")
    if "Traceback" in answer.out + answer.err:
        problems.append("a traceback")
    lines = answer.err.splitlines()
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not 1: {answer.err[:300]!r}")
    wanted = f"{PREFIX}journal {path}: "
    if not lines or not lines[0].startswith(wanted) or len(lines[0]) == len(wanted):
        problems.append(f"stderr is not 'journal <path>: <what is wrong>': {answer.err[:300]!r}")
    if answer.out:
        problems.append(f"stdout not empty: {answer.out[:200]!r}")
    return problems


def module_problems(template, variant, result) -> list:
    path = template.journal_path(variant.run)
    problems = []
    if result.get("failed") is not True:
        problems.append(f"not failed (changed={result.get('changed')})")
        return problems
    message = result.get("msg", "")
    if "\n" in message:
        problems.append("msg has more than one line")
    if not message.startswith(f"journal {path}: ") or message == f"journal {path}: ":
        problems.append(f"msg is not 'journal <path>: <what is wrong>': {message[:300]!r}")
    if "exception" in result or "Traceback" in json.dumps(result):
        problems.append("a traceback in the result")
    return problems


def run_case(bench, variant, command, capture, host):
    """Run ``command`` on the site holding ``variant``; the list of what went wrong."""
    template = bench.template
    before = bench.site_for(variant)
    host.enter()
    run_id = _dir_name(template, variant)
    state_root = str(template.root / "state")
    if command.module is None:
        answer = run_cli(capture, ["--state-root", state_root, *command.args(template.root, run_id)])
        problems = cli_problems(template, variant, answer)
    else:
        args = {"state_root": state_root, **command.args(template.root, run_id)}
        try:
            result = run_module(
                capture, command.module, args, check_mode=command.check_mode, diff=command.diff
            )
        except AssertionError:
            raise
        except Exception as err:  # the module let an exception out: Ansible shows a traceback
            problems = [f"raised {type(err).__name__} (a traceback): {str(err)[:200]}"]
        else:
            problems = module_problems(template, variant, result)
    changed = bench.unchanged(variant, before)
    if changed:
        problems.append(f"changed on disk ({len(changed)}): {', '.join(changed[:4])}")
    if host.eb_log.exists():
        problems.append("EasyBuild was started")
    return problems


def refusal_class(variant: Variant) -> str:
    """What kind of damage ``variant`` does: ``wrong-type``, or the kind its name begins with."""
    return "wrong-type" if variant in WRONG_TYPES else variant.name.split(":")[0]


def family(command: Command) -> str:
    """The command line's word (``status``, ``gc``...) or the module's name."""
    if command.module is not None:
        return command.module.__name__.rsplit(".", 1)[-1]
    return next(word for word in command.args(Path("/site"), "run") if not word.startswith("--"))


# Read every journal of the state root: every variant goes through these two.
EVERY_VARIANT = ("status", "staged_info")


def _grouped(items, key) -> dict:
    groups = {}
    for item in items:
        groups.setdefault(key(item), []).append(item.name)
    return groups


CLASSES = _grouped(VARIANTS.values(), refusal_class)
FAMILIES = _grouped(COMMANDS.values(), family)


def _cases() -> list:
    """Every variant through ``EVERY_VARIANT``; each class once through each family, the
    classes taking the family's commands in turn and each family a different variant of a
    class (so that the cases spread over the journals of every run)."""
    cases = [(variant, command) for variant in VARIANTS for command in EVERY_VARIANT]
    for family_index, commands in enumerate(FAMILIES.values()):
        for class_index, variants in enumerate(CLASSES.values()):
            case = (variants[family_index % len(variants)], commands[class_index % len(commands)])
            if case not in cases:
                cases.append(case)
    return cases


CASES = _cases()
CLI_CASES = [(variant, command) for variant, command in CASES if COMMANDS[command].module is None]
MODULE_CASES = [(variant, command) for variant, command in CASES if COMMANDS[command].module is not None]


@pytest.mark.parametrize(("variant", "command"), CLI_CASES)
def test_the_command_line_refuses_a_malformed_journal_in_one_line(bench, host, capfd, variant, command):
    problems = run_case(bench, VARIANTS[variant], COMMANDS[command], capfd, host)

    assert not problems, "; ".join(problems)


@pytest.mark.parametrize(("variant", "command"), MODULE_CASES)
def test_a_module_fails_on_a_malformed_journal_with_one_line(bench, host, capsys, variant, command):
    problems = run_case(bench, VARIANTS[variant], COMMANDS[command], capsys, host)

    assert not problems, "; ".join(problems)


# --- the real command, as a user runs it ---------------------------------------------------

SUBPROCESS_CASES = [
    ("deep:100000-levels", "status"),
    ("deep:100000-levels", "resume"),
    ("duplicate:state", "status"),
    ("duplicate:state", "resume"),
    (f"publish:modules[].stable_path={json_type([])}", "status"),
    (f"publish:modules[].stable_path={json_type([])}", "resume"),
]


@pytest.mark.parametrize(("variant", "command"), SUBPROCESS_CASES)
def test_the_real_command_shows_no_traceback_for_a_malformed_journal(bench, host, variant, command):
    template, broken = bench.template, VARIANTS[variant]
    before = bench.site_for(broken)
    host.enter()

    done = run_tool(template.site, COMMANDS[command].args(template.root, _dir_name(template, broken)))

    line = refusal_line(done)  # exit 2, one line, no traceback, nothing on stdout
    assert line.startswith(f"{PREFIX}journal {template.journal_path(broken.run)}: "), line
    assert bench.unchanged(broken, before) == []
    assert not host.eb_log.exists(), "EasyBuild was started"


# --- the matrix itself ---------------------------------------------------------------------


def test_the_intact_site_passes_every_command(bench, template, host, capfd):
    """Each command gets past the intact journals (so a refusal above is its variant's doing),
    and the ones that write do write: the matrix's "nothing changed" can fail."""
    bench.forget()  # this test leaves the site as the commands left it
    wrote = {}
    for command in COMMANDS.values():
        restore(template)
        host.enter()
        before = disk_state(template.root)
        run_id = template.run_ids[PUBLISH]
        state_root = str(template.root / "state")
        if command.module is None:
            answer = run_cli(capfd, ["--state-root", state_root, *command.args(template.root, run_id)])
            assert answer.escaped is None, (command.name, answer.escaped)
            assert answer.status in (0, 1), (command.name, answer.status, answer.err)
            assert "journal" not in answer.err, (command.name, answer.err)
        else:
            args = {"state_root": state_root, **command.args(template.root, run_id)}
            result = run_module(capfd, command.module, args, check_mode=command.check_mode, diff=command.diff)
            assert "failed" not in result, (command.name, result.get("msg"))
        wrote[command.name] = disk_state(template.root) != before
    assert {name for name, changed in wrote.items() if changed} == {
        "rollback-run",
        "gc",
        "rebuild",
        "staged_gc",
        "staged_rollback",
        "staged_rebuild",
    }


def test_the_matrix_has_at_least_30_variants_and_every_command_that_reads_journals():
    assert len(VARIANTS) >= 30
    assert len(VARIANTS) == len(WRONG_TYPES) + len(OTHERS)  # no two share a name
    kinds = {variant.name.split(":")[0] for variant in OTHERS}
    assert kinds == {"missing", "shape", "deep", "time", "unknown", "duplicate", "path", "run_id", "raw"}
    assert {variant.run for variant in VARIANTS.values()} == {
        PUBLISH,
        LEDGER,
        FAILED,
        RESUMED,
        RETIRE,
        QUEUED,
    }
    assert {command.module for command in MODULE_COMMANDS} == {
        staged_info,
        staged_gc,
        staged_resume,
        staged_rollback,
        staged_retire,
        staged_rebuild,
    }
    cli_words = {
        next(word for word in command.args(Path("/site"), "run") if not word.startswith("--"))
        for command in CLI_COMMANDS
    }
    assert cli_words == {"status", "resume", "rollback", "gc", "rebuild"}


def test_every_variant_reaches_both_front_ends_and_every_class_every_command_family():
    assert {family(COMMANDS[command]) for command in EVERY_VARIANT} == {"status", "staged_info"}
    for command in EVERY_VARIANT:
        assert {variant for variant, chosen in CASES if chosen == command} == set(VARIANTS), command
    covered = {(refusal_class(VARIANTS[variant]), family(COMMANDS[command])) for variant, command in CASES}
    assert covered == {(name, kind) for name in CLASSES for kind in FAMILIES}
    assert {command for _variant, command in CASES} == set(COMMANDS)
    assert len(CASES) == len(set(CASES))


def _fields(journals) -> set:
    """Every field path of the journals: top level, module entries, steps, trees, request, job."""
    found = set()
    for data in journals:
        found.update((key,) for key in data)
        for key in ("trees", "request", "job"):
            found.update((key, inner) for inner in data.get(key) or {})
        for entry in data["modules"]:
            found.update(("modules", "*", key) for key in entry)
        for step in data["steps"]:
            found.update(("steps", "*", key) for key in step)
    return found


def test_every_field_of_a_real_journal_has_a_wrong_type_variant(template):
    covered = {variant.field for variant in WRONG_TYPES}

    missing = _fields(template.journals.values()) - covered

    assert not missing, f"fields without a wrong-type variant: {sorted(missing)}"


def test_each_variant_changes_its_journal_and_only_the_raw_ones_leave_json(template):
    """A variant's bytes differ from the journal's; Python's json module still reads them unless
    the variant breaks the bytes themselves (NaN, a duplicate key and an array it does read)."""
    for variant in VARIANTS.values():
        written = template.journals[variant.run]
        broken = variant.mutate(json.loads(json.dumps(written)), template.root)
        assert broken != _dump(written), variant.name
        try:
            json.loads(broken)
        except (ValueError, RecursionError):
            parses = False
        else:
            parses = True
        assert parses == variant.parses, variant.name


def test_each_wrong_type_variant_changes_the_json_type_of_a_real_field(template):
    """Against the journals as written: each wrong-type value is of another JSON type than
    the field holds (a ``true`` where an int is counts; ``1.0`` where ``"1.0"`` is counts)."""
    for variant in WRONG_TYPES:
        real = field_value(template.journals[variant.run], variant.field)
        assert json_type(real) != json_type(variant.value), variant.name
