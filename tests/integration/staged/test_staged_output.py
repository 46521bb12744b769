"""eb-staged-rebuild's output for people, command by command, on one small tree; ``--json`` unchanged.

One scenario on a tree of two modules built by the test builder: two rebuilds, status,
gc, a rollback, a retire, an interrupted run that resume ends, gc again, then the retire's
block, its rollback and a rollback that changes nothing. The text test
runs it in-process (``cli.main(argv, now=...)``) and compares every command's whole output
with the text below. The times are made fixed through the journal's own values (each run's
``created``, ``state_since`` and step times are set to fixed moments before a command reads
them) and the command's ``now``; local time is Europe/Berlin, so the times shown are
visibly local. The inodes in the expected text are read with ``os.stat`` as the test goes,
not from the tool.

The JSON test runs the same scenario through the real command and compares each ``--json``
document with the one the release before the text output printed for it
(``expected/staged_json.json``), after replacing what differs from run to run and nothing
else: the checkout's and the test's directories, times, inode numbers, digests of files
that hold the paths, the retire run's time stamp, and which and how many processes gc
scanned.
"""

from __future__ import annotations

import datetime
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import cli
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import RunState
from tests.support.staged import FAKE_EB, StagedSite
from tests.support.timezone import local_zone
from tests.unit.plugins.module_utils.staged_rebuild.journal_records import publish_journal, trees_of

HELLO, ZLIB = "hello/1.0", "zlib/1.3"
EXPECTED_JSON = Path(__file__).parent / "expected" / "staged_json.json"
T0 = datetime.datetime(2026, 3, 2, 8, 0, 0, tzinfo=datetime.timezone.utc)
# A day, two hours and a bit after the first run: every grace period of 144 h still runs.
NOW = T0 + datetime.timedelta(days=1, hours=2, minutes=30, seconds=15)
REASON = "replaced by zlib/1.3.1"


def _rebuild(site, run_id, *modules):
    args = [f"--installpath={site.installpath}", f"--eb={FAKE_EB}", f"--run-id={run_id}"]
    args += ["--backend=installpath", *(f"--module={module}" for module in modules), "--"]
    return ["rebuild", *args, *(module.replace("/", "-") + ".eb" for module in modules)]


def _interrupt(site, run_id="r3"):
    """A rebuild of hello/1.0 that stopped while building, its live-change record taken (as a
    building run's always is) and before its build area was made: resume ends it failed,
    building nothing."""
    journal = publish_journal(
        site.state_root / "runs",
        run_id,
        trees_of(site.installpath),
        modules=(HELLO,),
        state=RunState.BUILDING,
    )
    return journal.run_id


def _fix_times(state_root):
    """Every run's times set to fixed moments, an hour apart in the order the runs began."""
    for index, journal in enumerate(journals.run_journals(str(state_root))):
        created = T0 + datetime.timedelta(hours=index)
        run = journal.run
        run.created = created.isoformat()
        run.state_since = (created + datetime.timedelta(minutes=5)).isoformat()
        for number, step in enumerate(run.steps):
            step.at = (created + datetime.timedelta(seconds=number + 1)).isoformat()
        if run.resumed is not None:
            run.resumed = run.state_since
        if run.retired_at is not None:
            run.retired_at = run.state_since
        journal.save()


@pytest.fixture
def berlin():
    """Local time is Europe/Berlin (UTC+1 in March) for the test."""
    with local_zone("Europe/Berlin"):
        yield


@pytest.fixture
def tree_root():
    """The tree's directory: a name of one length (``/tmp/eb-text-`` and 8 random characters),
    so that every run wraps its lines at the same places."""
    root = Path(tempfile.mkdtemp(prefix="eb-text-", dir="/tmp"))
    yield root
    shutil.rmtree(root)


