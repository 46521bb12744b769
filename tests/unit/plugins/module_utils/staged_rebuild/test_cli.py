"""The ``eb-staged-rebuild`` command in-process: ``cli.main([...])`` with its output captured.

Output shape (one JSON document with ``--json``, text otherwise), exit codes, and the
one-line error contract. Builds use the test builder ``tests/builders/fake-eb`` as ``--eb``;
``FAKE_EB_ARGS_LOG`` records every call of it, which is how a dry run is shown not to
build.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import backends, cli, text
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.support import hostile
from tests.support.staged import FAKE_EB, StagedSite
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import (
    publish_journal,
    retire_journal,
    trees_of,
)

APP = "TinyApp/1.0"
PROG = "eb-staged-rebuild: "


@pytest.fixture
def site(tmp_path, monkeypatch):
    # The parser takes defaults from the environment; none may leak in from the caller's.
    for name in (
        "EB_STAGED_REBUILD_STATE_ROOT",
        "EB_STAGED_REBUILD_EB",
        "EB_STAGED_REBUILD_GRACE_HOURS",
        "EB_STAGED_REBUILD_BACKEND",
    ):
        monkeypatch.delenv(name, raising=False)
    return StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=tmp_path)


@pytest.fixture
def installed(site, tmp_path, monkeypatch):
    """``site`` with APP installed live by the test builder."""
    site.install(APP)
    # Set after the install: from here on, every call of the builder is the tool's.
    monkeypatch.setenv("FAKE_EB_ARGS_LOG", str(tmp_path / "eb-calls.jsonl"))
    return site


def _eb_calls(tmp_path):
    log = tmp_path / "eb-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _main(site, *args):
    return cli.main(["--state-root", str(site.state_root), *args])


def _rebuild_args(site, *extra, run_id="run1"):
    return [
        "rebuild",
        f"--installpath={site.installpath}",
        "--module",
        APP,
        f"--eb={FAKE_EB}",
        f"--run-id={run_id}",
        "--backend=installpath",  # the test builder knows no sandbox
        *extra,
        "--",
        "TinyApp-1.0.eb",
    ]


def _one_line_error(captured):
    assert captured.out == ""
    assert captured.err.startswith(PROG)
    assert captured.err.endswith("\n")
    assert captured.err.count("\n") == 1
    assert "Traceback" not in captured.err
    return captured.err[len(PROG) : -1]


def _commands_joined(out):
    """``out`` with each suggested command on its label's line again: a command too long for
    its line follows its label on the next line, continued with `` \\``."""
    return re.sub(r":\n  (?=eb-staged-rebuild )", ": ", re.sub(r" \\\n +", " ", out))


def _interrupted_run(site, run_id="run1"):
    """A rebuild's journal as a crash during its build leaves it."""
    return publish_journal(
        site.state_root / "runs", run_id, trees_of(site.installpath), state=RunState.BUILDING
    )


# --json and text output


def test_json_prints_one_json_document(site, capsys):
    _interrupted_run(site)
    capsys.readouterr()

    code = _main(site, "--json", "status")

    out = capsys.readouterr().out
    assert code == 0
    assert out.endswith("\n")
    assert out.count("\n") == 1
    assert [run["run_id"] for run in json.loads(out)["runs"]] == ["run1"]


def test_status_as_text_is_a_table_with_a_header_and_the_next_command(site, capsys):
    _interrupted_run(site)

    code = _main(site, "status")

    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "KIND", "STATE", "CREATED", "MODULES"]
    assert lines[1].split()[:3] == ["run1", "publish", "building"]
    assert lines[1].endswith(" ago)  " + APP)
    assert _commands_joined(out).endswith(
        "\nRun run1 is interrupted (building); next: "
        f"eb-staged-rebuild --state-root {site.state_root} resume\n"
    )


def test_gc_as_text_on_a_state_root_without_trees_says_what_it_saw_and_counts(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)

    code = _main(site, "gc", "--no-squeue")

    assert code == 0
    uid = os.geteuid()
    seen = "every process" if uid == 0 else f"only the processes of uid {uid}"
    assert capsys.readouterr().out == (
        f"Processes: 0 checked ({seen} of this node's pid namespace).\n"
        "Slurm: not asked (--no-squeue); trees are kept for the grace period.\n"
        "0 removed, 0 kept, 0 to remove by hand.\n"
    )


