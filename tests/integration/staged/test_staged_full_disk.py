"""A full disk (ENOSPC) and a read-only one (EROFS) at every write point the counting fault
harness knows, for rebuild, resume, rollback, retire, the rollback of a retire and gc.

Each case runs the real command line, ``cli.main(argv)``, in this process: the argument
parsing, the command, and the mapping of an error to ``eb-staged-rebuild: <message>`` and
exit 2 are the ones a user runs. The one thing put in is the fault plan: every journal the
command creates or loads gets the test's ``faults.Faults`` (the factory ``journal.Faults``
is replaced for the call), because the command line has, rightly, no option to inject a
failure. ``Faults(fail_at=n, errno=ENOSPC|EROFS)`` stands for a full or read-only disk at
exactly the n-th write point: the OSError a real write there raises, errno and kernel
words alike, where a real disk cannot be made to fail at each of a hundred points. The list
of points of each command is counted at collection time by a run with a counting plan, as
``test_staged_faults`` does, so a point added to the engine becomes a case of its own.

Every case asserts: exit 2; exactly one stderr line, ``eb-staged-rebuild: `` and the
errno's words, no traceback (the installpath backend's notice that EasyBuild runs without
a sandbox is the one other line a build prints, and is left aside); the live software and
module trees as they were (a module file or class link put back is a new inode with the
old bytes, so those inodes are not compared); and that the next command works without any
repair, as each command's ``next`` says.

The injected cases build their sites in memory (``/dev/shm``, a tmpfs, where it exists):
an fsync there costs nothing, and the hundred cases would otherwise spend most of their
time waiting for the disk; what they test, the paths an error takes, is the same.

An interrupted run for ``resume`` is made by a forked child of this process that kills
itself with SIGKILL at a write point, as ``test_staged_crash`` does with a separate
process: the disk is left exactly as a crash leaves it, at a fraction of the cost.

The injected cases publish one module: ``test_staged_faults`` runs every point of a
three-module publish and rollback (with EIO), and the paths an errno takes do not depend
on how many modules there are.

The last cases use a real small tmpfs (filled until the kernel says ENOSPC, then given
back the pages the writes before the failing one need) and a real read-only remount or
bind, for rollback, retire, the rollback of a retire, resume, gc, and a state root that
fails under a build: they show that the injected errors take the same paths as the
kernel's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, List
from unittest import mock

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import backends, cli, faults
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from tests.integration.harness import staged_matrix as matrix
from tests.integration.harness.staged_checks import refusal_line
from tests.support.staged import FAKE_EB, StagedSite, snapshot

APP = matrix.ONE[0]
ERRNOS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS}
INTERRUPTED = {state.value for state in journals.INTERRUPTED}


# --- running the command line in this process ------------------------------------------------


@dataclasses.dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    def result(self) -> dict:
        assert self.code == 0, (self.code, self.stdout, self.stderr)
        return json.loads(self.stdout)


@contextlib.contextmanager
def every_journal_with(plan: faults.Faults):
    """Every ``Journal`` made while the block runs (created or loaded) counts on ``plan``."""
    saved = journals.Faults
    journals.Faults = lambda: plan
    try:
        yield plan
    finally:
        journals.Faults = saved


def _environment():
    """The test builder on this interpreter, and no state root or setting from the caller's."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("EB_STAGED_REBUILD")}
    return mock.patch.dict(os.environ, dict(kept, **matrix.builder_env(matrix.ONE)), clear=True)