@pytest.fixture
def site(tree_root, package_root, monkeypatch):
    for name in (
        "EB_STAGED_REBUILD_STATE_ROOT",
        "EB_STAGED_REBUILD_GRACE_HOURS",
        "EB_STAGED_REBUILD_BACKEND",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    built = StagedSite(
        installpath=tree_root / "apps", state_root=tree_root / "state", package_root=package_root
    )
    built.install(HELLO, ZLIB)
    return built


def _ino(path) -> int:
    return os.stat(path).st_ino


class _Text:
    """``eb-staged-rebuild --state-root <root> ARGS`` in-process at ``NOW``: (exit, stdout, stderr)."""

    def __init__(self, site, capsys):
        self.site, self.capsys = site, capsys

    def __call__(self, *args):
        code = cli.main(["--state-root", str(self.site.state_root), *args], now=NOW)
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err


UNSANDBOXED_WARNING = (
    "eb-staged-rebuild: warning: backend installpath: EasyBuild runs WITHOUT a sandbox; a hook that "
    "writes outside its install path is not contained (--backend bwrap|userns requires one)\n"
)

REBUILD_R1 = """\
Published run r1: 1 module swapped in (backend installpath, no sandbox).

hello/1.0
  Live:          {root}/apps/software/hello/1.0
  Inode:         {hello_1}, was {hello_0}
  Previous:      {root}/apps/software/hello/.1.0.r1
  Module file:   {root}/apps/modules/all/hello/1.0.lua
  Previous file: {root}/state/runs/r1/backup/hello/1.0.lua

The previous trees stay for the jobs still running from them and for rollback, until gc removes
  them.
Undo: eb-staged-rebuild --state-root {root}/state rollback r1
"""

REBUILD_R2 = """\
Published run r2: 2 modules swapped in (backend installpath, no sandbox).

hello/1.0
  Live:          {root}/apps/software/hello/1.0
  Inode:         {hello_2}, was {hello_1}
  Previous:      {root}/apps/software/hello/.1.0.r2
  Module file:   {root}/apps/modules/all/hello/1.0.lua
  Previous file: {root}/state/runs/r2/backup/hello/1.0.lua

zlib/1.3
  Live:          {root}/apps/software/zlib/1.3
  Inode:         {zlib_2}, was {zlib_0}
  Previous:      {root}/apps/software/zlib/.1.3.r2
  Module file:   {root}/apps/modules/all/zlib/1.3.lua
  Previous file: {root}/state/runs/r2/backup/zlib/1.3.lua

The previous trees stay for the jobs still running from them and for rollback, until gc removes
  them.
Undo: eb-staged-rebuild --state-root {root}/state rollback r2
"""

STATUS_TWO_RUNS = """\
RUN  KIND     STATE      CREATED                              MODULES
r1   publish  published  2026-03-02 09:00:00 (1 day 2 h ago)  hello/1.0
r2   publish  published  2026-03-02 10:00:00 (1 day 1 h ago)  hello/1.0, zlib/1.3
"""

STATUS_R2 = """\
Run:         r2
Kind:        publish, backend installpath, no sandbox
State:       published since 2026-03-02 10:05:00 (1 day 1 h ago)
Created:     2026-03-02 10:00:00 (1 day 1 h ago)
Journal:     {root}/state/runs/r2/journal.json

Module hello/1.0
  Live:        {root}/apps/software/hello/1.0
  Retired:     {root}/apps/software/hello/.1.0.r2 (exists)
  Module file: {root}/apps/modules/all/hello/1.0.lua

Module zlib/1.3
  Live:        {root}/apps/software/zlib/1.3
  Retired:     {root}/apps/software/zlib/.1.3.r2 (exists)
  Module file: {root}/apps/modules/all/zlib/1.3.lua

Steps:
  2026-03-02 10:00:01  build
  2026-03-02 10:00:02  relocate
  2026-03-02 10:00:03  marker hello/1.0
  2026-03-02 10:00:04  prepare-module hello/1.0
  2026-03-02 10:00:05  backup hello/1.0
  2026-03-02 10:00:06  stage-move hello/1.0
  2026-03-02 10:00:07  marker zlib/1.3
  2026-03-02 10:00:08  prepare-module zlib/1.3
  2026-03-02 10:00:09  backup zlib/1.3
  2026-03-02 10:00:10  stage-move zlib/1.3
  2026-03-02 10:00:11  swap hello/1.0
  2026-03-02 10:00:12  swap zlib/1.3
  2026-03-02 10:00:13  module hello/1.0
  2026-03-02 10:00:14  class-link tools hello/1.0
  2026-03-02 10:00:15  module zlib/1.3
  2026-03-02 10:00:16  class-link tools zlib/1.3

Undo: eb-staged-rebuild --state-root {root}/state rollback r2
"""

GC_DRY_RUN = """\
kept          {root}/apps/software/hello/.1.0.r1
              grace period of 144 h: 4 days 21 h left, until 2026-03-08 09:05:00
kept          {root}/apps/software/hello/.1.0.r2
              grace period of 144 h: 4 days 22 h left, until 2026-03-08 10:05:00
kept          {root}/apps/software/zlib/.1.3.r2
              grace period of 144 h: 4 days 22 h left, until 2026-03-08 10:05:00

Processes: {scan}).
Slurm: not asked (--no-squeue); trees are kept for the grace period.
0 would be removed, 3 kept, 0 to remove by hand.
"""

ROLLBACK_R2 = """\
Rolled back run r2: the previous trees are live again.

hello/1.0
  Live:          {root}/apps/software/hello/1.0
  Inode:         {hello_1} again, was {hello_2}
  Rolled back:   {root}/apps/software/hello/.1.0.r2
  Module file:   {root}/apps/modules/all/hello/1.0.lua
  Restored from: {root}/state/runs/r2/backup/hello/1.0.lua

zlib/1.3
  Live:          {root}/apps/software/zlib/1.3
  Inode:         {zlib_0} again, was {zlib_2}
  Rolled back:   {root}/apps/software/zlib/.1.3.r2
  Module file:   {root}/apps/modules/all/zlib/1.3.lua
  Restored from: {root}/state/runs/r2/backup/zlib/1.3.lua

The rolled-back builds stay until gc removes them.
Undo (build and publish again):
  eb-staged-rebuild --state-root {root}/state rebuild \\
    --installpath={root}/apps --module=hello/1.0 --module=zlib/1.3 -- hello-1.0.eb \\
    zlib-1.3.eb
"""

RETIRE = """\
Retired run {retire}: the module file is out of MODULEPATH's way.
  Module file: {root}/apps/modules/all/zlib/1.3.lua
  Kept at:
    {root}/state/retired/{stamp}{root}/apps/modules/all/zlib/1.3.lua
  Software:    {root}/apps/software/zlib/1.3

The software directory stays: gc names it for removal by hand once no tracked module uses it and the
  grace period is over.
Undo:
  eb-staged-rebuild --state-root {root}/state rollback \\
    {retire}
"""

# The retire run's id leaves too little room beside it: each run's modules go under its row.
STATUS_FOUR_RUNS = """\
RUN                            KIND     STATE        CREATED
    MODULES
r1                             publish  published    2026-03-02 09:00:00 (1 day 2 h ago)
    hello/1.0
r2                             publish  rolled_back  2026-03-02 10:00:00 (1 day 1 h ago)
    hello/1.0, zlib/1.3
{retire}  retire   retired      2026-03-02 11:00:00 (1 day ago)
    zlib/1.3
r3                             publish  building     2026-03-02 12:00:00 (23 h 30 min ago)
    hello/1.0

Run r3 is interrupted (building); next:
  eb-staged-rebuild --state-root {root}/state resume
"""

RESUME = """\
Resumed run r3: failed.
  no build area: it failed or stopped before building; nothing published; ended failed
  The trees are as they were before the run; there is nothing to undo.
"""

GC = """\
removed  {root}/apps/software/hello/.1.0.r1
removed  {root}/apps/software/hello/.1.0.r2
removed  {root}/apps/software/zlib/.1.3.r2
manual   {root}/apps/software/zlib/1.3
         run {retire}: retired; no tracked module uses it: delete it by hand
           when sure

Processes: {scan}).
Slurm: not asked (--no-squeue); trees are kept for the grace period.
3 removed, 0 kept, 1 to remove by hand.
"""


STATUS_RETIRE = """\
Run:         {retire}
Kind:        retire
State:       retired since 2026-03-02 11:05:00 (1 day ago)
Created:     2026-03-02 11:00:00 (1 day ago)
Journal:     {root}/state/runs/{retire}/journal.json
Module file: {root}/apps/modules/all/zlib/1.3.lua
Retired to:
  {root}/state/retired/{stamp}{root}/apps/modules/all/zlib/1.3.lua (exists)
Software:    {root}/apps/software/zlib/1.3
Reason:      replaced by zlib/1.3.1

Undo:
  eb-staged-rebuild --state-root {root}/state rollback \\
    {retire}
"""

ROLLBACK_RETIRE = """\
Rolled back run {retire}: module file
  {root}/apps/modules/all/zlib/1.3.lua is back in place.

Undo:
  eb-staged-rebuild --state-root {root}/state retire \\
    {root}/apps/modules/all/zlib/1.3.lua --reason 'replaced by zlib/1.3.1'
"""


def _scan(out):
    """What gc says of its scan of this host's processes: how many it read and which (every
    process as root, a user's own otherwise), which no test can fix."""
    found = re.search(r"^Processes: (\d+ checked \(.*)\)\.$", out, re.MULTILINE)
    assert found, out
    return {"scan": found.group(1)}


def test_each_command_prints_the_expected_text(site, capsys, berlin):
    tool = _Text(site, capsys)
    fill = {
        "root": str(site.installpath.parent),
        "hello_0": _ino(site.live(HELLO)),
        "zlib_0": _ino(site.live(ZLIB)),
    }

    code, out, err = tool(*_rebuild(site, "r1", HELLO))
    fill["hello_1"] = _ino(site.live(HELLO))
    assert (code, out) == (0, REBUILD_R1.format(**fill))
    assert err.startswith(UNSANDBOXED_WARNING)

    code, out, err = tool(*_rebuild(site, "r2", HELLO, ZLIB))
    fill["hello_2"], fill["zlib_2"] = _ino(site.live(HELLO)), _ino(site.live(ZLIB))
    assert (code, out) == (0, REBUILD_R2.format(**fill))

    _fix_times(site.state_root)
    assert tool("status") == (0, STATUS_TWO_RUNS.format(**fill), "")
    assert tool("status", "r2") == (0, STATUS_R2.format(**fill), "")
    code, out, err = tool("gc", "--dry-run", "--no-squeue")
    assert (code, out, err) == (0, GC_DRY_RUN.format(**fill, **_scan(out)), "")

    assert tool("rollback", "r2") == (0, ROLLBACK_R2.format(**fill), "")
    assert _ino(site.live(HELLO)) == fill["hello_1"]

    code, out, err = tool("retire", str(site.module_file(ZLIB)), "--reason", REASON)
    (retire,) = [run.name for run in (site.state_root / "runs").iterdir() if run.name.startswith("retire-")]
    fill.update(retire=retire, stamp=retire[len("retire-") :])
    assert (code, out, err) == (0, RETIRE.format(**fill), "")

    _interrupt(site)
    _fix_times(site.state_root)
    assert tool("status") == (0, STATUS_FOUR_RUNS.format(**fill), "")
    assert tool("resume") == (0, RESUME.format(**fill), "")
    assert tool("resume") == (0, "Nothing to resume: no run is interrupted.\n", "")

    _fix_times(site.state_root)
    code, out, err = tool("gc", "--no-squeue", "--grace-hours", "0")
    assert (code, out, err) == (0, GC.format(**fill, **_scan(out)), "")

    assert tool("status", retire) == (0, STATUS_RETIRE.format(**fill), "")
    assert tool("rollback", retire) == (0, ROLLBACK_RETIRE.format(**fill), "")
    assert site.module_file(ZLIB).is_file()
    assert tool("rollback", "r2") == (
        0,
        "Run r2 is rolled_back: nothing to roll back, nothing changed.\n",
        "",
    )


# --json: byte for byte what the release before the text output printed


def _normalized(document: str, root: str) -> str:
    """``document`` with what differs from run to run replaced, and nothing else."""
    # The test builder's path is the checkout's: the journal records the EasyBuild command.
    text = document.replace(str(FAKE_EB), "<fake-eb>").replace(root, "<root>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", "<time>", text)
    text = re.sub(r"\d{8}T\d{12}Z", "<stamp>", text)
    text = re.sub(r'"(live_ino|stage_ino)": \d+', r'"\1": "<ino>"', text)
    text = re.sub(r'"(scanned|unreadable|as_uid)": \d+', r'"\1": "<count>"', text)
    text = re.sub(r'"seen": "[^"]*"', '"seen": "<whose processes>"', text)
    return re.sub(r"[0-9a-f]{64}", "<sha256>", text)


def json_documents(site: StagedSite) -> dict:
    """Every command of the scenario with ``--json``, through the real command: name -> stdout."""
    documents = {}

    def run(name, *args):
        done = site.run("--json", *args)
        assert done.returncode in (0, 1), done.stderr
        documents[name] = _normalized(done.stdout, str(site.installpath.parent))

    run("rebuild r1", *_rebuild(site, "r1", HELLO))
    run("rebuild r2", *_rebuild(site, "r2", HELLO, ZLIB))
    run("status", "status")
    run("status r2", "status", "r2")
    run("gc --dry-run", "gc", "--dry-run", "--no-squeue")
    run("rollback r2", "rollback", "r2")
    run("retire", "retire", str(site.module_file(ZLIB)), "--reason", REASON)
    _interrupt(site)
    run("status, four runs", "status")
    run("resume", "resume")
    run("resume again", "resume")
    run("status r3", "status", "r3")
    run("gc", "gc", "--no-squeue", "--grace-hours", "0")
    (retire,) = [run.name for run in (site.state_root / "runs").iterdir() if run.name.startswith("retire-")]
    run("status retire", "status", retire)
    run("rollback retire", "rollback", retire)
    run("rollback r2 again", "rollback", "r2")
    return documents


def test_json_of_every_command_is_what_it_was_before_the_text_output(site):
    documents = json_documents(site)

    expected = json.loads(EXPECTED_JSON.read_text())
    assert list(documents) == list(expected)
    for name, document in documents.items():
        assert document == expected[name], name


# Colour, and what gc says of a tree a process holds


def _status_on_a_terminal(site, **env):
    """``status`` through the real command with its stdout on a pseudo-terminal: what it printed."""
    master, slave = os.openpty()
    try:
        done = subprocess.run(
            site.command("status"),
            env=site.tool_env(TERM="xterm", **env),
            stdout=slave,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
        os.close(slave)
        slave = -1
        assert done.returncode == 0, done.stderr
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed and all was read
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def _same_moment(out: str) -> str:
    return re.sub(r"\(\d+ s ago\)", "(now)", out.replace("\r\n", "\n"))


def test_status_is_coloured_on_a_terminal_and_plain_with_no_color_or_into_a_pipe(site):
    assert site.run(*_rebuild(site, "r1", HELLO)).returncode == 0
    env = site.tool_env()

    coloured = _status_on_a_terminal(site)
    plain = _status_on_a_terminal(site, NO_COLOR="1")
    piped = subprocess.run(site.command("status"), env=env, capture_output=True, text=True, check=False)

    assert "\033[1mRUN" in coloured
    assert "\033[32mpublished\033[0m" in coloured
    assert "\033[" not in plain
    assert "\033[" not in piped.stdout
    # The same text but for the colour (and the seconds ago, counted at each call).
    assert _same_moment(re.sub(r"\033\[\d+m", "", coloured)) == _same_moment(piped.stdout)
    assert _same_moment(plain) == _same_moment(piped.stdout)


def test_gc_names_the_process_that_keeps_a_tree_and_removes_the_rest(site, tree_root):
    assert site.run(*_rebuild(site, "r1", HELLO)).returncode == 0
    assert site.run(*_rebuild(site, "r2", HELLO)).returncode == 0
    held = site.software / "hello" / ".1.0.r1"
    holder = subprocess.Popen(["sleep", "600"], cwd=held)
    try:
        done = site.run("gc", "--no-squeue", "--grace-hours", "0")
    finally:
        holder.kill()
        holder.wait()

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert lines[:3] == [
        f"removed  {site.software}/hello/.1.0.r2",
        f"kept     {held}",
        f"         in use by 1 process (pids {holder.pid}; users {user})",
    ]
    assert lines[-1] == "1 removed, 1 kept, 0 to remove by hand."
    assert held.is_dir()
