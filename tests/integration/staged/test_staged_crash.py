"""The crash matrix: the real command killed with SIGKILL at every journaled step, then resumed.

``EB_STAGED_REBUILD_CRASH_AT=<step>`` makes the tool kill itself right after journaling that
step as started. The steps of each matrix are read from the journal of a successful run (at
collection time, on a throw-away site), so a step added to the engine is a new case here.
After the kill, ``resume`` must leave every module entirely old (live inode, payload, module
bytes and class link of before the run) or entirely new (the staged tree live, the module
file the run prepared, with its root at the live path), never a mix, and the journal must
say which; a second ``resume`` changes nothing on disk and says so. The ``chain`` variant is
a stack rebuild of three (``--module TinyLib/1.0 --with-dependants``, ``staged_matrix``):
its two dependants, found by the run, are new or old with TinyLib, never apart from it.

The three-rename fallback runs on a bindfs mount (RENAME_EXCHANGE fails there with EINVAL),
with the state root on the ordinary filesystem; its steps are the publish steps with the
three renames after each swap, which a successful run on the mount confirms. The last
matrices kill the tool at the points the journal's hook cannot name: right after an
operation and before the journal records it done (see
``staged_matrix.run_killed_at_operation``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from tests.integration.harness import staged_matrix as matrix

CRASH_AT = "EB_STAGED_REBUILD_CRASH_AT"
MODULES = {"one": matrix.ONE, "chain": matrix.CHAIN}
STEPS = {variant: matrix.journaled_steps(modules) for variant, modules in MODULES.items()}


# The chain of three: a crash in the second swap leaves one swapped module for resume to swap
# back, itself through the fallback, besides the interrupted one to recover.
FUSE_STEPS = {"chain": matrix.with_fallback(STEPS["chain"][0])}


def _after_an_operation(operations):
    """The points between an operation and its journal write, and before the final state."""
    return [name for name in operations if name.startswith("journal ") or name.startswith("state ")]


# One module with a ledger has every kind of operation a publish records.
KILL_POINTS = {"ledger": _after_an_operation(matrix.count_publish_operations("ledger"))}
ROLLBACK_KILL_POINTS = _after_an_operation(matrix.count_rollback_operations(matrix.ONE))


def _cases(steps_by_variant, pick=lambda steps: steps):
    return [
        pytest.param(variant, step, id=f"{variant}-" + matrix.case_id(index, step))
        for variant, steps in steps_by_variant.items()
        for index, step in enumerate(pick(steps), start=1)
    ]


PUBLISH_CASES = _cases(STEPS, pick=lambda steps: steps[0])
ROLLBACK_CASES = _cases(STEPS, pick=lambda steps: steps[1])
FUSE_CASES = _cases(
    FUSE_STEPS, pick=lambda steps: [step for step in steps if step.startswith(("swap ", "fallback-"))]
)
KILL_CASES = _cases(KILL_POINTS)


def _json(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _env(modules, **extra):
    return matrix.builder_env(modules, **extra)


def _run_dir(site):
    (run_dir,) = (site.state_root / "runs").iterdir()
    return run_dir


def _rebuild(site, modules, env):
    """``eb-staged-rebuild rebuild`` of ``modules`` (for the chain, with ``--with-dependants``)."""
    return site.run(*matrix.rebuild_args(site, modules), env=env)


def _publish(site, modules):
    result = _json(site.run("--json", *matrix.rebuild_args(site, modules), env=_env(modules)))
    assert result["state"] == "published"
    # The chain's run found the dependants the command line does not name, in build order.
    assert [entry["module"] for entry in result["modules"]] == list(modules)
    return result


def _journal(site):
    return json.loads(Path(_run_dir(site), "journal.json").read_text())


def _assert_killed_at(site, crashed, step):
    """The process died by SIGKILL, and the journal's last step is the one the hook named, started."""
    assert crashed.returncode == matrix.KILLED, crashed.stderr
    last = _journal(site)["steps"][-1]
    assert (last["step"], last["status"]) == (step, "started")