def test_a_result_with_interrupted_runs_exits_1(site, capsys):
    _interrupted_run(site)

    code = _main(site, "--json", "gc")

    report = json.loads(capsys.readouterr().out)
    assert code == errors.EXIT_WARNINGS
    assert [run["run_id"] for run in report["interrupted"]] == ["run1"]


def test_the_state_root_can_come_from_the_environment(site, capsys, monkeypatch):
    _interrupted_run(site)
    monkeypatch.setenv("EB_STAGED_REBUILD_STATE_ROOT", str(site.state_root))

    code = cli.main(["--json", "status"])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["run_id"] == "run1"


def test_main_puts_the_previous_sigterm_handler_back(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)
    before = signal.getsignal(signal.SIGTERM)

    _main(site, "status")
    _main(site, "status", "missing")

    assert signal.getsignal(signal.SIGTERM) is before


# errors: one line, exit 2, no traceback


def test_a_missing_state_root_is_one_line_and_exit_2(site, capsys):
    code = cli.main(["status"])

    assert code == errors.EXIT_ERROR
    assert _one_line_error(capsys.readouterr()) == (
        "no state root: give --state-root DIR or set EB_STAGED_REBUILD_STATE_ROOT"
    )


def test_a_state_root_that_never_had_runs_is_refused(site, capsys):
    code = _main(site, "--json", "status")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == (
        f"state root {site.state_root} has no runs (nothing was ever published with it)"
    )
    assert not site.state_root.exists()


def test_an_unknown_run_is_one_line_and_exit_2(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)

    code = _main(site, "rollback", "nope")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == f"no run nope under {site.state_root}/runs"


def test_a_run_id_that_is_not_a_plain_name_is_refused_by_rollback(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)

    code = _main(site, "rollback", "../state")

    assert code == 2
    assert "is not a plain name" in _one_line_error(capsys.readouterr())


@pytest.mark.parametrize("command", ["resume", "status"])
def test_a_run_id_that_leaves_runs_is_refused_by_every_command_that_takes_one(site, capsys, command):
    # A journal beside runs/ is not a run of this state root; resume would act on it.
    (site.state_root / "runs").mkdir(parents=True)
    outside = publish_journal(
        site.state_root, "outside", trees_of(site.installpath), state=RunState.PUBLISHING
    )
    before = (site.state_root / "outside" / "journal.json").read_bytes()

    code = _main(site, command, "../outside")

    assert code == 2
    assert "is not a plain name" in _one_line_error(capsys.readouterr())
    assert (site.state_root / "outside" / "journal.json").read_bytes() == before
    assert journals.Journal.load(outside.path).state is RunState.PUBLISHING


def test_a_broken_journal_is_one_line_and_exit_2(site, capsys):
    (site.state_root / "runs" / "run1").mkdir(parents=True)
    (site.state_root / "runs" / "run1" / "journal.json").write_text('{"schema": 2, "ki')

    code = _main(site, "status")

    assert code == 2
    journal = site.state_root / "runs" / "run1" / "journal.json"
    assert _one_line_error(capsys.readouterr()) == f"journal {journal}: truncated or not JSON (17 bytes)"


def test_an_os_error_is_one_line_naming_the_path_and_exit_2(site, capsys):
    # retired/ is a regular file: creating the state root's layout fails with EEXIST.
    (site.state_root / "runs").mkdir(parents=True)
    (site.state_root / "retired").write_text("not a directory\n")

    code = _main(site, "gc")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == f"File exists ({site.state_root}/retired)"


GRACE_CASES = {
    "the default": (None, [], 144.0),
    "the variable": ("48", [], 48.0),
    "the option over the variable": ("48", ["--grace-hours", "2.5"], 2.5),
}


@pytest.mark.parametrize("case", sorted(GRACE_CASES))
def test_gc_reports_the_grace_period_it_applied(site, capsys, monkeypatch, case):
    variable, option, applied = GRACE_CASES[case]
    (site.state_root / "runs").mkdir(parents=True)
    if variable is not None:
        monkeypatch.setenv("EB_STAGED_REBUILD_GRACE_HOURS", variable)

    code = _main(site, "--json", "gc", "--dry-run", *option)

    assert code == 0
    assert json.loads(capsys.readouterr().out)["grace_hours"] == applied


