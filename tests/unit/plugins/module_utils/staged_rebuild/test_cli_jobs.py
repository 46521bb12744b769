"""``rebuild --job`` and the commands of job runs, in-process: what is refused before anything
is written, and the dry run that lists the sbatch commands.

Submitting and running the jobs is ``tests/integration/staged/test_staged_jobs.py``'s, on the
session's real Slurm.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli, submission
from tests.support.staged import FAKE_EB, StagedSite, snapshot

APP = "TinyApp/1.0"
PROG = "eb-staged-rebuild: "


@pytest.fixture
def sites(tmp_path, monkeypatch):
    """Two targets' trees with APP live in each, and the site file naming them."""
    for name in (
        "EB_STAGED_REBUILD_STATE_ROOT",
        "EB_STAGED_REBUILD_EB",
        "EB_STAGED_REBUILD_BACKEND",
        "EB_STAGED_REBUILD_TARGETS",
        "EB_STAGED_REBUILD_COMMAND",
        "EASYBUILD_INSTALLPATH",
    ):
        monkeypatch.delenv(name, raising=False)
    trees = {}
    for name in ("zen3", "icelake"):
        site = StagedSite(
            installpath=tmp_path / name, state_root=tmp_path / name / "state", package_root=tmp_path
        )
        site.install(APP)
        trees[name] = site
    site_file = tmp_path / "site.ini"
    site_file.write_text(
        f"[target zen3]\ncpu = x86_64/amd/zen3\ninstallpath = {trees['zen3'].installpath}\n"
        f"state-root = {trees['zen3'].state_root}\npartition = debug\n\n"
        f"[target icelake]\ncpu = x86_64/intel/icelake\ninstallpath = {trees['icelake'].installpath}\n"
        f"state-root = {trees['icelake'].state_root}\nconstraint = icelake\n"
    )
    monkeypatch.setenv("FAKE_EB_ARGS_LOG", str(tmp_path / "eb-calls.jsonl"))
    return trees, site_file


def _job_args(site_file, *extra):
    return [
        "rebuild",
        "--job",
        f"--targets-file={site_file}",
        "--module",
        APP,
        f"--eb={FAKE_EB}",
        "--run-id=run1",
        "--backend=installpath",
        *extra,
        "--",
        "TinyApp-1.0.eb",
    ]


def _one_line_error(captured):
    assert captured.out == ""
    assert captured.err.startswith(PROG)
    assert captured.err.count("\n") == 1
    assert "Traceback" not in captured.err
    return captured.err[len(PROG) : -1]


def test_the_request_the_refusals_change_is_accepted(sites, capsys):
    _trees, site_file = sites
    assert cli.main(_job_args(site_file, "--target", "zen3", "--publish", "together", "--dry-run")) == 0


REFUSALS = [
    # (arguments after rebuild's, what the line says)
    (["--target", "haswell"], r"--target 'haswell' is not a target of .*site\.ini \(zen3, icelake\)"),
    (["--target", "zen3", "--target", "zen3"], "--target zen3 is given twice"),
    (["--target", "all", "--target", "zen3"], "--target all goes alone"),
    (["--target", "zen3", "--job-cores", "0"], "--job-cores must be 1 or more, not 0"),
    (["--target", "zen3", "--job-cores", "two"], "--job-cores 'two' is not a whole number"),
    (
        ["--target", "zen3", "--job-max-walltime", "-1"],
        "--job-max-walltime must be a number of hours above 0",
    ),
    (["--target", "zen3", "--publish", "later"], "--publish later is not one of each, together"),
    (["--target", "zen3", "--installpath", "/apps"], "--state-root and --installpath go without --target"),
    (["--target", "zen3", "--module", "Missing/1.0"], "Missing/1.0"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSALS)
def test_a_wrong_job_request_is_refused_in_one_line_and_nothing_is_written(
    sites, tmp_path, capsys, extra, message
):
    _trees, site_file = sites
    before = snapshot(tmp_path)

    code = cli.main(_job_args(site_file, *extra))

    assert code == 2
    assert re.search(message, _one_line_error(capsys.readouterr()))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--publish", "together"], "--publish goes with --job"),
        (["--target", "zen3"], "--target goes with --job"),
        (["--job-cores", "4"], "--job-cores goes with --job"),
        (["--job-max-walltime", "4"], "--job-max-walltime goes with --job"),
    ],
)
def test_job_options_without_job_are_refused(sites, tmp_path, capsys, args, message):
    trees, site_file = sites
    before = snapshot(tmp_path)
    argv = [arg for arg in _job_args(site_file, *args) if arg != "--job"]

    assert cli.main(["--state-root", str(trees["zen3"].state_root), *argv]) == 2
    assert _one_line_error(capsys.readouterr()) == message
    assert snapshot(tmp_path) == before


def test_target_without_a_site_file_is_refused(sites, tmp_path, capsys):
    _trees, _site_file = sites
    before = snapshot(tmp_path)
    argv = [arg for arg in _job_args("x", "--target", "zen3") if not arg.startswith("--targets-file")]

    assert cli.main(argv) == 2
    assert _one_line_error(capsys.readouterr()) == (
        "--target needs a site file: --targets-file FILE or $EB_STAGED_REBUILD_TARGETS"
    )
    assert snapshot(tmp_path) == before