def _assert_resume_repairs(site, modules, old, old_final, ledger=False):
    """Resume leaves entirely old (journal ``old_final``) or entirely new (``published``),
    which it returns; a second resume changes nothing."""
    resumed = _json(site.run("--json", "resume", env=_env(modules)))

    (run,) = resumed["runs"]
    outcome, detail = matrix.classify(site, old, _run_dir(site))
    assert outcome in ("old", "new"), detail
    assert run["state"] == {"old": old_final, "new": "published"}[outcome]
    assert _journal(site)["state"] == run["state"]
    assert matrix.leftover_holds(site) == []
    if ledger:
        written = matrix.ledger_file(site).read_bytes()
        assert written.startswith(matrix.EARLIER_LEDGER)
        records = len(written[len(matrix.EARLIER_LEDGER) :].splitlines())
        wanted = len(modules) if outcome == "new" else 0
        assert records == wanted, f"entirely {outcome}, yet the ledger holds {records} record(s) of the run"
    before = matrix.site_snapshot(site)

    again = _json(site.run("--json", "resume", env=_env(modules)))

    assert again["changed"] is False
    assert [entry["changed"] for entry in again["runs"]] == [False]
    assert matrix.site_snapshot(site) == before
    return outcome


def _assert_killed_after(site, crashed, operation):
    """Killed at ``journal S`` (S done, not yet journaled done) or ``state X`` (all steps done)."""
    assert crashed.returncode == matrix.KILLED, crashed.stderr
    last = _journal(site)["steps"][-1]
    if operation.startswith("journal "):
        assert (last["step"], last["status"]) == (operation[len("journal ") :], "started")
    else:
        assert last["status"] == "done"


@pytest.mark.parametrize("variant", list(MODULES))
def test_the_cases_cover_every_journaled_step_of_a_publish_and_its_rollback(staged_site, variant):
    modules = MODULES[variant]
    matrix.prepare_old_site(staged_site, modules)
    published, rolled_back = STEPS[variant]

    run_id = _publish(staged_site, modules)["run_id"]
    steps = _json(staged_site.run("--json", "status", run_id))["run"]["steps"]
    _json(staged_site.run("--json", "rollback", run_id))
    all_steps = _json(staged_site.run("--json", "status", run_id))["run"]["steps"]

    assert [step["step"] for step in steps] == published
    assert all(step["status"] == "done" for step in steps)
    assert [step["step"] for step in all_steps[len(steps) :]] == rolled_back
    assert published[:2] == ["build", "relocate"]
    assert _kinds(published) == PUBLISH_KINDS
    assert _kinds(rolled_back) == ROLLBACK_KINDS


def _kinds(names):
    return {journals.StepName.from_json(name, "step").kind for name in names}


Kind = journals.StepKind
PUBLISH_KINDS = {
    Kind.BUILD,
    Kind.RELOCATE,
    Kind.MARKER,
    Kind.PREPARE_MODULE,
    Kind.BACKUP,
    Kind.STAGE_MOVE,
    Kind.SWAP,
    Kind.MODULE,
    Kind.CLASS_LINK,
}
ROLLBACK_KINDS = {Kind.ROLLBACK_CLASS_LINK, Kind.ROLLBACK_MODULE, Kind.ROLLBACK_SWAP}
FALLBACK_KINDS = {Kind.FALLBACK_LIVE_TO_HOLD, Kind.FALLBACK_STAGED_TO_LIVE, Kind.FALLBACK_HOLD_TO_STAGED}
# Not killed by this matrix, each for its reason: resume's own steps are what the matrix's
# second resume repeats (it must change nothing); the ledger append is killed right after
# it by the kill matrix below; --prepare runs a program and changes no tree, so a crash
# in it leaves a planning run, which the planning steps' cases resume.
NOT_CRASH_CASES = {
    Kind.RESUME_RECOVER_FALLBACK,
    Kind.RESUME_CLASS_LINK,
    Kind.RESUME_MODULE,
    Kind.RESUME_SWAP,
    Kind.LEDGER,
    Kind.PREPARE_PROGRAM,
}


def test_the_crash_cases_and_the_named_exceptions_are_every_step_kind_of_the_engine():
    crashed = set()
    for published, rolled_back in STEPS.values():
        crashed |= _kinds(published) | _kinds(rolled_back)
    crashed |= _kinds(FUSE_STEPS["chain"])

    assert crashed == PUBLISH_KINDS | ROLLBACK_KINDS | FALLBACK_KINDS
    assert crashed | NOT_CRASH_CASES == set(journals.StepKind)
    assert not crashed & NOT_CRASH_CASES


