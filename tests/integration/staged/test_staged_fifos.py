"""A FIFO, a directory or a socket where the tool reads a file: one line, exit 2, no hang.

Each case runs the real command under a timeout shorter than any wait of the tool: a tool
that blocked in ``open()`` on a FIFO fails the case by timing out instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.support.module_runner import disk, run_on_site
from tests.support.staged import FAKE_EB

APP = "TinyApp/1.0"
NO_HANG = 30  # seconds: a rebuild of the test builder takes about one


def _plant(kind, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()


def _refused(done, *words):
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("eb-staged-rebuild: ")
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0]
    return lines[0]


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
def test_a_module_file_that_is_not_a_file_refuses_the_rebuild_before_the_build(staged_site, kind):
    site = staged_site
    site.install(APP)
    _plant(kind, site.module_file(APP))
    before = site.snapshot()

    done = site.run(*site.rebuild_args(APP), timeout=NO_HANG)

    _refused(done, str(site.module_file(APP)), "not a regular file")
    assert site.snapshot() == before
    assert not (site.state_root / "runs").exists() or not os.listdir(site.state_root / "runs")


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
def test_a_ledger_configuration_that_is_not_a_file_is_refused(staged_site, tmp_path, kind):
    site = staged_site
    site.install(APP)
    config = tmp_path / "ledger.json"
    _plant(kind, config)
    before = site.snapshot()

    done = site.run(*site.rebuild_args(APP, extra=("--ledger-config", str(config))), timeout=NO_HANG)

    _refused(done, str(config))
    assert site.snapshot() == before


@pytest.mark.parametrize("command", [("status",), ("gc",), ("resume",), ("rollback", "RUN")])
def test_a_journal_replaced_by_a_fifo_refuses_every_command_that_reads_it(staged_site, command):
    site = staged_site
    site.install(APP)
    done = site.run("--json", *site.rebuild_args(APP), timeout=NO_HANG)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (site.state_root / "runs").iterdir()
    _plant("fifo", run_dir / "journal.json")
    args = [run_dir.name if word == "RUN" else word for word in command]

    done = site.run(*args, timeout=NO_HANG)

    _refused(done, f"journal {run_dir / 'journal.json'}: not a regular file")


def test_the_rebuild_module_in_check_and_diff_mode_is_refused_not_blocked_by_a_fifo(staged_site, capsys):
    """The diff snapshot reads the module file before the core checks it: it must not block."""
    site = staged_site
    site.install(APP)
    _plant("fifo", site.module_file(APP))
    before = disk(site)

    result = run_on_site(
        capsys,
        staged_rebuild,
        site,
        check_mode=True,
        diff=True,
        installpath=str(site.installpath),
        modules=[APP],
        easyconfigs=["TinyApp-1.0.eb"],
        eb=str(FAKE_EB),
        backend="installpath",
        rebuild="always",
    )

    assert result["failed"] is True
    assert result["error"] == "usage"
    assert result["msg"] == f"module file {site.module_file(APP)} is not a regular file"
    assert disk(site) == before


# The files a run reads back from its own directory, and the ledger a resume cuts back.

# A program that puts ``kind`` where ``path`` (relative to the run directory) is; run as the
# rebuild's --prepare, after the live-change record and the prepared module file were written
# and before either is read again.
_PLANT = (
    "import os, socket, sys; kind, path = sys.argv[1], sys.argv[2]; os.unlink(path)\n"
    # A socket's path must fit in 108 bytes: bound by its name, from its directory.
    "os.chdir(os.path.dirname(path)); path = os.path.basename(path)\n"
    "if kind == 'fifo': os.mkfifo(path)\n"
    "elif kind == 'directory': os.mkdir(path)\n"
    "elif kind == 'symlink': os.symlink('/etc/passwd', path)\n"
    "else: server = socket.socket(socket.AF_UNIX); server.bind(path); server.close()\n"
)
KINDS = ["fifo", "directory", "socket", "symlink"]


def _refused_after_progress(done, *words):
    """The run's refusal as its last line; before it only the run's own progress lines."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    *progress, line = done.stderr.strip().splitlines()
    assert all("backend installpath" in earlier for earlier in progress), progress
    assert line.startswith("eb-staged-rebuild: ")
    for word in words:
        assert word in line, line


def _prepare_planting(tmp_path, kind, relative):
    script = tmp_path / "plant.py"
    script.write_text(_PLANT)
    return f'{sys.executable} {script} {kind} "$EB_STAGED_REBUILD_RUN_DIR/{relative}"'


@pytest.mark.parametrize(
    "relative", ["live/TinyApp/1.0.json", "prepared/TinyApp/1.0.lua"], ids=["live-record", "prepared-module"]
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_run_file_that_is_not_a_file_when_read_back_refuses_the_swap(staged_site, tmp_path, kind, relative):
    site = staged_site
    site.install(APP)
    before = site.snapshot()
    prepare = _prepare_planting(tmp_path, kind, relative)

    done = site.run("--json", *site.rebuild_args(APP, extra=("--prepare", prepare)), timeout=NO_HANG)

    (run_dir,) = (site.state_root / "runs").iterdir()
    _refused_after_progress(done, str(run_dir / relative))
    assert done.stdout == ""
    assert site.payload(APP) == "old"
    assert site.snapshot() == before


@pytest.mark.parametrize("kind", KINDS)
def test_a_ledger_that_is_not_a_file_when_resume_cuts_it_back_is_refused(staged_site, tmp_path, kind):
    """A crash right after the ledger step began: resume reads the ledger to cut the run's
    records; a FIFO there must not hang it."""
    site = staged_site
    site.install(APP)
    ledger = tmp_path / "ledger.jsonl"
    config = tmp_path / "ledger-config.json"
    config.write_text(json.dumps({"path": str(ledger), "site": "test"}))
    crashed = site.run(
        *site.rebuild_args(APP, extra=("--ledger-config", str(config))),
        env={"EB_STAGED_REBUILD_CRASH_AT": "ledger"},
        timeout=NO_HANG,
    )
    assert crashed.returncode != 0
    ledger.write_text("")
    if kind == "symlink":
        ledger.unlink()
        ledger.symlink_to("/etc/passwd")
    else:
        _plant(kind, ledger)

    done = site.run("resume", timeout=NO_HANG)

    _refused(done, str(ledger))