def test_a_bad_environment_number_is_one_line_and_exit_2(site, capsys, monkeypatch):
    (site.state_root / "runs").mkdir(parents=True)
    monkeypatch.setenv("EB_STAGED_REBUILD_GRACE_HOURS", "a week")

    code = _main(site, "gc")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == "EB_STAGED_REBUILD_GRACE_HOURS='a week' is not a number"


def test_a_negative_grace_period_is_refused(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)

    code = _main(site, "gc", "--grace-hours", "-1")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == "--grace-hours must not be negative"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--module", "../etc"], "--module '../etc' is not NAME/VERSION"),
        (["--module", "Missing/1.0"], "Missing/1.0 is not installed"),
        (["--backend", "chroot"], "--backend chroot is not one of auto, bwrap, userns, installpath"),
        (["--run-id", "a/b"], "run id 'a/b' is not a plain name"),
        (["--eb", "/nonexistent/eb"], "EasyBuild command /nonexistent/eb is not an executable file"),
    ],
)
def test_a_refused_rebuild_request_is_one_line_and_writes_nothing(
    installed, capsys, tmp_path, extra, message
):
    before = installed.snapshot()

    code = _main(installed, *_rebuild_args(installed)[:-2], *extra, "--", "TinyApp-1.0.eb")

    assert code == 2
    assert message in _one_line_error(capsys.readouterr())
    assert installed.snapshot() == before
    assert not installed.state_root.exists()
    assert _eb_calls(tmp_path) == []


def test_a_rebuild_without_an_install_path_is_refused(site, capsys, monkeypatch):
    monkeypatch.delenv("EASYBUILD_INSTALLPATH", raising=False)

    code = _main(site, "rebuild", "--module", APP, f"--eb={FAKE_EB}")

    assert code == 2
    assert _one_line_error(capsys.readouterr()).startswith("no install path")


def _dry_run_trees(site, capsys, *install_args):
    code = _main(site, "--json", "rebuild", *install_args, "--module", APP, f"--eb={FAKE_EB}", "--dry-run")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)["generation"]


def test_an_installpath_on_the_command_line_beats_easybuilds_variables(installed, capsys, monkeypatch):
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_SOFTWARE", "/elsewhere/software")
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_MODULES", "/elsewhere/modules")

    generation = _dry_run_trees(installed, capsys, f"--installpath={installed.installpath}")

    assert generation.startswith(str(installed.software) + "/.eb-staged-rebuild/")


def test_easybuilds_software_variable_beats_its_installpath_variable(installed, capsys, monkeypatch):
    # As in EasyBuild: EASYBUILD_INSTALLPATH_SOFTWARE wins over EASYBUILD_INSTALLPATH/software.
    monkeypatch.setenv("EASYBUILD_INSTALLPATH", "/elsewhere")
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_SOFTWARE", str(installed.software))
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_MODULES", str(installed.modules))

    generation = _dry_run_trees(installed, capsys)

    assert generation.startswith(str(installed.software) + "/.eb-staged-rebuild/")


def test_easybuilds_installpath_variable_alone_names_both_trees(installed, capsys, monkeypatch):
    monkeypatch.setenv("EASYBUILD_INSTALLPATH", str(installed.installpath))
    monkeypatch.delenv("EASYBUILD_INSTALLPATH_SOFTWARE", raising=False)
    monkeypatch.delenv("EASYBUILD_INSTALLPATH_MODULES", raising=False)

    generation = _dry_run_trees(installed, capsys)

    assert generation.startswith(str(installed.software) + "/.eb-staged-rebuild/")


def test_json_after_the_command_is_the_same_as_before_it(installed, capsys):
    (installed.state_root / "runs").mkdir(parents=True)

    code = _main(installed, "status", "--json")

    assert code == 0
    assert json.loads(capsys.readouterr().out)["runs"] == []


def test_debug_re_raises_an_expected_error(site, capsys):
    with pytest.raises(errors.UsageError, match="no state root"):
        cli.main(["--debug", "status"])

    assert capsys.readouterr().err == ""


def test_debug_re_raises_an_os_error(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)
    (site.state_root / "retired").write_text("not a directory\n")

    with pytest.raises(FileExistsError):
        _main(site, "--debug", "gc")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
        (["gc", "--grace-hours", "soon"], "argument --grace-hours: invalid float value: 'soon'"),
        (["retire", "/apps/modules/all/A/1.lua"], "the following arguments are required: --reason"),
    ],
    ids=["unknown-command", "no-command", "bad-number", "missing-option"],
)
def test_bad_usage_is_one_line_and_exit_2(site, capsys, argv, message):
    code = cli.main(argv)

    assert code == 2
    error = _one_line_error(capsys.readouterr())
    assert error.startswith(message)
    assert "(see 'eb-staged-rebuild" in error
    assert error.endswith(" --help')")


