# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run EasyBuild: stream its step lines, keep its whole output, and never leave it behind.

EasyBuild runs in a session of its own, so that everything it started (its bubblewrap, the
build's compilers) is one process group: when the caller stops (SIGTERM, an error), the group
is killed before the exception travels on, and no build keeps writing after the run ended.
A sandbox is set up in the child between fork and exec (``setup``); when that fails, the
child reports why through a pipe of its own and exits without running EasyBuild.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess

from ..common import errors

BUILD_LOG = "build.log"
SETUP_FAILED = 125
_KILL_WAIT_SECONDS = 10
_PR_SET_PDEATHSIG = 1


def _is_step_line(line):
    # EasyBuild's progress: "== building...", "== COMPLETED: ..."; "== ..." lines are noise.
    return line.startswith("== ") and not line.startswith("== ...")


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


def _kill_group(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_WAIT_SECONDS)


def run(argv, env, run_dir, progress, setup=None):
    """Run ``argv``; stream step lines to ``progress``; return the log's path.

    Raises ``PublishError`` naming the log when the build fails, or when ``setup`` failed.
    """
    log_path = os.path.join(run_dir, BUILD_LOG)
    report_read, report_write = os.pipe()
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    close_fds=True,
                    start_new_session=True,
                    preexec_fn=_child_setup(setup, report_write),  # noqa: PLW1509 - one thread
                )
            except OSError as err:
                raise errors.UsageError(f"cannot run {argv[0]}: {err.strerror}") from None
            os.close(report_write)
            report_write = None
            with proc:
                try:
                    for line in proc.stdout:
                        log.write(line)
                        if _is_step_line(line):
                            progress(line.rstrip("\n"))
                    proc.wait()
                except BaseException:
                    _kill_group(proc)
                    raise
        with os.fdopen(report_read, "rb") as report:
            report_read = None
            setup_error = report.read().decode("utf-8", "replace")
    finally:
        for fd in (report_read, report_write):
            if fd is not None:
                os.close(fd)
    if setup_error:
        raise errors.PublishError(f"the build sandbox failed: {setup_error}; nothing was built or swapped")
    if proc.returncode != 0:
        raise errors.PublishError(
            f"EasyBuild failed (exit {proc.returncode}); nothing was swapped; its log is {log_path}"
        )
    return log_path
