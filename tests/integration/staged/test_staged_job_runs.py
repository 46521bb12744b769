"""Runs made for batch jobs, driven through the engine with real EasyBuild and no scheduler.

A job's run is queued on the submitting host (``rebuild.queue``, ``record_job``), then started
by its job on a node (``rebuild.start_queued``): built, planned, and published, or stopped
``staged`` when the request publishes together with the runs of other trees; ``staged``
publishes or discards a set of staged runs of several trees (``publish_staged``,
``discard_staged``). Slurm plays no part in any of this (the job's own command and the
submission are the command line's); what Slurm does to a job is done here for real to the
process running ``start_queued``: SIGTERM (``scancel``), then SIGKILL.

The two trees staged together are built once per module (one EasyBuild build per tree) and
given back as staged to each test that needs them: copied (``cp -a``) at the same paths, the
inodes their journals record set to those of the copies' same paths, as a copy changes them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tinypkgs
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    commands,
    faults,
    rebuild,
    request,
    staged,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from tests.integration.harness import toysite
from tests.integration.harness.ebsite import LIB, EbSite, wait_for
from tests.support.mountns import in_private_mounts

RUN_ID = "20260101T000000Z-job"
BACKEND = "userns"
NEW_GREETING = "hello from TinyLib 1.0, built by a job"
SIGNAL_WAIT = 60
# What a batch job runs, as the job's command would: start_queued with SIGTERM raising.
JOB_SCRIPT = """
import json, os, sys
from hpcstack_ops.staged_rebuild import commands
state_root, run_id = sys.argv[1:3]
with commands.sigterm_raises():
    try:
        result = commands.start_job(state_root, run_id, lambda line: None, dict(os.environ), node="node1")
    except commands.FAILURES as err:
        print(commands.failure_message(err), file=sys.stderr)
        sys.exit(2)
print(json.dumps(result))
"""


def _request(site: EbSite, packages, run_id=RUN_ID, eb_args=(), **fields):
    """The request of a rebuild of TinyLib in ``site`` from ``packages``, resolved as the
    command line resolves it."""
    resolved = request.resolve(
        {
            "installpath_software": str(site.software),
            "installpath_modules": str(site.modules),
            "modules": [LIB],
            "eb": str(site.eb),
            "backend": BACKEND,
            "run_id": run_id,
        },
        site.eb_env(packages),
        [*eb_args, str(packages.easyconfig(*LIB.split("/")))],
    )
    return dataclasses.replace(resolved, **fields)


def _queued(site, packages, run_id=RUN_ID, eb_args=(), target="zen3", **fields):
    journal = rebuild.queue(
        _request(site, packages, run_id, eb_args, **fields), str(site.state_root), target=target
    )
    rebuild.record_job(journal, "4242")
    return journal


def _start(site, packages, run_id=RUN_ID, **kwargs):
    return rebuild.start_queued(
        str(site.state_root), run_id, lambda line: None, site.eb_env(packages), node="node1", **kwargs
    )


def _journal(site, run_id=RUN_ID) -> journals.Journal:
    return journals.find(str(site.state_root), run_id)


def _greeting(site) -> str:
    """What the live TinyLib says, as a user of the module reads it."""
    loaded = site.module_shell(f'module load {LIB} && cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"')
    return loaded.stdout.strip()


def _refuse(journal):
    raise errors.PublishError("refused")


@pytest.fixture
def live_site(eb_site_factory) -> EbSite:
    """A site of root with TinyLib built live by plain eb (a copy after the first test)."""
    site = eb_site_factory("root")
    site.install(site.write_packages("gen1"), tinypkgs.LIB)
    return site


# --- one tree: queued, started by its job, published -----------------------------------


def test_a_queued_run_started_by_its_job_is_published_with_its_node(live_site):
    site = live_site
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    live_ino = site.live(LIB).stat().st_ino
    journal = _queued(site, new)
    queued = journals.summary(_journal(site))

    result = _start(site, new)

    assert (queued["state"], queued["job"]["job_id"], queued["job"]["target"]) == ("queued", "4242", "zen3")
    assert queued["job"]["node"] is None
    assert journal.run.backend is None
    assert result["state"] == "published"
    shown = journals.summary(_journal(site))
    assert shown["state"] == "published"
    assert (shown["job"]["node"], shown["job"]["job_id"]) == ("node1", "4242")
    assert shown["job"]["started"] >= shown["job"]["submitted"]
    assert site.live(LIB).stat().st_ino != live_ino
    assert _greeting(site) == NEW_GREETING


def test_a_node_refused_by_its_check_ends_the_run_failed_before_anything_is_built(live_site):
    site = live_site
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    _queued(site, new)
    before = site.snapshot()

    def wrong_node(journal):
        raise errors.PublishError("archdetect says x86_64/intel/icelake on node1, not the target zen3")

    with pytest.raises(errors.PublishError):
        _start(site, new, check_node=wrong_node)

    run = _journal(site).run
    assert (run.state, run.error, run.cancelled) == (
        journals.RunState.FAILED,
        "archdetect says x86_64/intel/icelake on node1, not the target zen3",
        None,
    )
    assert (run.job.node, run.modules, run.steps) == ("node1", [], [])
    assert not site.generation(RUN_ID).exists()
    assert not site.build_log(RUN_ID).exists()  # EasyBuild never started
    assert site.snapshot() == before


def test_a_run_that_is_not_queued_is_not_started_again(live_site):
    site = live_site
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    _queued(site, new)
    with pytest.raises(errors.PublishError):
        _start(site, new, check_node=_refuse)
    failed = (site.state_root / "runs" / RUN_ID / "journal.json").read_bytes()

    with pytest.raises(errors.UsageError) as raised:
        _start(site, new)

    assert str(raised.value) == f"run {RUN_ID} is failed, not queued; only a queued run is started by its job"
    assert (site.state_root / "runs" / RUN_ID / "journal.json").read_bytes() == failed


# --- the job's process stopped as Slurm stops it ----------------------------------------


def _start_job_halfway(site) -> tuple[subprocess.Popen, Path]:
    """A queued run whose job (a real process running ``start_queued``) is stopped by a hook
    after EasyBuild's install step; returns the process and the marker the hook wrote."""
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    control = site.scratch("control")
    marker = control / "halfway"
    hooks = tinypkgs.write_halfway_hooks(control / "hooks.py", marker)
    _queued(site, new, eb_args=("--hooks", str(hooks)))
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB_SCRIPT, str(site.state_root), RUN_ID],
        cwd=site.root,
        env=site.tool_env(new),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(marker, proc)
    return proc, marker


