"""Bad input to ``eb-staged-rebuild``: every refusal exits 2, says why in one line, changes nothing.

Each case sets up a live tree (and, where it matters, a state root with history), takes a
snapshot of everything under the test's directory (type, mode, owner, inode and bytes of
every entry: the live trees, the module files, the state root and anything a link points
at), runs the real command as a subprocess, and then requires:

* exit status 2, nothing on stdout, and on stderr exactly one line that starts with
  ``eb-staged-rebuild: `` (no traceback) and names the reason;
* the same snapshot afterwards: not a directory's identity, not a journal, not a lock
  file changed;
* for a rebuild, that EasyBuild (the test builder, which logs each start to
  ``FAKE_EB_ARGS_LOG``) never ran, except where the design lets the refusal come after
  the build (a module file that is itself a symlink, "Repository documents" item 12).

The cases follow the design (Publish path; Retiring; "Repository documents" items 4-10
and 15) and the command line in ``cli.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.harness.staged_checks import (
    LockHolder,
    journal_path,
    read_journal,
    refusal_line,
    run_tool,
)
from tests.support.staged import snapshot

APP = "TinyApp/1.0"
LIB = "TinyLib/1.0"
OLD = "TinyOld/1.0"


@dataclass
class Attempt:
    """One refused command line and what its refusal must say.

    ``why``: substrings the one stderr line must contain (the reason, and the path where
    the message should name one). ``state_root``: ``"site"`` for the site's state root,
    ``None`` for no ``--state-root`` at all, or another path. ``scope``: ``"all"`` compares
    everything under the test directory (plus ``extra_roots``), ``"trees"`` only software
    and modules (for a refusal the design places after the build, which leaves a failed
    journal). ``may_build``: EasyBuild may have run before the refusal.
    """

    args: list
    why: tuple
    env: dict = field(default_factory=dict)
    state_root: object = "site"
    scope: str = "all"
    may_build: bool = False
    extra_roots: tuple = ()


class Bench:
    """The live tree (TinyApp/1.0, TinyLib/1.0 and TinyOld/1.0 installed) and the tools to shape it."""

    def __init__(self, site, tmp_path, package_root):
        self.site = site
        self.tmp_path = tmp_path
        self.package_root = package_root
        self.eb_log = tmp_path / "eb-args.jsonl"
        self.cleanups = []
        site.install(APP, LIB, OLD, payload="old")

    def publish(self, *modules, run_id=None):
        """A successful staged rebuild (history for the refusal to be tested against)."""
        extra = ("--run-id", run_id) if run_id else ()
        done = run_tool(self.site, ["--json", *self.site.rebuild_args(*modules, extra=extra)])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["run_id"]

    def history(self):
        """A used state root, cheaply: one real run (a retire of TinyOld's module file).

        Returns its run id. A rebuild would do as well, but costs a build and a publish.
        """
        module_file = str(self.site.module_file(OLD))
        done = run_tool(self.site, ["--json", "retire", module_file, "--reason", "history"])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["run_id"]

    def hold_lock(self, state_root=None):
        holder = LockHolder(state_root or self.site.state_root, self.package_root)
        self.cleanups.append(holder.release)
        return holder

    def elsewhere(self, *parts):
        """A directory outside the live trees (what a planted link points at)."""
        path = self.tmp_path.joinpath("elsewhere", *parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def move_out(self, path: Path, *parts):
        """Move ``path`` outside the live trees and leave a symlink to it at its name."""
        target = self.elsewhere(*parts[:-1]) / parts[-1]
        shutil.move(str(path), str(target))
        path.symlink_to(target, target_is_directory=target.is_dir())
        return target

    def rebuild(self, *modules, extra=()):
        return list(self.site.rebuild_args(*modules, extra=extra))

    def rebuild_with(self, module_values, extra=()):
        """A rebuild command line with raw ``--module`` values (they may be refused)."""
        args = ["rebuild", f"--installpath={self.site.installpath}"]
        for value in module_values:
            args += ["--module", value]
        return [*args, *extra, "--", "TinyApp-1.0.eb"]

    def schema_journal(self, schema, run_id="20240101T000000Z-0ld001"):
        """A journal as the generation-pointer versions wrote it (schema 1 or 3)."""
        stable = str(self.site.live(APP))
        data = {
            "schema": schema,
            "kind": "publish",
            "run_id": run_id,
            "state": "published",
            "created": "2024-01-01T00:00:00+00:00",
            "state_since": "2024-01-01T00:00:00+00:00",
            "modules": [{"module": APP, "stable_path": stable, "generation": stable + ".gen1"}],
            "steps": [],
        }
        if schema == 3:
            data["ledger"] = {"path": str(self.tmp_path / "ledger.jsonl")}
        path = journal_path(self.site.state_root, run_id)
        path.parent.mkdir(parents=True, mode=0o700)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return run_id


CASES = {}


def case(name):
    def register(function):
        assert name not in CASES, name
        CASES[name] = function
        return function

    return register


# --- rebuild: the live install must exist as a real directory (Publish path; item 7) -------


@case("rebuild-live-version-missing")
def case_rebuild_live_version_missing(bench):
    live = bench.site.live("TinyApp/2.0")
    return Attempt(bench.rebuild("TinyApp/2.0"), ("not installed", str(live)))


@case("rebuild-live-name-missing")
def case_rebuild_live_name_missing(bench):
    return Attempt(bench.rebuild("Ghost/1.0"), ("not installed", str(bench.site.live("Ghost/1.0"))))


@case("rebuild-live-missing-while-its-module-file-exists")
def case_rebuild_live_missing_while_its_module_file_exists(bench):
    module_file = bench.site.module_file("Ghost/1.0")
    module_file.parent.mkdir()
    module_file.write_text(f'local root = "{bench.site.live("Ghost/1.0")}"\n')
    return Attempt(bench.rebuild("Ghost/1.0"), ("not installed",))


@case("rebuild-live-path-is-a-symlink")
def case_rebuild_live_path_is_a_symlink(bench):
    live = bench.site.live(APP)
    bench.move_out(live, "TinyApp-1.0")
    return Attempt(bench.rebuild(APP), ("symbolic link", str(live)))


@case("rebuild-live-name-dir-is-a-symlink")
def case_rebuild_live_name_dir_is_a_symlink(bench):
    name_dir = bench.site.software / "TinyApp"
    bench.move_out(name_dir, "TinyApp")
    return Attempt(bench.rebuild(APP), ("symbolic link", str(name_dir)))


@case("rebuild-live-path-is-a-file")
def case_rebuild_live_path_is_a_file(bench):
    live = bench.site.live(APP)
    shutil.rmtree(live)
    live.write_text("not an install\n")
    return Attempt(bench.rebuild(APP), ("not a directory", str(live)))


# --- rebuild: --module values that could leave a root (item 4) -----------------------------

MODULE_VALUES = {
    "parent-first": "../x/1",
    "parent-inside": "a/../b",
    "no-version": "a",
    "three-parts": "a/b/c",
    "absolute": "/abs/1",
    "hidden-name": ".hidden/1",
    "parent-as-version": "TinyApp/..",
    "hidden-version": "TinyApp/.1.0",
    "trailing-slash": "TinyApp/1.0/",
    "empty": "",
}
# Three plain parts are a hierarchical name (Core/toy/0.0): refused as no live module file.
_HIERARCHICAL_VALUES = {"a/b/c": "matches no live module file"}
for _label, _value in MODULE_VALUES.items():

    def _module_value(bench, value=_value):
        if value in _HIERARCHICAL_VALUES:
            return Attempt(bench.rebuild_with([value]), (_HIERARCHICAL_VALUES[value], f"--module {value} "))
        return Attempt(bench.rebuild_with([value]), ("not NAME/VERSION", repr(value)))

    case(f"rebuild-module-value-{_label}")(_module_value)


@case("rebuild-module-value-bad-after-a-good-one")
def case_rebuild_module_value_bad_after_a_good_one(bench):
    return Attempt(bench.rebuild_with([APP, "../x/1"]), ("not NAME/VERSION", "'../x/1'"))


# --- rebuild: symlinks in the module path, also with the file missing (item 5) -------------


@case("rebuild-module-name-dir-is-a-symlink")
def case_rebuild_module_name_dir_is_a_symlink(bench):
    module_dir = bench.site.modules / "all" / "TinyApp"
    bench.move_out(module_dir, "modules-TinyApp")
    return Attempt(bench.rebuild(APP), ("symbolic link", str(module_dir)))


@case("rebuild-module-name-dir-is-a-symlink-and-the-module-file-is-missing")
def case_rebuild_module_name_dir_is_a_symlink_and_the_module_file_is_missing(bench):
    module_dir = bench.site.modules / "all" / "TinyLib"
    shutil.rmtree(module_dir)
    module_dir.symlink_to(bench.elsewhere("empty-module-dir"), target_is_directory=True)
    return Attempt(bench.rebuild(LIB), ("symbolic link", str(module_dir)))


@case("rebuild-modules-all-is-a-symlink")
def case_rebuild_modules_all_is_a_symlink(bench):
    all_dir = bench.site.modules / "all"
    bench.move_out(all_dir, "modules-all")
    return Attempt(bench.rebuild(APP), ("symbolic link", str(all_dir)))


@case("rebuild-module-file-is-a-symlink")
def case_rebuild_module_file_is_a_symlink(bench):
    # Design item 12 allows this refusal to come in planning, after the build: then the run
    # leaves a failed journal, so only the live trees are compared.
    module_file = bench.site.module_file(APP)
    bench.move_out(module_file, "modulefiles", "1.0.lua")
    return Attempt(bench.rebuild(APP), ("symbolic link", str(module_file)), scope="trees", may_build=True)


# --- rebuild: options ----------------------------------------------------------------------


@case("rebuild-installpath-software-without-modules")
def case_rebuild_installpath_software_without_modules(bench):
    args = [
        "rebuild",
        f"--installpath-software={bench.site.software}",
        "--module",
        APP,
        "--",
        "TinyApp-1.0.eb",
    ]
    return Attempt(args, ("--installpath-software and --installpath-modules go together",))


@case("rebuild-installpath-modules-without-software")
def case_rebuild_installpath_modules_without_software(bench):
    args = ["rebuild", f"--installpath-modules={bench.site.modules}", "--module", APP, "--", "TinyApp-1.0.eb"]
    return Attempt(args, ("--installpath-software and --installpath-modules go together",))


@case("rebuild-no-installpath")
def case_rebuild_no_installpath(bench):
    return Attempt(["rebuild", "--module", APP, "--", "TinyApp-1.0.eb"], ("no install path",))


@case("rebuild-no-module")
def case_rebuild_no_module(bench):
    return Attempt(["rebuild", f"--installpath={bench.site.installpath}", "--", "x.eb"], ("--module",))


@case("rebuild-unknown-backend")
def case_rebuild_unknown_backend(bench):
    return Attempt(
        bench.rebuild(APP, extra=("--backend", "chroot")), ("--backend chroot is not one of auto, bwrap",)
    )


@case("rebuild-eb-not-executable")
def case_rebuild_eb_not_executable(bench):
    eb = bench.tmp_path / "eb"
    eb.write_text("#!/bin/sh\nexit 0\n")
    eb.chmod(0o644)
    return Attempt(bench.rebuild(APP, extra=("--eb", str(eb))), ("not an executable file", str(eb)))


@case("rebuild-eb-missing")
def case_rebuild_eb_missing(bench):
    eb = bench.tmp_path / "no-such-eb"
    return Attempt(bench.rebuild(APP, extra=("--eb", str(eb))), ("not an executable file", str(eb)))


@case("rebuild-eb-is-a-directory")
def case_rebuild_eb_is_a_directory(bench):
    eb = bench.elsewhere("eb-dir")
    eb.chmod(0o755)
    return Attempt(bench.rebuild(APP, extra=("--eb", str(eb))), ("not an executable file", str(eb)))


@case("rebuild-eb-from-the-environment-not-executable")
def case_rebuild_eb_from_the_environment_not_executable(bench):
    eb = bench.tmp_path / "eb"
    eb.write_text("#!/bin/sh\nexit 0\n")
    eb.chmod(0o600)
    return Attempt(bench.rebuild(APP), ("not an executable file", str(eb)), env={"EB_STAGED_REBUILD_EB": eb})


@case("rebuild-ledger-config-missing")
def case_rebuild_ledger_config_missing(bench):
    config = bench.tmp_path / "no-ledger.json"
    return Attempt(
        bench.rebuild(APP, extra=("--ledger-config", str(config))),
        ("cannot read --ledger-config", str(config)),
    )


@case("rebuild-ledger-config-not-json")
def case_rebuild_ledger_config_not_json(bench):
    config = bench.tmp_path / "ledger.json"
    config.write_text('{"path": \n')
    return Attempt(bench.rebuild(APP, extra=("--ledger-config", str(config))), ("is not JSON", str(config)))


@case("rebuild-ledger-config-relative-ledger-path")
def case_rebuild_ledger_config_relative_ledger_path(bench):
    config = bench.tmp_path / "ledger.json"
    config.write_text(json.dumps({"path": "ledger.jsonl", "site": "test"}))
    return Attempt(
        bench.rebuild(APP, extra=("--ledger-config", str(config))),
        ("'ledger.jsonl' is not absolute", str(config)),
    )


@case("rebuild-ledger-config-not-an-object")
def case_rebuild_ledger_config_not_an_object(bench):
    config = bench.tmp_path / "ledger.json"
    config.write_text(json.dumps([str(bench.tmp_path / "ledger.jsonl")]))
    return Attempt(bench.rebuild(APP, extra=("--ledger-config", str(config))), ('"path"', str(config)))


RUN_IDS = {
    "empty": "",
    "slash": "a/b",
    "dot-dot": "..",
    "hidden": ".run",
    "space": "my run",
    "too-long": "r" * 129,
}
for _label, _value in RUN_IDS.items():

    def _run_id(bench, value=_value):
        return Attempt(bench.rebuild(APP, extra=("--run-id", value)), ("is not a plain name", repr(value)))

    case(f"rebuild-run-id-{_label}")(_run_id)


@case("rebuild-duplicate-module")
def case_rebuild_duplicate_module(bench):
    return Attempt(bench.rebuild_with([APP, LIB, APP]), (f"--module {APP} is given twice",))


@case("rebuild-existing-run-id-of-the-same-module")
def case_rebuild_existing_run_id_of_the_same_module(bench):
    run_id = bench.publish(APP, run_id="r1")
    retired = bench.site.software / "TinyApp" / f".1.0.{run_id}"
    return Attempt(bench.rebuild(APP, extra=("--run-id", run_id)), ("exists already", str(retired)))


@case("rebuild-existing-run-id-of-another-module")
def case_rebuild_existing_run_id_of_another_module(bench):
    run_id = bench.publish(APP, run_id="r1")
    return Attempt(bench.rebuild(LIB, extra=("--run-id", run_id)), (f"run {run_id} exists already",))


@case("rebuild-no-state-root")
def case_rebuild_no_state_root(bench):
    return Attempt(bench.rebuild(APP), ("no state root",), state_root=None)


@case("rebuild-state-root-is-a-symlink")
def case_rebuild_state_root_is_a_symlink(bench):
    link = bench.tmp_path / "state-link"
    link.symlink_to(bench.elsewhere("state"), target_is_directory=True)
    return Attempt(bench.rebuild(APP), ("symbolic link", str(link)), state_root=link)


@case("rebuild-state-root-has-a-symlink-component")
def case_rebuild_state_root_has_a_symlink_component(bench):
    link = bench.tmp_path / "var-link"
    link.symlink_to(bench.elsewhere("var"), target_is_directory=True)
    return Attempt(bench.rebuild(APP), ("symbolic link", str(link)), state_root=link / "state")


@case("rebuild-lock-held-by-another-process")
def case_rebuild_lock_held_by_another_process(bench):
    bench.hold_lock()
    return Attempt(bench.rebuild(APP), ("is locked by another eb-staged-rebuild run", "waited 0 s"))


@case("rebuild-lock-held-by-another-process-past-the-timeout")
def case_rebuild_lock_held_by_another_process_past_the_timeout(bench):
    bench.hold_lock()
    return Attempt(
        ["--lock-timeout", "0.3", *bench.rebuild(APP)],
        ("is locked by another eb-staged-rebuild run", "waited 0.3 s"),
    )


@case("rebuild-negative-lock-timeout-on-a-new-state-root")
def case_rebuild_negative_lock_timeout_on_a_new_state_root(bench):
    return Attempt(["--lock-timeout", "-1", *bench.rebuild(APP)], ("--lock-timeout must be 0 or more",))


# --- journals the tool cannot trust (Residual limits: schemas 1 and 3; item 19) ------------

JOURNAL_COMMANDS = {
    "status": lambda run_id: ["status"],
    "status-run": lambda run_id: ["status", run_id],
    "resume": lambda run_id: ["resume"],
    "resume-run": lambda run_id: ["resume", run_id],
    "rollback": lambda run_id: ["rollback", run_id],
    "gc": lambda run_id: ["gc", "--grace-hours", "0"],
}
for _schema in (1, 3):
    for _label, _command in JOURNAL_COMMANDS.items():

        def _old_schema(bench, schema=_schema, command=_command):
            bench.history()  # a healthy run beside the old one
            run_id = bench.schema_journal(schema)
            path = journal_path(bench.site.state_root, run_id)
            return Attempt(command(run_id), (f"schema {schema}", "generation-pointer", str(path)))

        case(f"schema-{_schema}-journal-{_label}")(_old_schema)


@case("unknown-schema-journal-status")
def case_unknown_schema_journal_status(bench):
    run_id = bench.history()
    path = journal_path(bench.site.state_root, run_id)
    data = read_journal(bench.site.state_root, run_id)
    data["schema"] = 9
    path.write_text(json.dumps(data))
    return Attempt(["status"], ("unknown schema 9", str(path)))


TRUNCATED_COMMANDS = {
    "status": lambda run_id: ["status"],
    "status-run": lambda run_id: ["status", run_id],
    "gc": lambda run_id: ["gc", "--grace-hours", "0"],
    "gc-dry-run": lambda run_id: ["gc", "--grace-hours", "0", "--dry-run"],
    "resume": lambda run_id: ["resume"],
    "rollback": lambda run_id: ["rollback", run_id],
}
for _label, _command in TRUNCATED_COMMANDS.items():

    def _truncated(bench, command=_command):
        healthy = bench.history()
        broken = bench.publish(LIB)
        path = journal_path(bench.site.state_root, broken)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        assert healthy != broken
        return Attempt(command(broken), ("truncated or not JSON", str(path)))

    case(f"truncated-journal-{_label}")(_truncated)


@case("rollback-unknown-run-id")
def case_rollback_unknown_run_id(bench):
    bench.history()
    return Attempt(["rollback", "20991231T000000Z-abcdef"], ("no run 20991231T000000Z-abcdef",))


@case("status-unknown-run-id")
def case_status_unknown_run_id(bench):
    bench.history()
    return Attempt(["status", "nope"], ("no run nope",))


@case("resume-unknown-run-id")
def case_resume_unknown_run_id(bench):
    bench.history()
    return Attempt(["resume", "nope"], ("no run nope",))


@case("resume-empty-run-id")
def case_resume_empty_run_id(bench):
    # '' is no run id: it must not be read as "every run".
    bench.history()
    return Attempt(["resume", ""], ("run id '' is not a plain name",))


@case("status-empty-run-id")
def case_status_empty_run_id(bench):
    bench.history()
    return Attempt(["status", ""], ("run id '' is not a plain name",))


@case("rollback-run-id-leaving-the-runs-dir")
def case_rollback_run_id_leaving_the_runs_dir(bench):
    bench.history()
    return Attempt(["rollback", "../retired"], ("is not a plain name",))


@case("rollback-of-a-failed-run")
def case_rollback_of_a_failed_run(bench):
    done = run_tool(bench.site, bench.rebuild(APP), env={"FAKE_EB_FAIL": "1"})
    assert done.returncode == 2
    (run_id,) = os.listdir(bench.site.state_root / "runs")
    return Attempt(["rollback", run_id], ("is failed, not published",))


@case("gc-journal-records-the-stable-path-as-retired")
def case_gc_journal_records_the_stable_path_as_retired(bench):
    run_id = bench.publish(APP)
    path = journal_path(bench.site.state_root, run_id)
    data = read_journal(bench.site.state_root, run_id)
    data["modules"][0]["retired_path"] = data["modules"][0]["stable_path"]
    path.write_text(json.dumps(data))
    return Attempt(
        ["gc", "--grace-hours", "0"],
        ("modules[0].retired_path", str(bench.site.live(APP)), "is not <software>/TinyApp/.1.0."),
    )


@case("gc-negative-grace-hours")
def case_gc_negative_grace_hours(bench):
    bench.history()
    return Attempt(["gc", "--grace-hours", "-1"], ("--grace-hours must not be negative",))


@case("gc-grace-hours-past-any-date")
def case_gc_grace_hours_past_any_date(bench):
    bench.history()
    return Attempt(
        ["gc", "--dry-run", "--grace-hours", "1e12"],
        ("--grace-hours must be at most 876000 hours (100 years), not 1e+12",),
    )


@case("gc-grace-hours-from-the-environment-not-a-number")
def case_gc_grace_hours_from_the_environment_not_a_number(bench):
    bench.history()
    return Attempt(
        ["gc"],
        ("EB_STAGED_REBUILD_GRACE_HOURS='soon' is not a number",),
        env={"EB_STAGED_REBUILD_GRACE_HOURS": "soon"},
    )


@case("gc-grace-hours-from-the-environment-negative")
def case_gc_grace_hours_from_the_environment_negative(bench):
    bench.history()
    return Attempt(["gc"], ("must not be negative",), env={"EB_STAGED_REBUILD_GRACE_HOURS": "-2"})


@case("status-of-a-state-root-never-used")
def case_status_of_a_state_root_never_used(bench):
    return Attempt(["status"], ("has no runs", str(bench.site.state_root)))


# --- the state root: absent, a link, or locked, for every command that uses one (item 9) -----

STATE_COMMANDS = {
    "status": lambda bench, run_id: ["status"],
    "resume": lambda bench, run_id: ["resume"],
    "rollback": lambda bench, run_id: ["rollback", run_id],
    "gc": lambda bench, run_id: ["gc", "--grace-hours", "0"],
    "retire": lambda bench, run_id: ["retire", str(bench.site.module_file(LIB)), "--reason", "moved"],
}
for _label, _command in STATE_COMMANDS.items():

    def _no_state_root(bench, command=_command):
        run_id = bench.history()
        return Attempt(command(bench, run_id), ("no state root",), state_root=None)

    def _state_root_link(bench, command=_command):
        run_id = bench.history()
        link = bench.tmp_path / "state-link"
        link.symlink_to(bench.site.state_root, target_is_directory=True)
        return Attempt(command(bench, run_id), ("symbolic link", str(link)), state_root=link)

    def _state_root_link_component(bench, command=_command):
        run_id = bench.history()
        link = bench.tmp_path / "var-link"
        link.symlink_to(bench.tmp_path, target_is_directory=True)
        return Attempt(command(bench, run_id), ("symbolic link", str(link)), state_root=link / "state")

    case(f"{_label}-no-state-root")(_no_state_root)
    case(f"{_label}-state-root-is-a-symlink")(_state_root_link)
    case(f"{_label}-state-root-has-a-symlink-component")(_state_root_link_component)
    if _label != "status":  # status takes no lock: it only reads atomically written journals

        def _locked(bench, command=_command):
            run_id = bench.history()
            bench.hold_lock()
            return Attempt(
                command(bench, run_id), ("is locked by another eb-staged-rebuild run", "waited 0 s")
            )

        case(f"{_label}-lock-held-by-another-process")(_locked)


# --- retire (Retiring a copy that moved elsewhere) ------------------------------------------


@case("retire-a-directory")
def case_retire_a_directory(bench):
    bench.history()
    module_dir = bench.site.modules / "all" / "TinyLib"
    return Attempt(["retire", str(module_dir), "--reason", "moved"], ("not a regular file", str(module_dir)))


@case("retire-a-fifo")
def case_retire_a_fifo(bench):
    bench.history()
    fifo = bench.site.modules / "all" / "TinyLib" / "2.0.lua"
    os.mkfifo(fifo)
    return Attempt(["retire", str(fifo), "--reason", "moved"], ("not a regular file", str(fifo)))


@case("retire-a-symlink")
def case_retire_a_symlink(bench):
    bench.history()
    module_file = bench.site.module_file(LIB)
    bench.move_out(module_file, "modulefiles", "1.0.lua")
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("symbolic link", str(module_file)))


@case("retire-through-a-symlinked-directory")
def case_retire_through_a_symlinked_directory(bench):
    bench.history()
    link = bench.tmp_path / "modules-link"
    link.symlink_to(bench.site.modules, target_is_directory=True)
    module_file = link / "all" / "TinyLib" / "1.0.lua"
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("symbolic link", str(link)))


@case("retire-without-root-assignment")
def case_retire_without_root_assignment(bench):
    bench.history()
    module_file = bench.site.module_file(LIB)
    module_file.write_text('help([[no root here]])\nprepend_path("PATH", "/opt/tinylib/bin")\n')
    return Attempt(
        ["retire", str(module_file), "--reason", "moved"], ("no root assignment", str(module_file))
    )


@case("retire-a-module-file-rooted-outside-the-software-root")
def case_retire_a_module_file_rooted_outside_the_software_root(bench):
    # Accepted once, gc then listed /etc as "delete it by hand when sure" (issue 18, defect 11).
    bench.history()
    module_file = bench.site.module_file(LIB)
    module_file.write_text('local root = "/etc"\nprepend_path("PATH", pathJoin(root, "bin"))\n')
    return Attempt(
        ["retire", str(module_file), "--reason", "moved"],
        ("root /etc", "not under the software root", str(bench.site.software)),
    )


@case("retire-a-module-file-rooted-at-the-software-root-itself")
def case_retire_a_module_file_rooted_at_the_software_root_itself(bench):
    bench.history()
    module_file = bench.site.module_file(LIB)
    module_file.write_text(f'local root = "{bench.site.software}/TinyLib/.."\n')
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("not under the software root",))


@case("retire-a-module-file-outside-a-module-tree")
def case_retire_a_module_file_outside_a_module_tree(bench):
    bench.history()
    module_file = bench.elsewhere("loose") / "1.0.lua"
    module_file.write_text(f'local root = "{bench.site.live(LIB)}"\n')
    return Attempt(
        ["retire", str(module_file), "--reason", "moved"], ("not in a module tree", str(module_file))
    )


@case("retire-already-retired")
def case_retire_already_retired(bench):
    bench.history()
    module_file = bench.site.module_file(LIB)
    done = run_tool(bench.site, ["retire", str(module_file), "--reason", "moved"])
    assert done.returncode == 0, done.stderr
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("already retired", str(module_file)))


@case("retire-missing-file")
def case_retire_missing_file(bench):
    bench.history()
    module_file = bench.site.module_file("TinyLib/9.9")
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("does not exist", str(module_file)))


@case("retire-blank-reason")
def case_retire_blank_reason(bench):
    bench.history()
    return Attempt(["retire", str(bench.site.module_file(LIB)), "--reason", "  "], ("--reason",))


@case("retire-lock-held-with-a-timeout")
def case_retire_lock_held_with_a_timeout(bench):
    bench.history()
    bench.hold_lock()
    args = ["--lock-timeout", "0.2", "retire", str(bench.site.module_file(LIB)), "--reason", "moved"]
    return Attempt(args, ("is locked by another eb-staged-rebuild run", "waited 0.2 s"))


@case("retire-a-symlink-before-any-state-root-exists")
def case_retire_a_symlink_before_any_state_root_exists(bench):
    # "A refused request changes nothing on disk": not even an empty state root appears.
    module_file = bench.site.module_file(LIB)
    bench.move_out(module_file, "modulefiles", "1.0.lua")
    return Attempt(["retire", str(module_file), "--reason", "moved"], ("symbolic link", str(module_file)))


@case("retire-to-a-state-root-on-another-filesystem")
def case_retire_to_a_state_root_on_another_filesystem(bench):
    # /dev/shm is a tmpfs, the test directory is not: the rename would not be atomic.
    other = Path(tempfile.mkdtemp(prefix="eb-staged-refusal-", dir="/dev/shm"))
    bench.cleanups.append(lambda: shutil.rmtree(other, ignore_errors=True))
    state_root = other / "state"
    LockHolder(state_root, bench.package_root).release()  # a used state root: runs/, retired/, locks
    assert os.stat(bench.tmp_path).st_dev != os.stat(other).st_dev, "the premise: two filesystems"
    module_file = bench.site.module_file(LIB)
    return Attempt(
        ["retire", str(module_file), "--reason", "moved"],
        ("another filesystem", str(state_root)),
        state_root=state_root,
        extra_roots=(other,),
    )


@case("rollback-retire-when-the-module-file-exists-again")
def case_rollback_retire_when_the_module_file_exists_again(bench):
    module_file = bench.site.module_file(LIB)
    done = run_tool(bench.site, ["--json", "retire", str(module_file), "--reason", "moved"])
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    module_file.write_text(f'local root = "{bench.site.live(LIB)}"\n-- installed again\n')
    return Attempt(["rollback", run_id], ("exists again", str(module_file)))


# --- the command line itself: argparse's refusals must keep the one-line contract too -------


@case("cli-lock-timeout-not-a-number")
def case_cli_lock_timeout_not_a_number(bench):
    return Attempt(["--lock-timeout", "soon", "status"], ("--lock-timeout", "'soon'"))


@case("cli-retire-without-reason")
def case_cli_retire_without_reason(bench):
    bench.history()
    return Attempt(["retire", str(bench.site.module_file(LIB))], ("--reason",))


@case("cli-unknown-command")
def case_cli_unknown_command(bench):
    return Attempt(["deploy"], ("'deploy'",))


@case("probe-missing-path")
def case_probe_missing_path(bench):
    path = bench.tmp_path / "no-such-dir"
    return Attempt(["probe", "--path", str(path)], ("not a directory", str(path)))


@pytest.fixture
def bench(staged_site, tmp_path, package_root):
    bench = Bench(staged_site, tmp_path, package_root)
    yield bench
    for cleanup in reversed(bench.cleanups):
        cleanup()


def _snapshot(bench, attempt):
    if attempt.scope == "trees":
        return snapshot(bench.site.software, bench.site.modules)
    return snapshot(bench.tmp_path, *attempt.extra_roots)


@pytest.mark.parametrize("name", list(CASES))
def test_a_refused_request_exits_2_says_why_in_one_line_and_changes_nothing(bench, name):
    attempt = CASES[name](bench)
    env = {"FAKE_EB_ARGS_LOG": bench.eb_log, **attempt.env}
    before = _snapshot(bench, attempt)

    done = run_tool(bench.site, attempt.args, env=env, state_root=attempt.state_root)

    line = refusal_line(done)
    for why in attempt.why:
        assert why in line, (why, line)
    assert _snapshot(bench, attempt) == before
    if not attempt.may_build:
        assert not bench.eb_log.exists(), "EasyBuild was started for a refused request"


def test_a_missing_live_install_is_refused_before_easybuild_and_is_not_created(bench):
    # Design item 7: the builder would create software/Ghost/1.0; it must never be started.
    done = run_tool(bench.site, bench.rebuild("Ghost/1.0"), env={"FAKE_EB_ARGS_LOG": bench.eb_log})

    assert "not installed" in refusal_line(done)
    assert not bench.eb_log.exists()
    assert not os.path.lexists(bench.site.software / "Ghost")
    assert not os.path.lexists(bench.site.state_root)
