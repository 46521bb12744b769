"""The planner: build evidence, the writable window, the live-change record, and ``plan``.

``plan`` runs on a real build: the test builder ``tests/builders/fake-eb`` installs the live
tree and then builds the replacement into the run's generation, as EasyBuild would. Every
refusal is checked to leave the live directory (inode and bytes) and its module file as
they were.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import faults as faults_module
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    fsutil,
    modulefile,
    paths,
    planner,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState, StepStatus
from tests.support.staged import FAKE_EB, StagedSite
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal

APP = "TinyApp/1.0"
LIB = "TinyLib/1.0"
PLAN_STEPS = ["marker", "prepare-module", "backup", "stage-move"]
# Each step is a fault point, and so is the write that journals it done.
PLAN_POINTS = [point for name in PLAN_STEPS for point in (f"{name} {APP}", f"journal {name} {APP}")]
# What EasyBuild's --read-only-installdir leaves on an install: read and search, no write.
SEALED = 0o555


# has_build_evidence


def test_a_payload_file_is_build_evidence(tmp_path):
    (tmp_path / "PAYLOAD").write_text("new build\n")

    assert planner.has_build_evidence(str(tmp_path)) is True


def test_an_easyconfig_under_easybuild_is_build_evidence(tmp_path):
    (tmp_path / "easybuild").mkdir()
    (tmp_path / "easybuild" / "GROMACS-2024.1-foss-2023b.eb").write_text("name = 'GROMACS'\n")

    assert planner.has_build_evidence(str(tmp_path)) is True


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {planner.RUN_MARKER: "run1\n"},
        {"PAYLOAD/": None},
        {"easybuild/GROMACS.eb/": None},
        {"easybuild/easybuild-GROMACS.log": "log\n", "easybuild/GROMACS.eb.bak": "x\n"},
        {"bin/PAYLOAD": "nested\n", "sub/easybuild/A.eb": "nested\n"},
    ],
    ids=["empty", "run-marker-only", "payload-dir", "eb-dir", "no-eb-suffix", "nested"],
)
def test_anything_else_is_not_build_evidence(tmp_path, layout):
    for relative, text in layout.items():
        path = tmp_path / relative
        if relative.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    assert planner.has_build_evidence(str(tmp_path)) is False


def test_a_dangling_payload_link_is_not_build_evidence(tmp_path):
    (tmp_path / "PAYLOAD").symlink_to(tmp_path / "missing")

    assert planner.has_build_evidence(str(tmp_path)) is False


# owner_write_window


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("sealed", [0o555, 0o2555, 0o500, 0o000])
def test_owner_write_window_opens_owner_write_and_restores_the_mode(tmp_path, sealed):
    directory = tmp_path / "install"
    directory.mkdir()
    os.chmod(directory, sealed)
    inside = []

    with planner.owner_write_window(str(directory)):
        inside.append(_mode(directory))

    assert inside == [sealed | stat.S_IWUSR]
    assert _mode(directory) == sealed


def test_owner_write_window_restores_the_mode_when_the_block_fails(tmp_path):
    directory = tmp_path / "install"
    directory.mkdir()
    os.chmod(directory, SEALED)

    with pytest.raises(OSError, match="raised inside the window"), planner.owner_write_window(str(directory)):
        raise OSError("raised inside the window")

    assert _mode(directory) == SEALED


def test_owner_write_window_restores_the_mode_of_a_directory_renamed_inside_it(tmp_path):
    # plan's stage-move: the sealed stage is renamed to its hidden sibling inside the window
    # (the rename rewrites its ".." entry, which needs the write access), so the seal must
    # come back on the directory under its new name.
    directory = tmp_path / "stage"
    directory.mkdir()
    os.chmod(directory, SEALED)
    moved = tmp_path / ".1.0.run1"

    with planner.owner_write_window(str(directory)):
        os.rename(directory, moved)

    assert _mode(moved) == SEALED


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o2775])
def test_owner_write_window_leaves_a_writable_directory_alone(tmp_path, mode):
    directory = tmp_path / "install"
    directory.mkdir()
    os.chmod(directory, mode)
    inside = []

    with planner.owner_write_window(str(directory)):
        inside.append(_mode(directory))

    assert inside == [mode]
    assert _mode(directory) == mode


# record_live and check_live


@pytest.fixture
def run(tmp_path):
    """A journal and one module entry whose live tree has three files, its live-change record
    not taken yet (the request skips it: the tests take it)."""
    live = tmp_path / "software" / "TinyApp" / "1.0"
    (live / "bin").mkdir(parents=True)
    (live / "PAYLOAD").write_text("old\n")
    (live / "bin" / "tiny").write_text("#!/bin/sh\n")
    (live / "bin" / "link").symlink_to("tiny")
    trees = paths.Trees(str(tmp_path / "software"), str(tmp_path / "modules"))
    journal = publish_journal(tmp_path / "runs", "run1", trees, skip_live_check=True)
    (entry,) = journal.modules
    assert entry.stable_path == str(live)
    return journal, entry, live


def test_record_live_writes_the_digest_of_the_live_tree_into_the_run(run):
    journal, entry, live = run

    planner.record_live(journal, entry, skip=False)

    assert entry.live_record == os.path.join(journal.run_dir, "live", "TinyApp", "1.0.json")
    with open(entry.live_record, encoding="utf-8") as handle:
        assert json.load(handle) == fsutil.tree_digest(str(live))


def test_record_live_skipped_records_nothing(run):
    journal, entry, _live = run

    planner.record_live(journal, entry, skip=True)

    assert entry.live_record is None
    assert not os.path.exists(os.path.join(journal.run_dir, "live"))


def test_check_live_passes_an_unchanged_tree(run):
    journal, entry, _live = run
    planner.record_live(journal, entry, skip=False)

    assert planner.check_live(journal, entry) is None


def test_check_live_passes_anything_when_the_record_was_skipped(run):
    journal, entry, live = run
    planner.record_live(journal, entry, skip=True)
    (live / "PAYLOAD").write_text("edited\n")

    assert planner.check_live(journal, entry) is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda live: (live / "PAYLOAD").write_text("edited\n"), "PAYLOAD"),
        (lambda live: (live / "bin" / "new").write_text("added\n"), "bin/new"),
        (lambda live: (live / "bin" / "tiny").unlink(), "bin/tiny"),
        (
            lambda live: ((live / "bin" / "link").unlink(), (live / "bin" / "link").symlink_to("/x")),
            "bin/link",
        ),
    ],
    ids=["edited", "added", "removed", "relinked"],
)
def test_check_live_names_the_changed_file(run, change, named):
    journal, entry, live = run
    planner.record_live(journal, entry, skip=False)
    change(live)

    with pytest.raises(errors.PublishError) as raised:
        planner.check_live(journal, entry)

    assert str(raised.value) == (
        f"the live tree {live} changed during the build ({named}); nothing was swapped "
        "(--skip-live-check skips this check)"
    )


def test_check_live_names_the_first_ten_changes_and_counts_the_rest(run):
    journal, entry, live = run
    planner.record_live(journal, entry, skip=False)
    for index in range(13):
        (live / f"added-{index:02d}").write_text("x\n")

    with pytest.raises(errors.PublishError) as raised:
        planner.check_live(journal, entry)

    shown = ", ".join(f"added-{index:02d}" for index in range(10))
    assert f"({shown} and 3 more)" in str(raised.value)


# plan, on a real build


@pytest.fixture
def site(tmp_path):
    site = StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=tmp_path)
    site.install(APP, LIB, payload="old")
    return site


def _journal(site, *modules, run_id="run1", skip_live_check=False):
    trees = paths.Trees.from_installpath(str(site.installpath))
    state_root = paths.prepare_state_root(str(site.state_root))
    journal = publish_journal(
        os.path.join(state_root, "runs"), run_id, trees, modules, skip_live_check=skip_live_check
    )
    for entry in journal.modules:
        planner.record_live(journal, entry, skip_live_check)
    journal.save()
    return journal, trees


def _build(trees, run_id, *modules, **env):
    """Build ``modules`` into the run's generation with the test builder."""
    generation = trees.generation(run_id)
    os.makedirs(generation)
    subprocess.run(
        [
            str(FAKE_EB),
            f"--installpath-software={generation}/software",
            f"--installpath-modules={generation}/modules",
            *(module.replace("/", "-") + ".eb" for module in modules),
        ],
        env=dict(os.environ, **env),
        capture_output=True,
        check=True,
    )
    return generation