def test_sigterm_of_the_job_during_the_build_ends_the_run_failed_and_cancelled(live_site):
    site = live_site
    before = site.snapshot()
    proc, _marker = _start_job_halfway(site)
    assert _journal(site).state is journals.RunState.BUILDING

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=SIGNAL_WAIT)

    assert proc.returncode == 2, (out, err)
    run = _journal(site).run
    assert (run.state, run.cancelled) == (journals.RunState.FAILED, True)
    assert run.error == "terminated by signal 15; completed steps were reversed"
    assert err.splitlines()[-1] == run.error
    assert site.wait_until_gone(SIGNAL_WAIT) == []  # the build's process group went with the job
    assert not site.generation(RUN_ID).exists()
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


def test_sigkill_of_the_job_during_the_build_is_reversed_by_resume_not_built_again(live_site):
    site = live_site
    before = site.snapshot()
    proc, _marker = _start_job_halfway(site)

    proc.kill()
    proc.communicate(timeout=SIGNAL_WAIT)
    site.stop_leftovers()  # EasyBuild's session outlives a SIGKILLed tool; the hook sleeps on
    stopped = _journal(site).state
    (result,) = commands.resume_runs(
        str(site.state_root), None, lock_timeout=0, progress=lambda line: None, env=site.eb_env(None)
    )["runs"]

    assert stopped is journals.RunState.BUILDING
    assert result["state"] == "failed"
    run = _journal(site).run
    assert run.state is journals.RunState.FAILED
    assert run.error == "its job 4242 stopped while building; its build was discarded"
    assert not site.generation(RUN_ID).exists()
    assert site.snapshot() == before
    assert _greeting(site) == tinypkgs.GREETING


# --- resume and a queued run's job --------------------------------------------------------