def run_cli(site: StagedSite, argv: List[str], plan=None) -> Outcome:
    """``eb-staged-rebuild --state-root <site's> ARGV`` through ``cli.main``, with ``plan``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(every_journal_with(plan or faults.Faults()))
        stack.enter_context(_environment())
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        code = cli.main(["--state-root", str(site.state_root), *argv])
    return Outcome(code, out.getvalue(), err.getvalue())


def crash_at(site: StagedSite, point: str, argv: List[str]) -> None:
    """Run ARGV in a forked child that SIGKILLs itself at the write point ``point``."""

    class Killing(faults.Faults):
        def before(self, operation):
            if operation == point:
                os.kill(os.getpid(), signal.SIGKILL)
            super().before(operation)

    pid = os.fork()
    if pid == 0:  # the child: never returns into the test session
        try:
            run_cli(site, argv, Killing())
        finally:
            os._exit(3)
    _pid, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"{point}: status {status}"
    assert os.WTERMSIG(status) == signal.SIGKILL, f"{point}: status {status}"


def rebuild_argv(site: StagedSite, run_id: str) -> List[str]:
    return [
        "--json",
        "rebuild",
        f"--installpath={site.installpath}",
        "--backend=installpath",  # the test builder knows no sandbox
        "--module",
        APP,
        "--eb",
        str(FAKE_EB),
        "--run-id",
        run_id,
        "--",
        APP.replace("/", "-") + ".eb",
    ]


def error_line(outcome: Outcome) -> str:
    """The one error line of a failed command (the no-sandbox notice of a build left aside)."""
    lines = [line for line in outcome.stderr.splitlines() if line != backends.UNSANDBOXED]
    stderr = "".join(line + "\n" for line in lines)
    return refusal_line(subprocess.CompletedProcess([], outcome.code, outcome.stdout, stderr))


def journal_state(site: StagedSite, run_id: str) -> str:
    return json.loads((site.state_root / "runs" / run_id / "journal.json").read_text())["state"]


def run_ids(site: StagedSite) -> List[str]:
    return sorted(path.name for path in (site.state_root / "runs").iterdir())


# --- the live trees ---------------------------------------------------------------------------


def replaced_entries(site: StagedSite) -> List[Path]:
    """A module file or class link that is put back is a new inode with the old content."""
    return [site.module_file(APP), matrix.class_link(site, APP)]


def trees(site: StagedSite, leaving_out=()) -> dict:
    """The live software and module trees without the inodes of ``replaced_entries`` and
    without anything at or under ``leaving_out`` (what the command may remove).

    The tool's staging area in the software tree (``.eb-staged-rebuild``, the generations) is
    no live tree: a failed run discards its stage there, and gc what stays.
    """
    found = matrix.without_inodes_of(snapshot(site.software, site.modules), replaced_entries(site))
    return left_out(found, [site.software / ".eb-staged-rebuild", *leaving_out])


def left_out(found: dict, leaving_out) -> dict:
    prefixes = [str(path) for path in leaving_out]
    return {
        path: entry
        for path, entry in found.items()
        if not any(path == prefix or path.startswith(prefix + os.sep) for prefix in prefixes)
    }


# --- the commands -------------------------------------------------------------------------------


@dataclasses.dataclass
class Command:
    """A command of the matrix: how its site is prepared, its arguments, what its failure
    leaves in the journal, and what the next command does after it."""

    setup: Callable[[StagedSite], dict]
    argv: Callable[[StagedSite, dict], List[str]]
    after_failure: Callable[[StagedSite, dict], None]
    next: Callable[[StagedSite, dict, dict], None]
    # What a failure at ``points[:index]`` may have removed already (gc removes one by one).
    removed: Callable[[StagedSite, List[str]], List[Path]] = lambda site, points: []


# installpath -> a copy of the prepared old site made at that very path (its module files
# name it): the injected cases reuse one path, and a copy costs less than a build.
_TEMPLATES: Dict[Path, Path] = {}


def _old_site(site: StagedSite) -> dict:
    template = _TEMPLATES.get(site.installpath)
    if template is not None:
        shutil.copytree(template, site.installpath, symlinks=True)
    else:
        matrix.prepare_old_site(site, matrix.ONE)
    return {"old": trees(site)}


def _published(site: StagedSite, *run_ids: str) -> dict:
    context = _old_site(site)
    for run_id in run_ids:
        assert run_cli(site, rebuild_argv(site, run_id)).result()["state"] == "published"
    return context


def _resume_publishes_nothing_and_a_new_rebuild_publishes(site: StagedSite, context: dict, _before) -> None:
    resumed = run_cli(site, ["--json", "resume"]).result()
    assert resumed["changed"] is False
    assert [(run["run_id"], run["state"]) for run in resumed["runs"]] == [("run1", "failed")]
    assert trees(site) == context["old"], "resume changed the live trees"
    assert run_cli(site, rebuild_argv(site, "run2")).result()["state"] == "published"
    assert site.payload(APP) == "new build"


def _ended_failed(site: StagedSite, context: dict) -> None:
    assert journal_state(site, "run1") == "failed"
    assert site.payload(APP) == "old"


def _crashed(point: str, state: str) -> Callable[[StagedSite], dict]:
    """The old site, then a rebuild killed at ``point``, which leaves its run ``state``."""

    def setup(site: StagedSite) -> dict:
        context = _old_site(site)
        crash_at(site, point, rebuild_argv(site, "run1"))
        assert journal_state(site, "run1") == state
        return context

    return setup


def _assert_resume_again_returns_to_the_old_tree(site: StagedSite, context: dict, _before) -> None:
    (run,) = run_cli(site, ["--json", "resume"]).result()["runs"]
    assert (run["run_id"], run["state"], run["changed"]) == ("run1", "failed", True)
    assert without_siblings(trees(site), site) == without_siblings(context["old"], site)


def _still(state: str, run_id: str = "run1") -> Callable[[StagedSite, dict], None]:
    def check(site: StagedSite, context: dict) -> None:
        assert journal_state(site, context.get("run_id", run_id)) == state

    return check


def _assert_rollback_again_puts_the_old_tree_back(site: StagedSite, context: dict, _before) -> None:
    result = run_cli(site, ["--json", "rollback", "run1"]).result()
    assert (result["state"], result["changed"]) == ("rolled_back", True)
    assert without_siblings(trees(site), site) == without_siblings(context["old"], site)
    assert site.payload(APP) == "old"


def _retire_argv(site: StagedSite, _context: dict) -> List[str]:
    return ["--json", "retire", str(site.module_file(APP)), "--reason", "on CVMFS"]


def _retire_left_no_interrupted_run(site: StagedSite, context: dict) -> None:
    assert site.module_file(APP).is_file()
    states = {run_id: journal_state(site, run_id) for run_id in run_ids(site)}
    assert not INTERRUPTED & set(states.values()), states


def _assert_retire_again_retires(site: StagedSite, context: dict, _before) -> None:
    result = run_cli(site, _retire_argv(site, context)).result()
    assert result["state"] == "retired"
    assert not site.module_file(APP).exists()
    assert Path(result["retired_to"]).is_file()
    status = run_cli(site, ["--json", "status"]).result()
    assert not [run for run in status["runs"] if run["state"] in INTERRUPTED], status["runs"]


def _retired(site: StagedSite) -> dict:
    context = _old_site(site)
    context["run_id"] = run_cli(site, _retire_argv(site, context)).result()["run_id"]
    return context


def _rollback_of_retire_argv(_site: StagedSite, context: dict) -> List[str]:
    return ["--json", "rollback", context["run_id"]]


def _assert_rollback_of_retire_again_puts_it_back(site: StagedSite, context: dict, _before) -> None:
    result = run_cli(site, _rollback_of_retire_argv(site, context)).result()
    assert (result["state"], result["changed"]) == ("rolled_back", True)
    assert trees(site) == context["old"]


def _gc_removed(site: StagedSite, points: List[str]) -> List[Path]:
    return [site.software / point[len("gc remove ") :] for point in points if point.startswith("gc remove ")]


def _assert_gc_again_removes_the_old_trees(site: StagedSite, context: dict, before: dict) -> None:
    report = run_cli(site, ["--json", "gc", "--grace-hours", "0"]).result()
    assert report["interrupted"] == []
    assert report["incomplete"] == []
    left = list((site.software / APP.split("/")[0]).iterdir())
    assert [path.name for path in left] == [APP.split("/")[1]], "only the live tree stays"
    assert trees(site) == without_siblings(before, site)


def without_siblings(found: dict, site: StagedSite) -> dict:
    """``found`` without the hidden siblings of the live tree: the trees a rollback or
    resume put aside, which gc removes."""
    parent = str(site.software / APP.split("/")[0])
    return {path: entry for path, entry in found.items() if not path.startswith(parent + os.sep + ".")}


def _nothing(site: StagedSite, context: dict) -> None:
    pass


COMMANDS: Dict[str, Command] = {
    "rebuild": Command(
        setup=_old_site,
        argv=lambda site, context: rebuild_argv(site, "run1"),
        after_failure=_ended_failed,
        next=_resume_publishes_nothing_and_a_new_rebuild_publishes,
    ),
    # A run killed just before its build: resume builds and publishes it.
    "resume_building": Command(
        setup=_crashed("build", "building"),
        argv=lambda site, context: ["--json", "resume"],
        after_failure=_ended_failed,
        next=_resume_publishes_nothing_and_a_new_rebuild_publishes,
    ),
    # A run killed after its last publish operation, before it was journaled: all of it is
    # new on disk, and resume returns it to the old tree.
    "resume_publishing": Command(
        setup=_crashed(f"journal class-link tools {APP}", "publishing"),
        argv=lambda site, context: ["--json", "resume"],
        after_failure=_still("publishing"),
        next=_assert_resume_again_returns_to_the_old_tree,
    ),
    "rollback": Command(
        setup=lambda site: _published(site, "run1"),
        argv=lambda site, context: ["--json", "rollback", "run1"],
        after_failure=_still("published"),
        next=_assert_rollback_again_puts_the_old_tree_back,
    ),
    "retire": Command(
        setup=_old_site,
        argv=_retire_argv,
        after_failure=_retire_left_no_interrupted_run,
        next=_assert_retire_again_retires,
    ),
    "rollback_of_retire": Command(
        setup=_retired,
        argv=_rollback_of_retire_argv,
        after_failure=_still("retired"),
        next=_assert_rollback_of_retire_again_puts_it_back,
    ),
    # Two publishes of the same module: two old trees for gc to remove.
    "gc": Command(
        setup=lambda site: _published(site, "run1", "run2"),
        argv=lambda site, context: ["--json", "gc", "--grace-hours", "0"],
        after_failure=_nothing,
        next=_assert_gc_again_removes_the_old_trees,
        removed=_gc_removed,
    ),
}


MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") else None


@contextlib.contextmanager
def scratch_site(package_root=None):
    with tempfile.TemporaryDirectory(prefix="staged-full-disk-", dir=MEMORY) as tmp:
        yield StagedSite(
            installpath=Path(tmp, "apps"),
            state_root=Path(tmp, "state"),
            package_root=package_root or Path(tmp),
        )


@pytest.fixture(scope="module")
def memory_root(package_root):
    """A directory in memory whose ``apps`` every injected case uses in turn, with the
    template of the old site made there once."""
    with tempfile.TemporaryDirectory(prefix="staged-full-disk-", dir=MEMORY) as tmp:
        site = StagedSite(
            installpath=Path(tmp, "apps"), state_root=Path(tmp, "state"), package_root=package_root
        )
        matrix.prepare_old_site(site, matrix.ONE)
        template = Path(tmp, "template")
        shutil.copytree(site.installpath, template, symlinks=True)
        shutil.rmtree(site.installpath)
        _TEMPLATES[site.installpath] = template
        try:
            yield site
        finally:
            del _TEMPLATES[site.installpath]


@pytest.fixture
def memory_site(memory_root):
    try:
        yield memory_root
    finally:
        for path in (memory_root.installpath, memory_root.state_root):
            if os.path.lexists(path):
                shutil.rmtree(path)


def count_points(name: str) -> List[str]:
    """The write points of a successful run of command ``name``, on a throw-away site."""
    command = COMMANDS[name]
    with scratch_site() as site:
        context = command.setup(site)
        counting = faults.Faults()
        outcome = run_cli(site, command.argv(site, context), counting)
        assert outcome.code == 0, (name, outcome.stderr)
        return list(counting.operations)


POINTS = {name: count_points(name) for name in COMMANDS}

CASES = [
    pytest.param(name, index, point, errname, id=f"{name}-{matrix.case_id(index, point)}-{errname}")
    for name, points in POINTS.items()
    for index, point in enumerate(points, start=1)
    for errname in ERRNOS
]


def test_every_command_has_write_points_and_the_cases_name_them_all():
    """The premise of the matrix: each command counts points, and its last is what it ends with."""
    assert all(POINTS.values()), POINTS
    assert POINTS["rebuild"][:2] == ["build", "journal build"]
    assert POINTS["rebuild"][-1] == "state published"
    assert POINTS["resume_building"] == POINTS["rebuild"], "resume builds and publishes the same way"
    assert POINTS["resume_publishing"] == [
        f"resume class-link tools {APP}",
        f"journal resume class-link tools {APP}",
        f"resume module {APP}",
        f"journal resume module {APP}",
        f"resume swap {APP}",
        f"journal resume swap {APP}",
    ]
    assert POINTS["rollback"][-1] == "state rolled_back"
    assert POINTS["retire"] == ["retire move", "state retired"]
    assert POINTS["rollback_of_retire"] == ["rollback move", "state rolled_back"]
    assert POINTS["gc"] == [
        f"gc remove {APP.split('/')[0]}/.{APP.split('/')[1]}.{run}" for run in ("run1", "run2")
    ]
    assert len(CASES) == 2 * sum(len(points) for points in POINTS.values())


@pytest.mark.parametrize(("name", "index", "point", "errname"), CASES)
def test_a_full_or_read_only_disk_at_each_write_point_fails_in_one_line_and_the_next_command_works(
    memory_site, name, index, point, errname
):
    command = COMMANDS[name]
    site = memory_site
    context = command.setup(site)
    before = trees(site)
    plan = faults.Faults(fail_at=index, errno=ERRNOS[errname])

    outcome = run_cli(site, command.argv(site, context), plan)

    assert plan.operations == POINTS[name][:index], "the command did not reach the point it failed at"
    line = error_line(outcome)
    assert line.startswith("eb-staged-rebuild: ")
    assert os.strerror(ERRNOS[errname]) in line, line
    leaving_out = command.removed(site, POINTS[name][: index - 1])
    assert trees(site, leaving_out) == left_out(before, leaving_out), "the live trees changed"
    command.after_failure(site, context)
    command.next(site, context, before)


# --- a real full disk and a real read-only one ------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 4 MiB at ``tmp_path/disk``, in this process's mount namespace (tests run as
    root), unmounted at the end."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "none", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], check=True)


PAGE = os.sysconf("SC_PAGE_SIZE")  # tmpfs allocates whole pages: one holds the lock's record, or one journal


def fill(disk: Path, pages_left: int = 0) -> Path:
    """Write a file on ``disk`` until the kernel says ENOSPC, then give ``pages_left`` pages
    back: the writes of a command up to the one that must fail. Remove it to free the disk."""
    filler = disk / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as handle:
        with pytest.raises(OSError) as raised:  # noqa: PT012 - the loop ends in ENOSPC
            while True:
                handle.write(chunk)
        assert raised.value.errno == errno.ENOSPC
        handle.truncate(max(0, handle.tell() - pages_left * PAGE))
    return filler


@contextlib.contextmanager
def read_only(disk: Path):
    """``disk`` remounted read-only for the block, then writable again."""
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)


def on(disk: Path, tmp_path: Path, package_root: Path, state_on_disk: bool) -> StagedSite:
    """A site whose live trees are on ``disk``; its state root too with ``state_on_disk``
    (retire needs one filesystem), else on the test's own filesystem."""
    state_root = disk / "state" if state_on_disk else tmp_path / "state"
    return StagedSite(installpath=disk / "apps", state_root=state_root, package_root=package_root)