@pytest.mark.parametrize(("variant", "step"), PUBLISH_CASES)
def test_a_crash_at_each_publish_step_resumes_to_entirely_old_or_entirely_new(staged_site, variant, step):
    modules = MODULES[variant]
    matrix.prepare_old_site(staged_site, modules)
    old = matrix.old_state(staged_site, modules)

    crashed = _rebuild(staged_site, modules, _env(modules, **{CRASH_AT: step}))

    _assert_killed_at(staged_site, crashed, step)
    _assert_resume_repairs(staged_site, modules, old, "failed")


@pytest.mark.parametrize(("variant", "step"), ROLLBACK_CASES)
def test_a_crash_at_each_rollback_step_resumes_to_entirely_old_or_entirely_new(staged_site, variant, step):
    modules = MODULES[variant]
    matrix.prepare_old_site(staged_site, modules)
    old = matrix.old_state(staged_site, modules)
    run_id = _publish(staged_site, modules)["run_id"]

    crashed = staged_site.run("--json", "rollback", run_id, env=_env(modules, **{CRASH_AT: step}))

    _assert_killed_at(staged_site, crashed, step)
    _assert_resume_repairs(staged_site, modules, old, "rolled_back")


@pytest.fixture
def fuse_site(fuse_dir, tmp_path, package_root):
    return matrix.on_fuse(fuse_dir, tmp_path, package_root)


@pytest.mark.parametrize("variant", list(FUSE_STEPS))
def test_the_fuse_cases_cover_every_journaled_step_of_a_fallback_publish(fuse_site, variant):
    modules = MODULES[variant]
    matrix.prepare_old_site(fuse_site, modules)

    run_id = _publish(fuse_site, modules)["run_id"]

    steps = _json(fuse_site.run("--json", "status", run_id))["run"]["steps"]
    assert [step["step"] for step in steps] == FUSE_STEPS[variant]
    assert all(fuse_site.payload(module) == "new build" for module in modules)


@pytest.mark.parametrize(("variant", "step"), FUSE_CASES)
def test_a_crash_at_each_fallback_step_on_fuse_resumes_to_entirely_old_or_entirely_new(
    fuse_site, variant, step
):
    modules = MODULES[variant]
    matrix.prepare_old_site(fuse_site, modules)
    old = matrix.old_state(fuse_site, modules)

    crashed = _rebuild(fuse_site, modules, _env(modules, **{CRASH_AT: step}))

    _assert_killed_at(fuse_site, crashed, step)
    assert _assert_resume_repairs(fuse_site, modules, old, "failed") == "old"


@pytest.mark.parametrize(("variant", "operation"), KILL_CASES)
def test_a_kill_after_each_publish_operation_resumes_to_entirely_old_or_entirely_new(
    staged_site, variant, operation
):
    modules, ledger = matrix.VARIANTS[variant]
    matrix.prepare_old_site(staged_site, modules, ledger=ledger)
    old = matrix.old_state(staged_site, modules)
    extra = [f"--ledger-config={matrix.ledger_config(staged_site)}"] if ledger else []

    crashed = matrix.run_killed_at_operation(
        staged_site, operation, *matrix.rebuild_args(staged_site, modules, extra=extra), env=_env(modules)
    )

    _assert_killed_after(staged_site, crashed, operation)
    _assert_resume_repairs(staged_site, modules, old, "failed", ledger=ledger)


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(name, id=matrix.case_id(index, name))
        for index, name in enumerate(ROLLBACK_KILL_POINTS, 1)
    ],
)
def test_a_kill_after_each_rollback_operation_resumes_to_entirely_old_or_entirely_new(staged_site, operation):
    modules = matrix.ONE
    matrix.prepare_old_site(staged_site, modules)
    old = matrix.old_state(staged_site, modules)
    run_id = _publish(staged_site, modules)["run_id"]

    crashed = matrix.run_killed_at_operation(staged_site, operation, "rollback", run_id, env=_env(modules))

    _assert_killed_after(staged_site, crashed, operation)
    _assert_resume_repairs(staged_site, modules, old, "rolled_back")