@pytest.mark.parametrize(
    ("alive", "state", "error"),
    [
        (True, "queued", None),
        (None, "queued", None),
        (False, "failed", "its job 4242 ended before it started"),
    ],
    ids=["job-pending", "scheduler-not-answering", "job-gone"],
)
def test_resume_ends_a_queued_run_only_when_its_job_is_gone(live_site, alive, state, error):
    site = live_site
    _queued(site, site.write_packages("gen2"))
    asked = []

    def job_alive(job_id):
        asked.append(job_id)
        return alive

    (result,) = commands.resume_runs(
        str(site.state_root),
        None,
        lock_timeout=0,
        progress=lambda line: None,
        env={},
        job_alive=job_alive,
    )["runs"]

    assert asked == ["4242"]
    assert (result["state"], _journal(site).run.error) == (state, error)
    assert result["changed"] is (state == "failed")


def test_resume_ends_a_queued_run_that_never_got_its_job_id(live_site):
    site = live_site
    rebuild.queue(_request(site, site.write_packages("gen2")), str(site.state_root))

    (result,) = commands.resume_runs(
        str(site.state_root), None, lock_timeout=0, progress=print, env={}, job_alive=lambda job_id: True
    )["runs"]

    assert result["state"] == "failed"
    assert _journal(site).run.error == "it has no job: its submission did not finish"


# --- two trees, staged and published together ----------------------------------------------


@dataclasses.dataclass
class StagedPair:
    """Two sites (two trees, two state roots) with run RUN_ID staged in each, and their copies."""

    sites: list
    kept: list
    packages: list

    def runs(self):
        return [(str(site.state_root), RUN_ID) for site in self.sites]

    def restore(self) -> list:
        for site, kept in zip(self.sites, self.kept):
            subprocess.run(["rm", "-rf", "--one-file-system", str(site.root)], check=True)
            subprocess.run(["cp", "-a", str(kept), str(site.root)], check=True)
            _record_copied_inodes(site)
        return self.sites


def _record_copied_inodes(site) -> None:
    """The journal's inodes, set to those of the same paths in the copy (still staged there)."""
    path = site.state_root / "runs" / RUN_ID / "journal.json"
    data = json.loads(path.read_text())
    for entry in data["modules"]:
        entry["stage_ino"] = os.lstat(entry["retired_path"]).st_ino
        entry["live_ino"] = os.lstat(entry["stable_path"]).st_ino
    path.write_text(json.dumps(data, sort_keys=True))


@pytest.fixture(scope="module")
def staged_template(lmod, tmp_path_factory) -> StagedPair:
    sites, kept, packages = [], [], []
    for label in ("zen3", "icelake"):
        site = toysite.new_site(lmod, tmp_path_factory, f"tree-{label}")
        site.install(site.write_packages("gen1"), tinypkgs.LIB)
        new = site.write_packages("gen2", greeting=f"{NEW_GREETING} for {label}")
        _queued(site, new, target=label, publish_together=True)
        result = _start(site, new)
        assert result["state"] == "staged", result
        keep = tmp_path_factory.mktemp(f"kept-{label}") / "site"
        subprocess.run(["cp", "-a", str(site.root), str(keep)], check=True)
        sites.append(site)
        kept.append(keep)
        packages.append(new)
    return StagedPair(sites, kept, packages)


@pytest.fixture
def pair(staged_template) -> StagedPair:
    staged_template.restore()
    return staged_template


def _live_state(site) -> tuple:
    """The live install's inode and the module file's bytes: what a rollback puts back."""
    return site.live(LIB).stat().st_ino, site.module_file(LIB).read_bytes()


def _live_inodes(sites) -> list:
    return [site.live(LIB).stat().st_ino for site in sites]


def test_staged_runs_change_nothing_live_and_resume_and_gc_leave_them(pair, lmod):
    sites = pair.sites
    before = [site.snapshot() for site in sites]

    resumed = [
        commands.resume_runs(str(site.state_root), None, lock_timeout=0, progress=print, env={})["runs"]
        for site in sites
    ]
    collected = [
        commands.collect_garbage(str(site.state_root), grace_hours=0, lock_timeout=0) for site in sites
    ]

    for site, was, (result,), report in zip(sites, before, resumed, collected):
        assert site.snapshot() == was
        assert _greeting(site) == tinypkgs.GREETING
        assert (result["state"], result["changed"]) == ("staged", False)
        assert [entry["run_id"] for entry in report["staged"]] == [RUN_ID]
        assert report["removed"] == []
        assert site.generation(RUN_ID).is_dir()
        assert _journal(site).state is journals.RunState.STAGED


