"""What an administrator reads holds values other users chose: none of it drives the terminal,
none of it fails the output once the work is done, and a command to paste reads back as the
arguments it was made from.

Every command runs as the real ``eb-staged-rebuild`` in ``en_US.UTF-8`` (made by
``localedef``: under ``C.UTF-8`` Python writes bytes that are not UTF-8 raw, and nothing
fails), as root, the way an administrator runs it. The values:

- a ``SLURM_JOB_ID`` that the attacker user (its own uid) sets in a real process whose
  working directory is a retired tree, so that gc names it: an OSC 52 clipboard write, a line
  erase, a forged ``removed`` line and a byte that is not UTF-8;
- a module file the attacker user wrote, whose ``root`` holds the same sequences, retired;
- an install path and a state root that hold them, and journal values (the retire's reason,
  EasyBuild's arguments, a backend edited by hand).

Each output is checked for control characters and for valid UTF-8 (``hostile``); each
command a text suggests is pasted into the real bash and must give the recorded arguments.
The modules' side runs through the real ``ansible-playbook``, whose controller refuses a
result that is not valid Unicode.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from localplay import LocalPlaybooks
from tests.support import hostile
from tests.support.staged import StagedSite

APP = "TinyApp/1.0"
RUN_ID = "r1"
READY_TIMEOUT = 30
WAITER = """
import sys, time
print("ready", flush=True)
time.sleep(600)
"""
# EasyBuild's arguments as a rebuild records them: blanks, a tab and quotes of both kinds in
# them, long enough that the command that rebuilds again wraps.
EB_ARGS = [
    "TinyApp-1.0.eb",
    "--try-amend=description=Tiny app, rebuilt with  two blanks,\ta tab and 'single' and \"double\" quotes",
    "--hooks=/site/easybuild hooks/it's the site's.py",
]


@pytest.fixture
def root():
    """A directory every user may pass through (the attacker's process works in a tree below it)."""
    path = Path(tempfile.mkdtemp(prefix="hostile-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _site(root: Path, package_root: Path, installpath: str, state_root: str) -> StagedSite:
    site = StagedSite(installpath=root / installpath, state_root=root / state_root, package_root=package_root)
    site.install(APP)
    return site


class Tool:
    """``eb-staged-rebuild --state-root <root> ARGS`` in a strict UTF-8 locale: the output as
    bytes, as the terminal gets it."""

    def __init__(self, site: StagedSite, locale) -> None:
        self.site, self.locale = site, locale

    def __call__(self, *args: str, env=None) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.site.command(*args),
            env=self.locale.env(self.site.tool_env(**(env or {}))),
            capture_output=True,
            timeout=120,
            check=False,
        )

    def text(self, *args: str, codes=(0,), env=None) -> str:
        """The command's stdout for people, checked: one of ``codes``, no traceback, nothing
        on either stream a terminal would obey, valid UTF-8."""
        done = self(*args, env=env)
        assert done.returncode in codes, done.stderr.decode(errors="backslashreplace")
        assert b"Traceback" not in done.stderr
        hostile.assert_shown_safely(done.stdout)
        hostile.assert_shown_safely(done.stderr)
        return done.stdout.decode()


class Holder:
    """A process of ``user`` whose working directory is ``cwd`` and whose environment is
    ``environ`` alone, until the test ends it."""

    def __init__(self, user, cwd: Path, environ: dict) -> None:
        self.process = subprocess.Popen(
            user.command([sys.executable, "-I", "-c", WAITER]),
            cwd=cwd,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        line = self.process.stdout.readline()
        if line != b"ready\n":
            self.end()
            pytest.fail(f"the holder said {line!r}, not ready")

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(READY_TIMEOUT)
        self.process.stdout.close()


def _attackers(attacker_user, tree: Path) -> list:
    """Two processes of the attacker in ``tree``: one whose SLURM_JOB_ID holds the sequences,
    and one whose SLURM_JOB_ID is a job id of an array task's form."""
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    hostile_one = Holder(attacker_user, tree, dict(base, SLURM_JOB_ID=hostile.SEQUENCES))
    try:
        return [hostile_one, Holder(attacker_user, tree, dict(base, SLURM_JOB_ID="4242_7"))]
    except BaseException:
        hostile_one.end()
        raise


def _again(site: StagedSite) -> list:
    """The words before EasyBuild's arguments of the command that rebuilds a rolled-back run."""
    return ["rebuild", f"--installpath={site.installpath}", f"--module={APP}", "--"]


def _pasted(lines) -> str:
    """What a shell reads from lines pasted into it: `` \\`` and a newline continue a line."""
    return "\n".join(lines).replace("\\\n", "")


def _command_after(label: str, text: str) -> list:
    """The lines of the command that follows ``<label>:``, on its line or under it."""
    lines = text.splitlines()
    (start,) = [index for index, line in enumerate(lines) if line.startswith(label + ":")]
    first = lines[start][len(label) + 1 :].strip()
    command = [first] if first else []
    index = start + 1
    while (not command or command[-1].endswith(" \\")) and index < len(lines):
        command.append(lines[index].strip())
        index += 1
    return command


def _in_bash(command_lines, locale) -> list:
    """The arguments bash gives ``eb-staged-rebuild`` when ``command_lines`` are pasted into it."""
    script = "eb-staged-rebuild() { printf '%s\\0' \"$@\"; }\n" + _pasted(command_lines)
    done = subprocess.run(["bash", "-c", script], env=locale.env(), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    return [os.fsdecode(argument) for argument in done.stdout.split(b"\0")[:-1]]


def test_gc_names_a_hostile_job_id_as_not_one_and_its_bytes_fail_neither_the_report_nor_the_json(
    root, package_root, attacker_user, en_us_utf8
):
    site = _site(root, package_root, f"apps-{hostile.IN_AN_INSTALL_PATH}", "state")
    tool = Tool(site, en_us_utf8)
    rebuilt = tool(
        "--json", *site.rebuild_args(APP, extra=("--run-id", RUN_ID)), env={"FAKE_EB_PAYLOAD": "new"}
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    retired = site.software / "TinyApp" / f".1.0.{RUN_ID}"
    holders = _attackers(attacker_user, retired)
    try:
        kept = tool.text("gc", "--grace-hours", "0", "--no-squeue")
        document = tool("--json", "gc", "--grace-hours", "0", "--no-squeue")
    finally:
        for holder in holders:
            holder.end()
    removed = tool.text("gc", "--grace-hours", "0", "--no-squeue")

    # The tree's path and the job ids, shown escaped; the forged line is no line of its own.
    shown = f"{root}/apps-{hostile.IN_AN_INSTALL_PATH_SHOWN}/software/TinyApp/.1.0.{RUN_ID}"
    assert kept.startswith(f"kept     {shown}\n")
    assert "jobs 4242_7; 1 SLURM_JOB_ID that is not a job id)" in " ".join(kept.split())
    assert not any(line.startswith("removed") for line in kept.splitlines())
    assert "0 removed, 1 kept, 0 to remove by hand." in kept
    # --json: valid UTF-8, the job id as the process had it, in the exact form, and named.
    assert document.returncode == 0, document.stderr
    report = json.loads(document.stdout.decode("utf-8"))
    (entry,) = report["kept"]
    job_ids = sorted(process["job_id"] for process in entry["processes"])
    assert job_ids == ["4242_7", hostile.SHOWN]
    assert {process["user"] for process in entry["processes"]} == {attacker_user.name}
    assert {"/kept/0/path", "/candidates/0"} <= set(report["escaped"])
    # Once the processes end, gc removes the tree and reports it: the report is not lost.
    assert removed.startswith(f"removed  {shown}\n")
    assert "1 removed, 0 kept, 0 to remove by hand." in removed
    assert not retired.exists()


def _write_as(user, path: Path, data: bytes) -> None:
    """``path`` written by ``user`` (its directory is that user's)."""
    path.parent.mkdir(parents=True)
    os.chown(path.parent, user.uid, user.gid)
    code = "import sys; open(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))"
    done = user.run([sys.executable, "-I", "-c", code, str(path), data.hex()])
    assert done.returncode == 0, done.stderr
    assert path.stat().st_uid == user.uid


def test_every_command_shows_paths_journal_values_and_a_users_module_root_escaped_and_its_undo_pastes_back(
    root, package_root, attacker_user, en_us_utf8
):
    site = _site(root, package_root, f"apps-{hostile.IN_AN_INSTALL_PATH}", f"state-{hostile.SEQUENCES}")
    tool = Tool(site, en_us_utf8)
    state_root = str(site.state_root)
    installpath_shown = f"{root}/apps-{hostile.IN_AN_INSTALL_PATH_SHOWN}"
    eb_args = ["TinyApp-1.0.eb", f"--try-amend=description={hostile.SEQUENCES}"]
    rebuild = ["rebuild", f"--installpath={site.installpath}", "--backend=installpath", f"--module={APP}"]

    published = tool.text(*rebuild, f"--run-id={RUN_ID}", "--", *eb_args, env={"FAKE_EB_PAYLOAD": "new"})
    listed = tool.text("status")
    block = tool.text("status", RUN_ID)
    rolled_back = tool.text("rollback", RUN_ID)

    assert site.payload(APP) == "old"
    assert _in_bash(_command_after("Undo", published), en_us_utf8) == [
        "--state-root",
        state_root,
        "rollback",
        RUN_ID,
    ]
    assert f" {installpath_shown}/software/TinyApp/1.0\n" in block
    assert _in_bash(_command_after("Undo (build and publish again)", rolled_back), en_us_utf8) == [
        "--state-root",
        state_root,
        *_again(site),
        *eb_args,
    ]
    assert listed.splitlines()[1].split()[:3] == [RUN_ID, "publish", "published"]

    # A module file another user wrote, whose root holds the sequences: retired, listed, kept.
    evil = site.modules_all / "Evil" / "1.0.lua"
    _write_as(
        attacker_user, evil, os.fsencode(f'local root = "{site.software}/Evil-{hostile.IN_A_PATH}/1.0"\n')
    )
    retired = tool.text("retire", str(evil), "--reason", hostile.SEQUENCES)
    (retire_id,) = [
        run.name for run in (site.state_root / "runs").iterdir() if run.name.startswith("retire-")
    ]
    retire_block = tool.text("status", retire_id)
    collected = tool.text("gc", "--dry-run", "--no-squeue")
    put_back = tool.text("rollback", retire_id)

    software_dir = f"{installpath_shown}/software/Evil-{hostile.IN_A_PATH_SHOWN}/1.0"
    assert software_dir in retired
    assert f"Reason:      {hostile.SHOWN}\n" in retire_block
    assert ["kept", software_dir] in [line.split() for line in collected.splitlines()]
    assert _in_bash(_command_after("Undo", put_back), en_us_utf8) == [
        "--state-root",
        state_root,
        "retire",
        str(evil),
        "--reason",
        hostile.SEQUENCES,
    ]
    assert evil.is_file()

    # A backend edited by hand into the journal: shown escaped, or the journal refused in one
    # line; never raw.
    journal = site.state_root / "runs" / RUN_ID / "journal.json"
    record = json.loads(journal.read_text())
    record["backend"] = hostile.SEQUENCES
    journal.write_text(json.dumps(record))
    done = tool("status", RUN_ID)
    hostile.assert_shown_safely(done.stdout)
    hostile.assert_shown_safely(done.stderr)
    assert hostile.SHOWN in done.stdout.decode() or (done.returncode, done.stderr.count(b"\n")) == (2, 1)


def test_an_undo_command_wraps_only_between_arguments_and_reads_back_as_the_recorded_ones(
    root, package_root, en_us_utf8
):
    site = _site(root, package_root, "apps", "state")
    tool = Tool(site, en_us_utf8)
    rebuild = ["rebuild", f"--installpath={site.installpath}", "--backend=installpath", f"--module={APP}"]
    published = tool(*rebuild, f"--run-id={RUN_ID}", "--", *EB_ARGS, env={"FAKE_EB_PAYLOAD": "new"})
    rolled_back = tool("rollback", RUN_ID)

    # A tab stays a tab inside single quotes: the one control character a word to paste holds.
    undo = _command_after("Undo (build and publish again)", rolled_back.stdout.decode())

    assert (published.returncode, rolled_back.returncode) == (0, 0)
    assert len(undo) > 1
    assert shlex.split(_pasted(undo)) == [
        "eb-staged-rebuild",
        "--state-root",
        str(site.state_root),
        *_again(site),
        *EB_ARGS,
    ]


# The modules through the real controller, which refuses a result that is not valid Unicode
# ("Refusing to deserialize an invalid UTF8 string"): a compute node's scan would count as no
# answer (every tree kept), and the build host's gc would fail the play.
MODULES_PLAY = """
- name: The scan and gc of a tree that a process of another user holds
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Scan /proc for the old tree
      hpcstack.ops.staged_in_use:
        trees: ["{{ tree }}"]
      register: scanned
    - name: Collect what nothing uses
      hpcstack.ops.staged_gc:
        state_root: "{{ state_root }}"
        grace_hours: 0
        squeue: false
      register: collected
    - name: Keep both results for the test
      ansible.builtin.copy:
        content: "{{ {'scanned': scanned, 'collected': collected} | to_json }}"
        dest: "{{ results }}"
        mode: "0600"
"""


def test_the_modules_results_carry_a_hostile_job_id_escaped_and_named_and_the_play_succeeds(
    root, package_root, attacker_user, en_us_utf8
):
    site = _site(root, package_root, "apps", "state")
    rebuilt = Tool(site, en_us_utf8)(
        *site.rebuild_args(APP, extra=("--run-id", RUN_ID)), env={"FAKE_EB_PAYLOAD": "new"}
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    retired = site.software / "TinyApp" / f".1.0.{RUN_ID}"
    (root / "play.yml").write_text(MODULES_PLAY)
    results = root / "results.json"
    playbooks = LocalPlaybooks(root / "ansible", en_us_utf8.env({"PATH": "/usr/local/bin:/usr/bin:/bin"}))
    variables = {"tree": str(retired), "state_root": str(site.state_root), "results": str(results)}
    holders = _attackers(attacker_user, retired)
    try:
        play = playbooks.run(str(root / "play.yml"), "-e", json.dumps(variables))
    finally:
        for holder in holders:
            holder.end()

    assert (play.failed, play.ok) == (0, 3), play.output
    hostile.assert_shown_safely(play.output)
    found = json.loads(results.read_text())
    scanned, collected = found["scanned"], found["collected"]
    processes = scanned["in_use"][str(retired)]
    assert sorted(process["job_id"] for process in processes) == ["4242_7", hostile.SHOWN]
    where = [index for index, process in enumerate(processes) if process["job_id"] == hostile.SHOWN]
    assert scanned["escaped"] == [f"/in_use/{str(retired).replace('/', '~1')}/{where[0]}/job_id"]
    (kept,) = collected["kept"]
    assert kept["path"] == str(retired)
    assert kept["why"].endswith("jobs 4242_7; 1 SLURM_JOB_ID that is not a job id)")
    assert any(pointer.startswith("/kept/0/processes/") for pointer in collected["escaped"])
    assert collected["removed"] == []
    assert retired.is_dir()
