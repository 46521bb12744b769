"""What the refusal, concurrency and FUSE tests of ``eb-staged-rebuild`` share.

The tool always runs as the real command (a subprocess); these helpers only start it with
an arbitrary command line, hold its state-root lock from another process, and read back
what it left on disk (journals, module-file roots, hidden siblings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.staged import TOOL_TIMEOUT, StagedSite

PREFIX = "eb-staged-rebuild: "
LOCK_REFUSAL = "is locked by another eb-staged-rebuild run"
INTERRUPTED = ("building", "planning", "publishing", "rolling_back", "retiring")
# Variables that give the tool a default it must not pick up from the test's environment.
DEFAULTS = (
    "EB_STAGED_REBUILD_STATE_ROOT",
    "EB_STAGED_REBUILD_GRACE_HOURS",
    "EB_STAGED_REBUILD_CRASH_AT",
    "EASYBUILD_INSTALLPATH",
    "EASYBUILD_INSTALLPATH_SOFTWARE",
    "EASYBUILD_INSTALLPATH_MODULES",
)
_ROOT = re.compile(r'^local root = "(.*)"$', re.MULTILINE)


def tool_command(state_root, *args):
    """``eb-staged-rebuild [--state-root DIR] ARGS`` as an argv; ``state_root=None`` omits it."""
    command = [sys.executable, "-m", "hpcstack_ops.staged_rebuild.cli"]
    if state_root is not None:
        command += ["--state-root", str(state_root)]
    return [*command, *args]


def tool_env(site: StagedSite, env=None) -> dict:
    """The site's tool environment without inherited defaults, plus ``env``."""
    result = site.tool_env()
    for name in DEFAULTS:
        result.pop(name, None)
    result.update({key: str(value) for key, value in (env or {}).items()})
    return result


def run_tool(site: StagedSite, args, env=None, state_root="site") -> subprocess.CompletedProcess:
    """Run the real command; ``state_root`` defaults to the site's, ``None`` gives none."""
    root = site.state_root if state_root == "site" else state_root
    return subprocess.run(
        tool_command(root, *args),
        env=tool_env(site, env),
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )


def refusal_line(done: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command; fails the test unless it is exactly that."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(PREFIX), done.stderr
    assert done.stdout == "", done.stdout
    return lines[0]


def is_lock_refusal(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 2 and LOCK_REFUSAL in done.stderr


class LockHolder:
    """Another process that holds ``state_root``'s lock (the engine's own ``StateLock``).

    The state root is prepared first, as any run of the tool would. The holder keeps the
    lock until ``release()``: its stdin is closed, it leaves the ``with`` block and exits.
    """

    SCRIPT = (
        "import sys\n"
        "from hpcstack_ops.staged_rebuild.locking import StateLock\n"
        "from hpcstack_ops.staged_rebuild.paths import prepare_state_root\n"
        "root = prepare_state_root(sys.argv[1])\n"
        "with StateLock(root, 0):\n"
        "    sys.stdout.write('held\\n')\n"
        "    sys.stdout.flush()\n"
        "    sys.stdin.read()\n"
    )

    def __init__(self, state_root, package_root):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.SCRIPT, str(state_root)],
            env=dict(os.environ, PYTHONPATH=str(package_root)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if line != "held\n":
            self.release()
            raise AssertionError(f"the lock holder did not take the lock: {line!r}")

    def release(self):
        if self.proc.returncode is None:
            _out, err = self.proc.communicate(timeout=30)
            assert self.proc.returncode == 0, err
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream and not stream.closed:
                stream.close()


def journal_path(state_root, run_id) -> Path:
    return Path(state_root) / "runs" / run_id / "journal.json"


def read_journal(state_root, run_id) -> dict:
    return json.loads(journal_path(state_root, run_id).read_text())


def all_journals(state_root) -> dict:
    """run id -> journal of every run under ``state_root/runs``."""
    runs = Path(state_root) / "runs"
    if not runs.is_dir():
        return {}
    return {path.parent.name: json.loads(path.read_text()) for path in sorted(runs.glob("*/journal.json"))}


def module_root(module_file) -> str | None:
    """The ``local root = "..."`` of a Lua module file, or None."""
    match = _ROOT.search(Path(module_file).read_text())
    return match.group(1) if match else None


def hidden_entries(site: StagedSite) -> set:
    """Every dot-name under ``software/<Name>/`` and directly under ``software/``."""
    found = {str(path) for path in site.software.glob(".*")}
    for name_dir in site.software.iterdir():
        if name_dir.is_dir() and not name_dir.name.startswith("."):
            found.update(str(path) for path in name_dir.glob(".*"))
    return found


def temp_leftovers(site: StagedSite) -> list:
    """Temporary files (``*.tmp``) left anywhere under the module tree or the software tree."""
    return sorted(str(path) for root in (site.modules, site.software) for path in root.rglob("*.tmp"))