def test_staged_runs_of_two_trees_are_published_together(pair):
    sites = pair.sites
    live_before = _live_inodes(sites)

    result = staged.publish_staged(pair.runs(), 0, lambda line: None)

    assert result["published"] == [{"state_root": str(site.state_root), "run_id": RUN_ID} for site in sites]
    assert [run["state"] for run in result["runs"]] == ["published", "published"]
    for site, old in zip(sites, live_before):
        assert site.live(LIB).stat().st_ino != old
        assert _journal(site).state is journals.RunState.PUBLISHED
        assert not site.generation(RUN_ID).exists()
    assert [_greeting(site) for site in sites] == [
        f"{NEW_GREETING} for zen3",
        f"{NEW_GREETING} for icelake",
    ]


def test_discarded_staged_runs_end_failed_with_their_stages_gone(pair):
    sites = pair.sites
    before = [site.snapshot_of(site.live(LIB), site.module_file(LIB)) for site in sites]

    result = staged.discard_staged(pair.runs(), 0)

    assert [run["state"] for run in result["runs"]] == ["failed", "failed"]
    for site, was in zip(sites, before):
        run = _journal(site).run
        assert (run.state, run.error) == (journals.RunState.FAILED, staged.DISCARDED)
        assert not site.generation(RUN_ID).exists()
        assert not os.path.lexists(run.modules[0].retired_path)
        assert site.snapshot_of(site.live(LIB), site.module_file(LIB)) == was
        assert _greeting(site) == tinypkgs.GREETING


def test_a_discard_that_cannot_record_itself_says_so_and_the_same_discard_again_ends_the_run(pair):
    """The stage goes, then the journal cannot be written (its directory read-only: a real
    read-only bind mount, in a mount namespace of the discard's own). The run still reads
    staged without a stage; the one line says so and what ends it, and it does."""
    site = pair.sites[0]
    run_dir = site.state_root / "runs" / RUN_ID
    before = site.snapshot_of(site.live(LIB), site.module_file(LIB))
    read_only = in_private_mounts(
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"', str(run_dir)
    )

    first = site.run_as_owner(
        [*read_only, *site.tool_command("discard", RUN_ID)], site.tool_env(pair.packages[0]), 120
    )

    assert first.returncode == 2, first.stdout + first.stderr
    assert re.fullmatch(
        rf"eb-staged-rebuild: run {RUN_ID} in {re.escape(str(site.state_root))}: its stage is removed, "
        r"but its journal could not record the discard "
        r"\(Read-only file system \(\.journal\.json\.[0-9a-f]+\.tmp\)\); "
        r"the same discard again ends it once the state root can be written\n",
        first.stderr,
    ), first.stderr
    assert _journal(site).state is journals.RunState.STAGED
    assert not site.generation(RUN_ID).exists()

    result = staged.discard_staged([(str(site.state_root), RUN_ID)], 0)

    assert [run["state"] for run in result["runs"]] == ["failed"]
    run = _journal(site).run
    assert (run.state, run.error) == (journals.RunState.FAILED, staged.DISCARDED)
    assert site.snapshot_of(site.live(LIB), site.module_file(LIB)) == before
    assert _greeting(site) == tinypkgs.GREETING


def test_nothing_is_published_when_one_of_the_runs_is_not_staged(pair):
    first, second = pair.sites
    staged.discard_staged(pair.runs()[1:], 0)
    before = [site.snapshot() for site in pair.sites]

    with pytest.raises(errors.UsageError) as raised:
        staged.publish_staged(pair.runs(), 0, lambda line: None)

    assert str(raised.value) == (
        f"only staged runs can be published: run {RUN_ID} in {second.state_root} is failed; "
        "nothing was published"
    )
    assert [site.snapshot() for site in pair.sites] == before
    assert _journal(first).state is journals.RunState.STAGED


def test_nothing_is_published_when_a_live_tree_changed_since_planning(pair):
    second = pair.sites[1]
    (second.live(LIB) / "share").mkdir(exist_ok=True)
    (second.live(LIB) / "share" / "late.txt").write_text("written after the plan\n")
    before = [site.snapshot() for site in pair.sites]

    with pytest.raises(errors.PublishError) as raised:
        staged.publish_staged(pair.runs(), 0, lambda line: None)

    assert "changed during the build" in str(raised.value)
    assert [site.snapshot() for site in pair.sites] == before
    assert [_journal(site).state for site in pair.sites] == [journals.RunState.STAGED] * 2