def test_a_negative_lock_timeout_is_refused(site, capsys):
    (site.state_root / "runs").mkdir(parents=True)

    code = _main(site, "--lock-timeout", "-1", "gc")

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == "--lock-timeout must be 0 or more seconds, not -1.0"


# rebuild --dry-run


def _expected_command(site, *kept):
    generation = site.software / ".eb-staged-rebuild" / "run1"
    return [
        str(FAKE_EB),
        *kept,
        "--rebuild",
        "--module-syntax=Lua",
        f"--installpath-data={generation}/data",
        "--suffix-modules-path=all",
        "--disable-remove-ghost-install-dirs",
        "--disable-bwrap",
        f"--installpath-software={generation}/software",
        f"--installpath-modules={generation}/modules",
    ]


def test_dry_run_prints_the_exact_command_and_writes_nothing(installed, capsys, tmp_path):
    before = installed.snapshot()

    code = _main(installed, "--json", *_rebuild_args(installed, "--dry-run"))

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["command"] == _expected_command(installed, "TinyApp-1.0.eb")
    assert (result["dry_run"], result["changed"], result["modules"]) == (True, False, [APP])
    assert (result["backend"], result["sandboxed"]) == ("installpath", False)
    assert set(result["probes"]) == {"bwrap", "userns", "max_user_namespaces", "auto_backend"}
    assert not installed.state_root.exists()
    assert not (installed.software / ".eb-staged-rebuild").exists()
    assert installed.snapshot() == before
    assert _eb_calls(tmp_path) == []


def _without_backend(args):
    return [arg for arg in args if not arg.startswith("--backend")]


def test_the_backend_comes_from_eb_staged_rebuild_backend_when_no_option_names_one(
    installed, capsys, monkeypatch
):
    monkeypatch.setenv("EB_STAGED_REBUILD_BACKEND", "installpath")

    code = _main(installed, "--json", *_without_backend(_rebuild_args(installed, "--dry-run")))

    assert code == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "installpath"


def test_the_backend_option_beats_eb_staged_rebuild_backend(installed, capsys, monkeypatch):
    monkeypatch.setenv("EB_STAGED_REBUILD_BACKEND", "bwrap")

    code = _main(installed, "--json", *_rebuild_args(installed, "--dry-run"))

    assert code == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "installpath"


