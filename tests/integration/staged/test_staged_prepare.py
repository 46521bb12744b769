"""``eb-staged-rebuild rebuild --prepare CMD``: the program's output, its failure, and its end.

The real command runs as its own process against a live tree built by the test builder
(``tests/builders/fake-eb``); the prepare programs are real shells with real children, and
SIGTERM is sent to the tool as Slurm or systemd would send it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

APP = "TinyApp/1.0"
RUN_ID = "run1"
# Generous: only a tool that ignored SIGTERM, or a group that was not killed, takes this long.
SIGNAL_WAIT = 60


def _errors(stderr: str) -> list:
    """The tool's error lines: stderr without the build's progress and the backend's warning."""
    return [
        line
        for line in stderr.splitlines()
        if not line.startswith(("== ", "eb-staged-rebuild: warning: backend installpath:"))
    ]


def _log(site):
    return site.state_root / "runs" / RUN_ID / "prepare.log"


def _rebuild_args(site, prepare):
    return site.rebuild_args(APP, extra=("--run-id", RUN_ID, "--prepare", prepare))


def test_a_prepare_that_prints_leaves_one_json_document_and_its_output_in_the_log(staged_site):
    staged_site.install(APP)

    done = staged_site.run("--json", *_rebuild_args(staged_site, "echo hi; echo to stderr >&2"))

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "published"
    assert _log(staged_site).read_text() == "hi\nto stderr\n"
    assert "hi" not in done.stderr
    assert "to stderr" not in done.stderr


def test_a_failing_prepare_is_one_line_naming_its_log_and_changes_nothing_live(staged_site):
    staged_site.install(APP)
    before = staged_site.snapshot()

    done = staged_site.run("--json", *_rebuild_args(staged_site, "echo not today; exit 4"))

    assert done.returncode == 2
    assert done.stdout == ""
    assert _errors(done.stderr) == [
        "eb-staged-rebuild: --prepare 'echo not today; exit 4' exited with status 4; "
        f"nothing was swapped; its output is in {_log(staged_site)}"
    ]
    assert _log(staged_site).read_text() == "not today\n"
    assert staged_site.snapshot() == before


def _alive_in_group(pgid: int) -> list:
    """Pids in process group ``pgid`` that have not exited (a zombie waits for its reaper)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while the table was read
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            alive.append(int(entry))
    return alive


def _wait_until_group_gone(pgid: int, timeout: float = 10) -> list:
    give_up = time.monotonic() + timeout
    while _alive_in_group(pgid) and time.monotonic() < give_up:
        time.sleep(0.05)
    return _alive_in_group(pgid)


def _wait_for_text(path, child, timeout=SIGNAL_WAIT) -> str:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout} s")


def _stop_if_still_running(tool, pgid):
    """After a failed assertion: the prepare's sleepers would keep the tool's pipes open."""
    if pgid is not None and _alive_in_group(pgid):
        os.killpg(pgid, signal.SIGKILL)
    if tool.returncode is None:
        tool.kill()
        tool.communicate()


def test_sigterm_during_a_hanging_prepare_kills_its_group_and_reverses_the_run(staged_site, tmp_path):
    staged_site.install(APP)
    before = staged_site.snapshot()
    started = tmp_path / "prepare-pids"
    # A grandchild in the background and a child in the foreground, both of which would
    # outlive the tool by far; $$ is the shell, the leader of the prepare's process group.
    prepare = f"sleep 1000 & echo $$ $! > {started}; sleep 1000"
    tool = subprocess.Popen(
        staged_site.command(*_rebuild_args(staged_site, prepare)),
        env=staged_site.tool_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pgid = None
    try:
        shell, grandchild = (int(pid) for pid in _wait_for_text(started, tool).split())
        pgid = os.getpgid(shell)
        assert pgid == shell
        assert pgid != os.getpgid(tool.pid)
        assert os.getpgid(grandchild) == pgid

        tool.send_signal(signal.SIGTERM)
        out, err = tool.communicate(timeout=SIGNAL_WAIT)
    finally:
        _stop_if_still_running(tool, pgid)

    assert tool.returncode == 2, (out, err)
    assert _errors(err) == ["eb-staged-rebuild: terminated by signal 15; completed steps were reversed"]
    assert out == ""
    assert _wait_until_group_gone(pgid) == []
    assert staged_site.snapshot() == before
    assert staged_site.payload(APP) == "old"