def test_a_failed_second_publish_rolls_back_the_first(pair):
    """The second tree's publish fails at its first operation (an injected EIO, taking the
    real error path): it reverses itself, and the first tree, published by the same
    command, is rolled back."""
    before = [_live_state(site) for site in pair.sites]
    runs = sorted(pair.runs())
    failing = runs[1][0]

    with pytest.raises(errors.PublishError) as raised:
        staged.publish_staged(runs, 0, lambda line: None, faults={failing: faults.Faults(fail_at=1)})

    by_root = {str(site.state_root): site for site in pair.sites}
    published_first = by_root[runs[0][0]]
    assert str(raised.value).startswith(f"publish of run {RUN_ID} in {failing} failed (")
    assert str(raised.value).endswith(f"; run {RUN_ID} in {runs[0][0]} rolled back")
    assert _journal(published_first).state is journals.RunState.ROLLED_BACK
    assert "rollback swap TinyLib/1.0" in _journal(published_first).step_names()
    assert _journal(by_root[failing]).state is journals.RunState.FAILED
    assert _journal(by_root[failing]).run.error is not None
    assert [_live_state(site) for site in pair.sites] == before
    assert [_greeting(site) for site in pair.sites] == [tinypkgs.GREETING] * 2


def test_a_run_named_twice_is_refused_before_anything_is_published(pair):
    """Published twice, a run's second exchange would put its old tree back under a journal
    that says published."""
    first = pair.sites[0]
    before = [site.snapshot() for site in pair.sites]
    twice = [pair.runs()[0], (str(first.state_root) + "/", RUN_ID)]

    with pytest.raises(errors.UsageError) as raised:
        staged.publish_staged(twice, 0, lambda line: None)

    assert str(raised.value) == f"run {RUN_ID} in {first.state_root} is named twice"
    assert [site.snapshot() for site in pair.sites] == before
    assert _journal(first).state is journals.RunState.STAGED


# --- what the submitting side hands the engine ----------------------------------------------


def test_a_target_that_is_no_plain_name_is_refused_and_no_run_is_made(live_site):
    site = live_site

    with pytest.raises(errors.UsageError) as raised:
        rebuild.queue(_request(site, site.write_packages("gen2")), str(site.state_root), target="../zen3")

    assert str(raised.value) == "target '../zen3' is not a plain name"
    assert not (site.state_root / "runs").exists()


@pytest.mark.parametrize("job_id", ["", "12.5", "123;rm -rf /", "12\n13", "1" * 21])
def test_a_job_id_that_is_not_digits_is_refused_and_not_recorded(live_site, job_id):
    site = live_site
    journal = rebuild.queue(_request(site, site.write_packages("gen2")), str(site.state_root))
    written = Path(journal.path).read_bytes()

    with pytest.raises(errors.UsageError) as raised:
        rebuild.record_job(journal, job_id)

    assert str(raised.value) == f"job id {job_id!r} is not a job id (digits)"
    assert Path(journal.path).read_bytes() == written
    assert _journal(site).run.job.job_id is None


def test_a_failed_first_publish_leaves_the_second_run_staged_and_says_so(pair):
    before = [_live_state(site) for site in pair.sites]
    runs = sorted(pair.runs())
    by_root = {str(site.state_root): site for site in pair.sites}

    with pytest.raises(errors.PublishError) as raised:
        staged.publish_staged(runs, 0, lambda line: None, faults={runs[0][0]: faults.Faults(fail_at=1)})

    assert str(raised.value).startswith(f"publish of run {RUN_ID} in {runs[0][0]} failed (")
    assert str(raised.value).endswith(f"; run {RUN_ID} in {runs[1][0]} stays staged")
    assert raised.value.details["outcome"] == [f"run {RUN_ID} in {runs[1][0]} stays staged"]
    assert _journal(by_root[runs[0][0]]).state is journals.RunState.FAILED
    assert _journal(by_root[runs[1][0]]).state is journals.RunState.STAGED
    assert [_live_state(site) for site in pair.sites] == before