def assert_fails_with(outcome: Outcome, code: int) -> None:
    line = error_line(outcome)
    assert os.strerror(code) in line, line


def test_rollback_on_a_really_full_module_tree_keeps_the_published_tree_and_works_once_space_is_freed(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=False)
    context = _published(site, "run1")
    published = trees(site)
    filler = fill(small_disk)

    assert_fails_with(run_cli(site, ["--json", "rollback", "run1"]), errno.ENOSPC)

    assert trees(site) == published
    assert journal_state(site, "run1") == "published"
    filler.unlink()
    _assert_rollback_again_puts_the_old_tree_back(site, context, published)


def test_rollback_on_a_really_read_only_live_tree_keeps_the_published_tree_and_works_once_writable(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=False)
    context = _published(site, "run1")
    published = trees(site)

    with read_only(small_disk):
        assert_fails_with(run_cli(site, ["--json", "rollback", "run1"]), errno.EROFS)
        assert trees(site) == published

    assert journal_state(site, "run1") == "published"
    _assert_rollback_again_puts_the_old_tree_back(site, context, published)


def test_retire_on_a_really_full_disk_fails_at_its_first_journal_and_works_once_space_is_freed(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=True)
    context = _old_site(site)
    site.state_root.mkdir()
    filler = fill(small_disk, pages_left=1)  # the lock's record fits, the first journal does not

    outcome = run_cli(site, _retire_argv(site, context))

    assert_fails_with(outcome, errno.ENOSPC)
    assert "cannot write the first journal" in outcome.stderr
    assert trees(site) == context["old"]
    assert run_ids(site) == [], "no run, not even a hidden leftover of its creation"
    filler.unlink()
    _assert_retire_again_retires(site, context, context["old"])