def _live_state(site, *modules):
    """Inode, file digests and module file bytes of each live module."""
    return {
        module: (
            os.lstat(site.live(module)).st_ino,
            fsutil.tree_digest(str(site.live(module))),
            site.module_file(module).read_bytes(),
        )
        for module in modules
    }


def _planned(site, *modules, faults=None, build_env=None, **kwargs):
    journal, trees = _journal(site, *modules)
    if faults is not None:
        journal.faults = faults
    generation = _build(trees, "run1", *modules, **(build_env or {}))
    planner.plan(journal, trees, generation, **kwargs)
    return journal, trees, generation


def test_plan_moves_the_marked_stage_beside_the_live_tree_and_changes_nothing_live(site):
    before = _live_state(site, APP)

    journal, _trees, generation = _planned(site, APP)

    assert _live_state(site, APP) == before
    (entry,) = journal.modules
    sibling = site.software / "TinyApp" / ".1.0.run1"
    assert entry.retired_path == str(sibling)
    assert (sibling / "PAYLOAD").read_text() == "new build\n"
    assert (sibling / planner.RUN_MARKER).read_text() == "run1\n"
    assert not os.path.lexists(os.path.join(generation, "software", "TinyApp", "1.0"))
    assert (entry.stage_ino, entry.live_ino) == (sibling.stat().st_ino, site.live(APP).stat().st_ino)


