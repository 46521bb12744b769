"""Journals whose values pass for the right JSON type but that no command can use: the real
command (``status``, ``status RUN``, ``gc --dry-run``, ``resume``) refuses each in one line
naming the field, exit 2, and changes nothing.

Two classes, each case one small change to a real journal the command wrote:

* what a run in its state always has, lost: a published run whose module entry has lost
  what planning wrote into it (the prepared module file, the backup of the module file it
  replaced, both hashes, the inodes of the stage and the live tree, the live-change record)
  was accepted by every command, which then took the run for one with nothing to restore;
* values that crashed a command after the loader let them through, or drove what it
  printed: times at the ends of ``datetime``'s range with offsets (``OverflowError`` in
  ``status``), a lone surrogate (``"\\ud800"``, which encodes no bytes) in any string (a
  retire's reason: rollback moved the module file back, then died), a backend that is not
  one (control characters in it reached the terminal).

The loader's table of what each state has and the full list of refused values are tested
in test_journal.py, cheaply; here each class goes through the real command once per field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.harness.staged_checks import PREFIX, refusal_line, run_tool
from tests.support.staged import StagedSite

APP = "TinyApp/1.0"
OLD = "TinyOld/1.0"  # its module file retired
# What planning writes into each module entry, which a published run always has.
PLANNED = (
    "live_record",
    "prepared_module",
    "new_module_sha256",
    "module_backup",
    "old_module_sha256",
    "stage_ino",
    "live_ino",
)
# The commands that read every journal, and the one that reads the run named.
COMMANDS = {
    "status": ["status"],
    "status-run": ["status", "{run}"],
    "gc-dry-run": ["gc", "--dry-run", "--grace-hours", "0", "--no-squeue"],
    "resume": ["resume"],
}


@pytest.fixture(scope="module")
def template(tmp_path_factory, package_root) -> StagedSite:
    """A site with a published run ``r1`` and a retire run, made by the real command."""
    root = tmp_path_factory.mktemp("journal-values")
    site = StagedSite(installpath=root / "apps", state_root=root / "state", package_root=package_root)
    site.install(APP, OLD)
    published = run_tool(site, site.rebuild_args(APP, extra=("--run-id", "r1")))
    assert published.returncode == 0, published.stderr
    retired = run_tool(site, ["retire", str(site.module_file(OLD)), "--reason", "moved"])
    assert retired.returncode == 0, retired.stderr
    return site


@pytest.fixture
def site(template) -> StagedSite:
    """The template's site; its journals' bytes put back after each case (a refusal changes
    nothing else, which each case checks; the trees are not copied, as the journals record
    their inodes)."""
    journals = {path: path.read_bytes() for path in template.state_root.glob("runs/*/journal.json")}
    yield template
    for path, data in journals.items():
        path.write_bytes(data)


def _run_id(site, name) -> str:
    """``r1``, or the id the retire run was given (``retire``)."""
    if name != "retire":
        return name
    (found,) = [path.name for path in (site.state_root / "runs").iterdir() if path.name != "r1"]
    return found


def _journal_path(site, run_id) -> Path:
    return site.state_root / "runs" / run_id / "journal.json"


def _edit(site, run_id, change) -> Path:
    path = _journal_path(site, run_id)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _files(site) -> dict:
    """Every file and link of the site with its bytes or target: what a refusal leaves."""
    found = {}
    for root in (site.state_root, site.installpath):
        for path in sorted(root.rglob("*")):
            if path.name in (".lock", ".lock.posix"):
                continue  # rewritten in place while a command holds it
            if path.is_symlink():
                found[str(path)] = ("link", str(path.readlink()))
            elif path.is_file():
                found[str(path)] = ("file", path.read_bytes())
    return found


def _refusal(site, run_id, command):
    """The real command's one-line refusal, and whether the site was left as it was."""
    before = _files(site)
    args = [arg.format(run=run_id) for arg in COMMANDS[command]]

    done = run_tool(site, args)

    return refusal_line(done), _files(site) == before


def _refused(site, run_id, why) -> tuple:
    return f"{PREFIX}journal {_journal_path(site, run_id)}: {why}", True


def test_every_command_here_reads_the_intact_site(site):
    for command, args in COMMANDS.items():
        done = run_tool(site, [arg.format(run="r1") for arg in args])
        assert done.returncode == 0, (command, done.stderr)


LOST = [(field, command) for field in PLANNED for command in COMMANDS]


@pytest.mark.parametrize(("field", "command"), LOST, ids=[f"{f}-{c}" for f, c in LOST])
def test_a_published_run_that_lost_what_publishing_wrote_is_refused_naming_the_field(site, field, command):
    def lose(data):
        assert data["state"] == "published"
        data["modules"][0][field] = None  # of the backup and its hash, one alone

    _edit(site, "r1", lose)
    unless = {
        "live_record": " unless its request skipped the live-change check",
        "module_backup": " unless old_module_sha256 is null too",
        "old_module_sha256": " unless module_backup is null too",
    }.get(field, "")

    why = f"modules[0].{field} is missing (a publish run in state published has it{unless})"
    assert _refusal(site, "r1", command) == _refused(site, "r1", why)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_published_run_whose_backup_pair_is_both_gone_while_the_backup_is_there_is_refused(site, command):
    def lose(data):
        data["modules"][0]["module_backup"] = data["modules"][0]["old_module_sha256"] = None

    _edit(site, "r1", lose)
    backup = site.state_root / "runs" / "r1" / "backup" / "TinyApp" / "1.0.lua"
    assert backup.is_file()

    why = f"modules[0].module_backup is missing, but the run's backup {backup} exists"
    assert _refusal(site, "r1", command) == _refused(site, "r1", why)


def _set(field, value):
    def change(data):
        holder = data
        *path, last = field
        for key in path:
            holder = holder[key]
        holder[last] = value

    return change


# (case, run, field path, value, the refusal's words)
UNUSABLE = [
    (
        "created-year-1-east",
        "r1",
        ("created",),
        "0001-01-01T00:00:00+05:00",
        "created is not between 1970 and 9000 UTC: '0001-01-01T00:00:00+05:00'",
    ),
    (
        "state-since-year-9999-west",
        "r1",
        ("state_since",),
        "9999-12-31T23:00:00-05:00",
        "state_since is not between 1970 and 9000 UTC: '9999-12-31T23:00:00-05:00'",
    ),
    (
        "surrogate-in-eb-args",
        "r1",
        ("request", "eb_args", 0),
        "TinyApp-1.0\ud800.eb",
        "request.eb_args[0] holds U+D800, a lone surrogate that encodes no bytes",
    ),
    (
        "surrogate-in-reason",
        "retire",
        ("reason",),
        "moved \ud800",
        "reason holds U+D800, a lone surrogate that encodes no bytes",
    ),
    (
        "control-characters-in-backend",
        "r1",
        ("backend",),
        "installpath\r\x1b[2Kremoved",
        "backend 'installpath\\r\\x1b[2Kremoved' is not one of bwrap, userns, installpath",
    ),
]
VALUE_CASES = [(case, command) for case in UNUSABLE for command in COMMANDS]


@pytest.mark.parametrize(
    ("case", "command"), VALUE_CASES, ids=[f"{case[0]}-{command}" for case, command in VALUE_CASES]
)
def test_a_value_no_command_can_use_is_refused_naming_the_field(site, case, command):
    _name, run, field, value, why = case
    run_id = _run_id(site, run)
    _edit(site, run_id, _set(field, value))

    assert _refusal(site, run_id, command) == _refused(site, run_id, why)