def test_retire_that_a_really_full_disk_stops_after_its_rename_puts_the_file_back(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=True)
    context = _old_site(site)
    site.state_root.mkdir()
    filler = fill(small_disk, pages_left=2)  # the lock's record and the first journal fit

    assert_fails_with(run_cli(site, _retire_argv(site, context)), errno.ENOSPC)

    assert trees(site) == context["old"], "the module file is back where it was"
    (run_id,) = run_ids(site)
    # Nor does the journal's "rolled_back" fit: the run stays retiring, with nothing moved,
    # which its rollback resolves once there is space.
    assert journal_state(site, run_id) == "retiring"
    filler.unlink()
    resolved = run_cli(site, ["--json", "rollback", run_id]).result()
    assert (resolved["state"], resolved["changed"]) == ("rolled_back", True)
    assert trees(site) == context["old"]
    _assert_retire_again_retires(site, context, context["old"])


def test_retire_on_a_really_read_only_disk_changes_nothing_and_works_once_writable(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=True)
    context = _old_site(site)
    site.state_root.mkdir()

    with read_only(small_disk):
        assert_fails_with(run_cli(site, _retire_argv(site, context)), errno.EROFS)
        assert trees(site) == context["old"]

    _assert_retire_again_retires(site, context, context["old"])