def test_plan_journals_each_step_done_and_leaves_the_run_planning(site):
    journal, _trees, _generation = _planned(site, APP)

    on_disk = journals.Journal.load(journal.path)
    assert on_disk.state is RunState.PLANNING
    assert [(str(step.step), step.status) for step in on_disk.run.steps] == [
        (f"{name} {APP}", StepStatus.DONE) for name in PLAN_STEPS
    ]
    assert on_disk.modules == journal.modules


def test_plan_prepares_a_module_file_rooted_at_the_stable_path(site):
    journal, _trees, generation = _planned(site, APP)

    (entry,) = journal.modules
    with open(entry.prepared_module, "rb") as handle:
        prepared = handle.read()
    assert modulefile.parse_root(prepared.decode()) == str(site.live(APP))
    assert generation.encode() not in prepared
    assert entry.new_module_sha256 == modulefile.module_hash(prepared)


def test_plan_backs_up_the_live_module_file(site):
    old = site.module_file(APP).read_bytes()

    journal, _trees, _generation = _planned(site, APP)

    (entry,) = journal.modules
    with open(entry.module_backup, "rb") as handle:
        assert handle.read() == old
    assert entry.old_module_sha256 == modulefile.module_hash(old)


def test_plan_records_a_missing_live_module_file_as_no_backup(site):
    site.module_file(APP).unlink()

    journal, _trees, _generation = _planned(site, APP)

    assert (journal.modules[0].module_backup, journal.modules[0].old_module_sha256) == (None, None)


def test_plan_records_the_module_class_links_of_the_build(site):
    journal, _trees, _generation = _planned(site, APP)

    assert journal.modules[0].class_links == ["tools"]