def test_without_sbatch_a_submission_is_refused_before_any_journal(sites, tmp_path, capsys, monkeypatch):
    _trees, site_file = sites
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))
    before = snapshot(tmp_path)

    assert cli.main(_job_args(site_file, "--target", "all")) == 2
    assert _one_line_error(capsys.readouterr()).startswith("sbatch not found on PATH")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["status", "publish run1", "discard run1"])
def test_commands_on_targets_need_a_site_file(sites, capsys, command):
    assert cli.main([*command.split(), "--target", "zen3"]) == 2
    assert _one_line_error(capsys.readouterr()).startswith("--target needs a site file")


def test_a_dry_run_lists_each_target_s_sbatch_command_and_the_publish_job(
    sites, tmp_path, capsys, monkeypatch
):
    trees, site_file = sites
    monkeypatch.setenv("EB_STAGED_REBUILD_COMMAND", "/opt/bin/eb-staged-rebuild")
    before = snapshot(tmp_path)

    code = cli.main(
        [
            "--json",
            *_job_args(
                site_file,
                "--target=all",
                "--publish=together",
                "--job-cores=4",
                "--job-max-walltime=2",
                "--dry-run",
            ),
        ]
    )

    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert snapshot(tmp_path) == before  # no journal, no build
    assert not (tmp_path / "eb-calls.jsonl").exists()
    assert (result["changed"], result["dry_run"], result["run_id"]) == (False, True, "run1")
    zen3, icelake, publish = result["jobs"]
    zen3_root, icelake_root = str(trees["zen3"].state_root), str(trees["icelake"].state_root)
    assert zen3["sbatch"] == [
        "sbatch",
        "--parsable",
        "--job-name=eb-staged-rebuild:run1:zen3",
        f"--output={zen3_root}/runs/run1/job-%j.out",
        "--cpus-per-task=4",
        "--time=120",
        "--partition=debug",
    ]
    assert icelake["sbatch"][-1] == "--constraint=icelake"
    assert icelake["state_root"] == icelake_root
    assert shlex.split(zen3["script"].splitlines()[1]) == [
        "exec",
        "/opt/bin/eb-staged-rebuild",
        "job-start",
        "run1",
        "--state-root",
        zen3_root,
        "--targets-file",
        str(site_file),
    ]
    assert publish["publish"] is True
    assert publish["sbatch"][-2:] == [
        "--dependency=afterok:<job of zen3>:<job of icelake>",
        "--kill-on-invalid-dep=yes",
    ]
    assert shlex.split(publish["script"].splitlines()[1])[2:4] == ["--lock-timeout", "60"]
    assert shlex.split(publish["script"].splitlines()[1])[4:] == [
        "publish",
        "run1",
        "--targets-file",
        str(site_file),
        "--target",
        "zen3",
        "--target",
        "icelake",
    ]


def test_a_dry_run_without_targets_is_one_job_in_the_state_root_given(sites, capsys, monkeypatch):
    trees, site_file = sites
    site = trees["zen3"]
    monkeypatch.setenv("EB_STAGED_REBUILD_COMMAND", "/opt/bin/eb-staged-rebuild")
    argv = [arg for arg in _job_args(site_file, "--dry-run") if not arg.startswith("--targets-file")]
    argv.insert(2, f"--installpath={site.installpath}")

    code = cli.main(["--state-root", str(site.state_root), *argv])

    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("Dry run: would queue run run1 and submit 1 jobs; nothing was submitted.\n")
    assert "--job-name=eb-staged-rebuild:run1 " in out
    assert "--targets-file" not in out  # no target: no archdetect check
    assert f"job-start run1 --state-root {site.state_root}" in out


def test_the_command_a_job_runs_is_the_variable_s_else_this_one_s(monkeypatch):
    assert submission.tool_command({"EB_STAGED_REBUILD_COMMAND": "/opt/x"}, ["/usr/bin/y"]) == ["/opt/x"]
    assert submission.tool_command({}, ["/usr/bin/y"]) == ["/usr/bin/y"]
    assert submission.tool_command({}, []) == ["/usr/local/bin/eb-staged-rebuild"]
    with pytest.raises(Exception, match="is not an absolute path"):
        submission.tool_command({"EB_STAGED_REBUILD_COMMAND": "eb-staged-rebuild"}, [])


def test_job_start_takes_its_state_root_after_the_command():
    args = cli.build_parser().parse_args(["job-start", "run1", "--state-root", "/s", "--targets-file", "/f"])
    assert (args.run_id, args.state_root, args.targets_file) == ("run1", "/s", "/f")
    # Before the command, as every other command takes it, it is the same option.
    args = cli.build_parser().parse_args(["--state-root", "/s", "job-start", "run1"])
    assert args.state_root == "/s"
    assert os.path.isabs(args.state_root)