def test_the_rollback_of_a_retire_on_a_really_full_disk_leaves_it_retired_and_works_once_space_is_freed(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=True)
    context = _retired(site)
    retired = trees(site)
    # The lock's record fits; the rename back needs no space; the journal's "rolled_back" fails.
    filler = fill(small_disk, pages_left=1)

    assert_fails_with(run_cli(site, _rollback_of_retire_argv(site, context)), errno.ENOSPC)

    assert trees(site) == retired, "the module file is where the journal says: retired"
    assert journal_state(site, context["run_id"]) == "retired"
    filler.unlink()
    _assert_rollback_of_retire_again_puts_it_back(site, context, retired)


def test_gc_on_a_really_read_only_software_tree_fails_in_one_line_and_works_once_writable(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=False)
    context = _published(site, "run1", "run2")
    before = trees(site)

    with read_only(small_disk):
        assert_fails_with(run_cli(site, ["--json", "gc", "--grace-hours", "0"]), errno.EROFS)
        assert trees(site) == before

    _assert_gc_again_removes_the_old_trees(site, context, before)


def test_gc_on_a_really_full_disk_removes_the_old_trees_it_needs_no_space_for(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=False)
    context = _published(site, "run1", "run2")
    before = trees(site)
    fill(small_disk)

    _assert_gc_again_removes_the_old_trees(site, context, before)


