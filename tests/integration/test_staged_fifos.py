"""A FIFO, a directory or a socket where the tool reads a file: one line, exit 2, no hang.

Each case runs the real command under a timeout shorter than any wait of the tool: a tool
that blocked in ``open()`` on a FIFO fails the case by timing out instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket

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