def test_plan_orders_the_modules_dependencies_first(site):
    journal, _trees, _generation = _planned(site, APP, LIB, build_env={"FAKE_EB_DEPENDS": f"{APP}:{LIB}"})

    assert [entry.module for entry in journal.modules] == [LIB, APP]
    assert [entry.module for entry in journals.Journal.load(journal.path).modules] == [LIB, APP]


def test_plan_counts_four_operations_per_module_and_their_journal_writes(site):
    faults = faults_module.Faults()

    _planned(site, APP, faults=faults)

    assert faults.operations == PLAN_POINTS


def test_plan_of_a_sealed_install_writes_the_marker_and_keeps_the_seal(site):
    journal, trees = _journal(site, APP)
    generation = _build(trees, "run1", APP)
    staged = os.path.join(generation, "software", "TinyApp", "1.0")
    os.chmod(staged, SEALED)

    planner.plan(journal, trees, generation)

    sibling = site.software / "TinyApp" / ".1.0.run1"
    assert _mode(sibling) == SEALED
    assert (sibling / planner.RUN_MARKER).read_text() == "run1\n"


def test_plan_runs_the_prepare_program_with_the_stage_beside_the_live_tree(site, tmp_path):
    seen = tmp_path / "seen"
    sibling = site.software / "TinyApp" / ".1.0.run1"
    prepare = f"cat {sibling}/PAYLOAD > {seen}; echo $PREPARE_SAYS >> {seen}"

    _planned(site, APP, prepare=prepare, env=dict(os.environ, PREPARE_SAYS="hello"))

    assert seen.read_text() == "new build\nhello\n"


def test_the_prepare_program_s_output_goes_to_the_run_s_log_not_to_the_tool_s_streams(site, capfd):
    journal, _trees, _generation = _planned(site, APP, prepare="echo to stdout; echo to stderr >&2")

    assert capfd.readouterr() == ("", "")
    log = pathlib.Path(journal.run_dir, "prepare.log")
    assert log.read_text() == "to stdout\nto stderr\n"


def test_the_prepare_program_reads_nothing_and_leads_a_session_of_its_own(site, tmp_path):
    seen = tmp_path / "seen"
    prepare = (
        f"readlink /proc/self/fd/0 > {seen}; cat >> {seen}; ps -o sid= -p $$ >> {seen}; echo $$ >> {seen}"
    )

    _planned(site, APP, prepare=prepare)

    stdin, sid, pid = seen.read_text().split()
    assert stdin == "/dev/null"
    assert sid == pid
    assert int(sid) != os.getsid(0)