def test_resume_on_a_really_full_module_tree_reverses_what_it_did_and_works_once_space_is_freed(
    small_disk, tmp_path, package_root
):
    site = on(small_disk, tmp_path, package_root, state_on_disk=False)
    context = _crashed(f"journal class-link tools {APP}", "publishing")(site)
    crashed = trees(site)
    filler = fill(small_disk)

    # The class link is put back (a short link needs no page), then the module file does not fit.
    outcome = run_cli(site, ["--json", "resume"])

    assert_fails_with(outcome, errno.ENOSPC)
    assert "resume of run run1 failed" in outcome.stderr
    assert trees(site) == crashed, "the class link went back to the new tree with the module file"
    assert journal_state(site, "run1") == "publishing"
    filler.unlink()
    _assert_resume_again_returns_to_the_old_tree(site, context, crashed)


class _AtTheBuild(faults.Faults):
    """A plan that injects nothing: it runs ``action`` (a real remount, a real filling of the
    disk) at the build's write point, so that the disk fails under the build."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    def before(self, operation):
        if operation == "build":
            self.action()
        super().before(operation)


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_a_state_root_read_only_or_full_during_the_build_ends_failed_and_resume_publishes_nothing(
    small_disk, tmp_path, package_root, how
):
    site = StagedSite(
        installpath=tmp_path / "apps", state_root=small_disk / "state", package_root=package_root
    )
    context = _old_site(site)
    runs = site.state_root / "runs"
    runs.mkdir(parents=True, mode=0o700)
    filled = []

    def fail_the_disk():
        if how == "read-only":
            # A read-only bind of runs/ over itself: the remount of the whole tmpfs is refused
            # while the command holds its lock file open for writing.
            subprocess.run(["mount", "--bind", str(runs), str(runs)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(runs)], check=True)
        else:
            filled.append(fill(small_disk))

    try:
        outcome = run_cli(site, rebuild_argv(site, "run1"), _AtTheBuild(fail_the_disk))
    finally:
        if how == "read-only":
            subprocess.run(["umount", str(runs)], check=True)
        for filler in filled:
            filler.unlink()

    line = error_line(outcome)
    assert os.strerror(errno.EROFS if how == "read-only" else errno.ENOSPC) in line, line
    assert "could not be marked failed" in line
    assert "ends it failed, building nothing" in line
    assert trees(site) == context["old"]
    assert journal_state(site, "run1") == "building", "the journal could not be written"
    assert not os.path.lexists(site.software / ".eb-staged-rebuild" / "run1"), "the stage was discarded"

    resumed = run_cli(site, ["--json", "resume"]).result()

    (run,) = resumed["runs"]
    assert (run["run_id"], run["state"], run["changed"]) == ("run1", "failed", True)
    assert "nothing published" in run["actions"][0]
    assert trees(site) == context["old"], "resume built and published a run that failed"
    assert site.payload(APP) == "old"
    assert run_cli(site, rebuild_argv(site, "run2")).result()["state"] == "published"


def test_gc_with_its_state_root_on_the_really_full_disk_stops_at_the_lock_and_works_once_space_is_freed(
    small_disk, tmp_path, package_root
):
    """The lock's holder record needs a page: on a disk that is full to the last page, gc
    (which would free space) refuses in one line before it changes anything."""
    site = on(small_disk, tmp_path, package_root, state_on_disk=True)
    context = _published(site, "run1", "run2")
    before = trees(site)
    filler = fill(small_disk)

    outcome = run_cli(site, ["--json", "gc", "--grace-hours", "0"])

    assert_fails_with(outcome, errno.ENOSPC)
    assert "cannot record the lock holder" in outcome.stderr
    assert trees(site) == before
    filler.unlink()
    _assert_gc_again_removes_the_old_trees(site, context, before)
