# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run EasyBuild: stream its step lines, keep its whole output, and never leave it behind.

EasyBuild runs through ``common.proc.run_child``, in a session of its own, so that everything
it started (its bubblewrap, the build's compilers) is one process group: when the caller stops
(SIGTERM, an error), the group is killed before the exception travels on, and no build keeps
writing after the run ended.
A sandbox is set up in the child between fork and exec (``setup``); when that fails, the
child reports why through a pipe of its own and exits without running EasyBuild.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable, Mapping, Optional, Sequence

from ..common import errors, proc

BUILD_LOG = "build.log"
SETUP_FAILED = 125
_ERROR = "ERROR:"
_FAILED = "== FAILED:"
_PR_SET_PDEATHSIG = 1


def _is_step_line(line):
    # EasyBuild's progress: "== building...", "== COMPLETED: ..."; "== ..." lines are noise.
    return line.startswith("== ") and not line.startswith("== ...")


def easybuild_reason(log_path: str) -> Optional[str]:
    """EasyBuild's own reason for a failed run, from its output in ``log_path``: its last
    ``ERROR:`` line, else its last ``== FAILED:`` line with the lines EasyBuild wrapped it
    onto; None when it said neither (it was killed, or failed before it could say)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            lines = log.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith(_ERROR):
            return line[len(_ERROR) :].strip() or None
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(_FAILED):
            parts = [lines[index][len(_FAILED) :].strip()]
            for more in lines[index + 1 :]:
                # EasyBuild wraps its "== " lines at 80 columns; the next one starts with "==".
                if not more.strip() or more.startswith(("==", " ")):
                    break
                parts.append(more.strip())
            return " ".join(parts) or None
    return None


def _die_with_parent():
    # A tool killed with SIGKILL cannot kill the group; the kernel then stops EasyBuild itself,
    # so a later resume never removes a generation that a build still writes into.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _child_setup(setup, report_fd):
    def run_setup():
        try:
            _die_with_parent()
            if setup is not None:
                setup()
        except BaseException as err:  # anything, or the child would run EasyBuild unsandboxed
            reason = str(err) or type(err).__name__
            os.write(report_fd, reason.encode("utf-8", "replace")[:4000])
            os._exit(SETUP_FAILED)

    return run_setup


def run(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]],
    run_dir: str,
    progress: Callable[[str], None],
    setup: Optional[Callable[[], None]] = None,
) -> str:
    """Run ``argv``; stream step lines to ``progress``; return the log's path.

    Raises ``PublishError`` naming the log when the build fails, or when ``setup`` failed;
    ``UsageError`` when ``argv[0]`` cannot be started.
    """
    log_path = os.path.join(run_dir, BUILD_LOG)
    report_read, report_write = os.pipe()
    # Each end is closed by the finally below unless it has been closed or handed on.
    open_ends = {report_read, report_write}
    try:
        with open(log_path, "w", encoding="utf-8") as log:

            def on_line(line: str) -> None:
                log.write(line)
                if _is_step_line(line):
                    progress(line.rstrip("\n"))

            try:
                result = proc.run_child(
                    argv, env=env, on_line=on_line, preexec=_child_setup(setup, report_write)
                )
            except OSError as err:
                if err.filename != argv[0]:
                    raise  # not the exec: the log could not be written, say
                raise errors.UsageError(f"cannot run {argv[0]}: {err.strerror}") from None
        # The build has exited, and its copy of the report pipe with it (close-on-exec, or the
        # set-up's _exit): once ours is closed the read ends at what it reported, if anything.
        os.close(report_write)
        open_ends.discard(report_write)
        with os.fdopen(report_read, "rb") as report:
            open_ends.discard(report_read)
            setup_error = report.read().decode("utf-8", "replace")
    finally:
        for fd in open_ends:
            os.close(fd)
    if setup_error:
        raise errors.PublishError(f"the build sandbox failed: {setup_error}; nothing was built or swapped")
    if result.returncode != 0:
        reason = easybuild_reason(log_path)
        said = f": {reason}" if reason else ""
        raise errors.PublishError(
            f"EasyBuild failed (exit {result.returncode}){said}; nothing was swapped; its log is {log_path}",
            details={"easybuild_reason": reason, "build_log": log_path},
        )
    return log_path