def test_a_prepare_log_planted_as_a_symlink_is_refused_and_its_target_untouched(site, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    before = _live_state(site, APP)
    journal, trees = _journal(site, APP)
    generation = _build(trees, "run1", APP)
    os.symlink(victim, os.path.join(journal.run_dir, "prepare.log"))

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        planner.plan(journal, trees, generation, prepare="echo written")

    assert victim.read_text() == "precious\n"
    assert _live_state(site, APP) == before


# plan's refusals


def test_plan_refuses_a_build_without_evidence_and_moves_nothing(site):
    before = _live_state(site, APP)

    with pytest.raises(errors.PublishError) as raised:
        _planned(site, APP, build_env={"FAKE_EB_EVIDENCE": "none"})

    staged = site.software / ".eb-staged-rebuild" / "run1" / "software" / "TinyApp" / "1.0"
    assert str(raised.value) == (
        f"the build installed no TinyApp/1.0: {staged} has no easybuild/*.eb (check that the "
        "easyconfigs given to EasyBuild build TinyApp/1.0); nothing was swapped"
    )
    assert _live_state(site, APP) == before
    assert not os.path.lexists(site.software / "TinyApp" / ".1.0.run1")


def test_plan_refuses_a_run_whose_build_wrote_nothing(site):
    journal, trees = _journal(site, APP)
    generation = trees.generation("run1")
    os.makedirs(generation)

    with pytest.raises(errors.PublishError, match=r"the build installed no TinyApp/1\.0"):
        planner.plan(journal, trees, generation)


def test_plan_refuses_a_build_without_a_module_file(site):
    journal, trees = _journal(site, APP)
    generation = _build(trees, "run1", APP)
    os.unlink(os.path.join(generation, "modules", "all", "TinyApp", "1.0.lua"))

    with pytest.raises(errors.PublishError, match="the build wrote no module file"):
        planner.plan(journal, trees, generation)


def test_plan_refuses_a_module_file_naming_another_root(site):
    journal, trees = _journal(site, APP)
    generation = _build(trees, "run1", APP)
    module_file = os.path.join(generation, "modules", "all", "TinyApp", "1.0.lua")
    with open(module_file, "w", encoding="utf-8") as handle:
        handle.write('local root = "/somewhere/else"\n')

    with pytest.raises(errors.PublishError, match="names root /somewhere/else, not the staged install"):
        planner.plan(journal, trees, generation)


def test_plan_refuses_a_live_module_file_that_is_a_symlink(site, tmp_path):
    target = tmp_path / "elsewhere.lua"
    target.write_bytes(site.module_file(APP).read_bytes())
    site.module_file(APP).unlink()
    site.module_file(APP).symlink_to(target)

    with pytest.raises(errors.UsageError, match="is a symlink; refusing to replace it"):
        _planned(site, APP)

    assert site.module_file(APP).is_symlink()


def test_plan_refuses_when_the_prepare_program_fails_and_names_its_log(site):
    before = _live_state(site, APP)
    log = site.state_root / "runs" / "run1" / "prepare.log"

    with pytest.raises(errors.PublishError) as raised:
        _planned(site, APP, prepare="echo cannot stage it >&2; exit 3")

    assert str(raised.value) == (
        "--prepare 'echo cannot stage it >&2; exit 3' exited with status 3; nothing was swapped; "
        f"its output is in {log}"
    )
    assert log.read_text() == "cannot stage it\n"
    assert _live_state(site, APP) == before


def test_plan_refuses_a_stage_whose_evidence_the_prepare_program_removed(site):
    # The run marker stays behind; it is this tool's, not the build's, and does not count.
    sibling = site.software / "TinyApp" / ".1.0.run1"
    before = _live_state(site, APP)

    with pytest.raises(errors.PublishError) as raised:
        _planned(site, APP, prepare=f"rm {sibling}/PAYLOAD {sibling}/easybuild/*.eb")

    assert str(raised.value).startswith(f"{sibling} lost its build evidence")
    assert (sibling / planner.RUN_MARKER).exists()
    assert _live_state(site, APP) == before


def test_plan_refuses_when_the_live_tree_changed_during_the_build(site):
    journal, trees = _journal(site, APP)
    generation = _build(trees, "run1", APP)
    (site.live(APP) / "PAYLOAD").write_text("edited by hand\n")

    with pytest.raises(
        errors.PublishError, match=r"changed during the build \(PAYLOAD\); nothing was swapped"
    ):
        planner.plan(journal, trees, generation)

    assert (site.live(APP) / "PAYLOAD").read_text() == "edited by hand\n"


def test_plan_with_the_live_check_skipped_accepts_a_changed_live_tree(site):
    journal, trees = _journal(site, APP, skip_live_check=True)
    generation = _build(trees, "run1", APP)
    (site.live(APP) / "PAYLOAD").write_text("edited by hand\n")

    planner.plan(journal, trees, generation)

    assert journal.modules[0].live_record is None


@pytest.mark.parametrize("fail_at", range(1, len(PLAN_POINTS) + 1))
def test_an_injected_failure_at_each_plan_step_or_its_journal_write_leaves_the_live_tree_alone(site, fail_at):
    before = _live_state(site, APP)

    with pytest.raises(faults_module.InjectedFailure) as raised:
        _planned(site, APP, faults=faults_module.Faults(fail_at=fail_at))

    assert raised.value.step == PLAN_POINTS[fail_at - 1]
    assert _live_state(site, APP) == before