def test_a_bad_eb_staged_rebuild_backend_is_one_line_and_writes_nothing(
    installed, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("EB_STAGED_REBUILD_BACKEND", "chroot")
    before = installed.snapshot()

    code = _main(installed, *_without_backend(_rebuild_args(installed)))

    assert code == 2
    assert _one_line_error(capsys.readouterr()) == (
        "EB_STAGED_REBUILD_BACKEND='chroot' is not one of auto, bwrap, userns, installpath"
    )
    assert installed.snapshot() == before
    assert not installed.state_root.exists()
    assert _eb_calls(tmp_path) == []


def test_dry_run_lists_the_options_it_removed(installed, capsys):
    args = [
        *_rebuild_args(installed, "--dry-run")[:-1],
        "--installpath=/elsewhere",
        "--robot",
        "TinyApp-1.0.eb",
    ]

    _main(installed, "--json", *args)

    result = json.loads(capsys.readouterr().out)
    assert result["removed_options"] == ["--installpath=/elsewhere"]
    assert result["command"] == _expected_command(installed, "--robot", "TinyApp-1.0.eb")


def test_dry_run_as_text_prints_each_argument_of_the_command(installed, capsys):
    code = _main(installed, *_rebuild_args(installed, "--dry-run"))

    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Dry run: would rebuild {APP} with backend installpath, no sandbox")
    start = lines.index("EasyBuild's command:")
    expected = _expected_command(installed, "TinyApp-1.0.eb")
    assert lines[start + 1 : start + 1 + len(expected)] == [
        *(f"  {arg} \\" for arg in expected[:-1]),
        f"  {expected[-1]}",
    ]
    assert not installed.state_root.exists()


# rebuild for real, in-process


def test_rebuild_with_json_prints_one_document_and_only_the_warning_on_stderr(installed, capsys, tmp_path):
    code = _main(installed, "--json", *_rebuild_args(installed))

    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.count("\n") == 1
    result = json.loads(captured.out)
    assert (result["run_id"], result["state"], result["changed"]) == ("run1", "published", True)
    assert captured.err == backends.UNSANDBOXED + "\n"
    assert installed.payload(APP) == "new build"
    assert len(_eb_calls(tmp_path)) == 1


def test_rebuild_as_text_streams_easybuilds_progress_to_stderr(installed, capsys):
    code = _main(installed, *_rebuild_args(installed))

    captured = capsys.readouterr()
    assert code == 0
    assert "== building and installing TinyApp/1.0..." in captured.err.splitlines()
    assert captured.out.startswith(
        "Published run run1: 1 module swapped in (backend installpath, no sandbox).\n"
    )
    assert _commands_joined(captured.out).endswith(
        f"\nUndo: eb-staged-rebuild --state-root {installed.state_root} rollback run1\n"
    )


def test_a_failed_build_is_one_line_and_exit_2(installed, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_EB_FAIL", "1")
    before = installed.snapshot()

    code = _main(installed, "--json", *_rebuild_args(installed))

    captured = capsys.readouterr()
    assert code == 2
    last = captured.err.splitlines()[-1]
    assert last.startswith(PROG + "EasyBuild failed (exit 1); nothing was swapped")
    # --json has the failure as a document too: the builder said nothing EasyBuild would.
    failure = json.loads(captured.out)
    log = str(installed.state_root / "runs" / "run1" / "build.log")
    assert failure == {
        "failed": True,
        "msg": last[len(PROG) :],
        "error": "publish_failed",
        "easybuild_reason": None,
        "build_log": log,
    }
    assert "Traceback" not in captured.err
    assert installed.snapshot() == before


def test_rebuild_then_rollback_in_process(installed, capsys):
    old_inode = installed.live(APP).stat().st_ino
    assert _main(installed, "--json", *_rebuild_args(installed)) == 0
    capsys.readouterr()

    code = _main(installed, "--json", "rollback", "run1")

    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"run_id": "run1", "changed": True, "state": "rolled_back"}
    assert installed.live(APP).stat().st_ino == old_inode
    assert installed.payload(APP) == "old"


def test_a_result_that_cannot_be_worded_is_shown_as_json_with_a_warning(installed, capsys, monkeypatch):
    # The journal read that words the result fails (EIO) after the rebuild published: the
    # disk failing at that moment is what cannot be made to happen here on demand.
    def unreadable(context, run_id):
        raise OSError(errno.EIO, "Input/output error", str(installed.state_root / "runs" / run_id))

    monkeypatch.setattr(text.Context, "journal", unreadable)

    code = _main(installed, *_rebuild_args(installed))

    captured = capsys.readouterr()
    assert code == 0
    assert json.loads(captured.out)["state"] == "published"
    assert captured.err.splitlines()[-1] == (
        f"{PROG}warning: the result is shown as JSON (Input/output error ({installed.state_root}/runs/run1))"
    )
    assert installed.payload(APP) == "new build"


def test_resume_as_text_names_an_interrupted_retire_and_the_rollback_that_resolves_it(site, capsys):
    run_id = "retire-20261202T101500123456Z"
    retire_journal(
        site.state_root / "runs",
        run_id,
        module_file=site.module_file(APP),
        software_dir=site.live(APP),
        state=RunState.RETIRING,
    )

    code = _main(site, "resume")

    assert code == 0
    assert capsys.readouterr().out == (
        f"Run {run_id} (retiring): retire record: 'eb-staged-rebuild rollback\n  {run_id}' resolves it\n"
    )
    assert journals.find(str(site.state_root), run_id).state is RunState.RETIRING


# Values that another user (or a hand-edited journal) chose: shown escaped, never obeyed.


def test_an_error_line_shows_a_hostile_state_root_escaped_on_its_one_line(site, capsys):
    code = cli.main(["--state-root", f"/nowhere/{hostile.SEQUENCES}", "status"])

    captured = capsys.readouterr()
    assert code == errors.EXIT_ERROR
    assert hostile.SHOWN in _one_line_error(captured)
    hostile.assert_shown_safely(captured.err)


def test_status_shows_a_hand_edited_journal_s_values_escaped(site, capsys):
    publish_journal(site.state_root / "runs", "run1", trees_of(site.installpath), state=RunState.PUBLISHED)
    retire_journal(
        site.state_root / "runs",
        "retire-20261202T101500123456Z",
        module_file=site.module_file(APP),
        software_dir=f"{site.software}/{hostile.IN_A_PATH}/1.0",
        reason=hostile.SEQUENCES,
    )

    listed = _main(site, "status")
    out = capsys.readouterr().out
    shown = _main(site, "status", "run1")
    run = capsys.readouterr().out
    retired = _main(site, "status", "retire-20261202T101500123456Z")
    retire = capsys.readouterr().out

    assert (listed, shown, retired) == (0, 0, 0)
    assert f"{hostile.IN_A_PATH_SHOWN}/1.0" in out
    assert f"Reason:      {hostile.SHOWN}\n" in retire
    assert f"Software:\n  {site.software}/{hostile.IN_A_PATH_SHOWN}/1.0\n" in retire
    for output in (out, run, retire):
        hostile.assert_shown_safely(output)


def test_a_journal_whose_backend_holds_terminal_sequences_is_refused_in_one_escaped_line(site, capsys):
    publish = publish_journal(
        site.state_root / "runs", "run1", trees_of(site.installpath), state=RunState.PUBLISHED
    )
    publish.run.backend = hostile.SEQUENCES
    publish.save()

    code = _main(site, "status", "run1")

    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith("eb-staged-rebuild: ")
    assert captured.err.count("\n") == 1
    assert "backend" in captured.err
    hostile.assert_shown_safely(captured.err)


def test_a_state_root_that_is_not_utf_8_is_shown_escaped_and_json_says_which_strings_are(tmp_path, capsys):
    # capsys writes UTF-8 strictly, as stdout does under en_US.UTF-8.
    site = StagedSite(
        installpath=tmp_path / "apps",
        state_root=tmp_path / f"state-{hostile.NOT_UTF8}",
        package_root=tmp_path,
    )
    _interrupted_run(site)

    text_code = _main(site, "status", "run1")
    out = capsys.readouterr().out
    json_code = _main(site, "--json", "status", "run1")
    document = capsys.readouterr().out

    assert (text_code, json_code) == (0, 0)
    assert f"Journal:\n  {tmp_path}/state-\\xff/runs/run1/journal.json\n" in out
    hostile.assert_shown_safely(out)
    shown = json.loads(document)
    # The journal and the live-change record a building run keeps beside it, both in the state root.
    assert shown["escaped"] == ["/run/modules/0/live_record", "/run/journal"]
    assert shown["run"]["journal"] == f"{tmp_path}/state-\\xff/runs/run1/journal.json"
    assert "\\ud" not in document  # no surrogate, escaped or not


# the dry run shows the configuration EasyBuild would build with


def test_dry_run_shows_easybuild_s_configuration_of_the_staged_command_and_builds_nothing(
    installed, capsys, tmp_path
):
    before = installed.snapshot()

    code = _main(installed, "--json", *_rebuild_args(installed, "--dry-run"))

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    configuration = result["easybuild_configuration"]
    assert configuration["error"] is None
    # The test builder answers --show-config with the install paths of the staged command.
    generation = installed.software / ".eb-staged-rebuild" / "run1"
    assert f"installpath-software                     (C) = {generation}/software" in configuration["text"]
    assert installed.snapshot() == before
    assert not (tmp_path / "eb-calls.jsonl").exists()  # no build ran


def test_dry_run_as_text_lists_easybuild_s_configuration(installed, capsys):
    code = _main(installed, *_rebuild_args(installed, "--dry-run"))

    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    start = lines.index("EasyBuild's configuration for this build (eb --show-config):")
    assert "  # Current EasyBuild configuration" in lines[start:]
    assert any(line.startswith("  installpath-modules ") for line in lines[start:])


def test_dry_run_says_when_easybuild_cannot_show_its_configuration(installed, capsys, tmp_path):
    failing = tmp_path / "failing-eb"
    failing.write_text("#!/bin/sh\necho 'ERROR: no such option' >&2\nexit 2\n")
    failing.chmod(0o755)

    code = _main(installed, "--json", *_rebuild_args(installed, "--dry-run", f"--eb={failing}"))

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["easybuild_configuration"] == {
        "text": None,
        "error": "eb --show-config failed (exit 2): ERROR: no such option",
    }


def test_dry_run_gives_easybuild_a_temporary_directory_of_its_own_and_removes_it(installed, capsys, tmp_path):
    # EasyBuild 5.4.1 leaves its temporary directory behind after --show-config.
    record = tmp_path / "tmpdir-given"
    eb = tmp_path / "show-config-eb"
    eb.write_text(
        "#!/bin/sh\n"
        "for arg; do case $arg in --tmpdir=*) dir=${arg#--tmpdir=};; esac; done\n"
        f'mkdir "$dir/eb-left" && echo "$dir" > {record}\n'
        'echo "tmpdir (C) = $dir"\necho "buildpath (E) = /site/build"\n'
    )
    eb.chmod(0o755)

    code = _main(installed, "--json", *_rebuild_args(installed, "--dry-run", f"--eb={eb}"))

    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["easybuild_configuration"] == {"text": "buildpath (E) = /site/build\n", "error": None}
    given = record.read_text().strip()
    assert given
    assert not os.path.exists(given)


# The JSON table of docs/reference/eb-staged-rebuild.md: every key a subcommand prints is in
# its row, and every key of the row that the table does not give as conditional is printed.
# Each subcommand that needs no Slurm job runs here; ``rebuild --job``, ``publish`` and
# ``discard`` act on runs of Slurm jobs, whose documents the job tests read.

REFERENCE = checkout.REPO / "docs" / "reference" / "eb-staged-rebuild.md"
# A cell's names are in backquotes; an option (`--dry-run`) names a case, not a key.
_JSON_KEY = re.compile(r"`([a-z_]+)`")


def json_table() -> dict:
    """Each row of the JSON table: ``{subcommand: (keys, conditional keys)}``. A key is
    conditional when the cell gives it after a ``;`` (``; with --dry-run, would_change``) or
    follows it with ``(only when``; what a parenthesis holds otherwise describes the key."""
    section = REFERENCE.read_text().split("\n## JSON\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        command, keys = cells[0].strip("`"), cells[1]
        conditional = (
            set(_JSON_KEY.findall(re.sub(r"\([^()]*\)", "", keys.split(";", 1)[1]))) if ";" in keys else set()
        )
        conditional |= set(re.findall(r"`([a-z_]+)` \(only when", keys))
        rows[command] = (set(_JSON_KEY.findall(re.sub(r"\([^()]*\)", "", keys))), conditional)
    return rows


@pytest.fixture(scope="module")
def table():
    return json_table()


def _json(capsys, site, *args) -> dict:
    _main(site, "--json", *args)
    return json.loads(capsys.readouterr().out)


def test_the_table_parses_into_a_row_per_subcommand(table):
    assert set(table) == {
        "status",
        "status RUN",
        "rebuild",
        "rebuild --dry-run",
        "rebuild --job",
        "rollback",
        "retire",
        "resume",
        "gc",
        "probe",
        "publish",
        "discard",
    }
    assert table["gc"][1] == {"would_change"}
    assert table["rebuild"][1] == {"warnings"}
    assert "target" not in table["rebuild --job"][0]  # a key of each job, not of the document


def test_each_subcommand_prints_the_json_keys_its_row_lists(installed, capsys, table):
    printed = {
        "rebuild --dry-run": [_json(capsys, installed, *_rebuild_args(installed, "--dry-run"))],
        "rebuild": [_json(capsys, installed, *_rebuild_args(installed))],
        "status": [_json(capsys, installed, "status")],
        "status RUN": [_json(capsys, installed, "status", "run1")],
    }
    printed["rollback"] = [_json(capsys, installed, "rollback", "run1")]
    module_file = installed.installpath / "modules" / "all" / "TinyApp" / "1.0.lua"
    retired = _json(capsys, installed, "retire", str(module_file), "--reason", "on CVMFS")
    printed["retire"] = [retired]
    printed["rollback"].append(_json(capsys, installed, "rollback", retired["run_id"]))
    printed["resume"] = [_json(capsys, installed, "resume")]
    printed["gc"] = [
        _json(capsys, installed, "gc", "--no-squeue", "--dry-run"),
        _json(capsys, installed, "gc", "--no-squeue", "--grace-hours", "0"),
    ]
    printed["probe"] = [_json(capsys, installed, "probe", "--path", str(installed.installpath / "software"))]

    for command, documents in printed.items():
        keys, conditional = table[command]
        seen = set().union(*documents)
        assert seen - keys == set(), f"{command}: printed but not in the table"
        assert keys - conditional - seen == set(), f"{command}: in the table but not printed"
