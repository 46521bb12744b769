"""What the modules share: one command call with check mode, diff mode and SIGTERM, and the
text that diff mode compares."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import module_support

LIVE = {"live_dir": "/apps/software/A/1", "live_inode": 11, "module_file": "/m/A/1.lua", "module_text": "x\n"}


def test_check_mode_runs_the_dry_run_and_reports_what_it_would_change():
    calls = []

    def call(dry_run):
        calls.append(dry_run)
        return {"changed": False, "would_change": True}

    result, failure = module_support.run(call, check_mode=True)

    assert (result, failure, calls) == ({"changed": True}, None, [True])


def test_diff_mode_shows_the_snapshot_before_and_after_a_real_run():
    states = iter([{"A/1": LIVE}, {"A/1": dict(LIVE, live_inode=12, module_text="y\n")}])

    result, failure = module_support.run(
        lambda dry_run: {"changed": True}, False, True, lambda: next(states, None)
    )

    assert failure is None
    assert result["diff"] == {
        "before": "# A/1: /apps/software/A/1 inode 11\n# /m/A/1.lua\nx\n",
        "after": "# A/1: /apps/software/A/1 inode 12\n# /m/A/1.lua\ny\n",
    }


def test_check_mode_diff_predicts_a_replaced_directory_and_a_retired_file():
    retired = {"live_dir": None, "live_inode": None, "module_file": "/m/B/2.lua", "module_text": "z\n"}
    snapshot = {"A/1": LIVE, "/m/B/2.lua": retired}

    result, failure = module_support.run(lambda dry_run: {"would_change": True}, True, True, lambda: snapshot)

    assert failure is None
    assert result["diff"]["after"] == (
        "# /m/B/2.lua\n(no module file)\n"
        "# A/1: /apps/software/A/1 replaced by a new directory\n# /m/A/1.lua\nx\n"
    )


def test_a_refusal_becomes_one_line_and_no_result():
    def refuse(dry_run):
        raise errors.UsageError("no run x under /s/runs")

    assert module_support.run(refuse, False) == (None, "no run x under /s/runs")


def test_sigterm_during_a_command_becomes_a_failure_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)

    def terminated(dry_run):
        # To the main thread, as a process's own SIGTERM reaches its Python handler there.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        time.sleep(5)
        return {"changed": True}

    result, failure = module_support.run(terminated, False)

    assert (result, failure) == (None, "terminated by signal 15; completed steps were reversed")
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    ("message", "for_a_module"),
    [
        ("--grace-hours must not be negative", "grace_hours must not be negative"),
        ("no state root: give --state-root DIR or set X", "no state root: give state_root DIR or set X"),
        ("--module TinyApp/1.0 is given twice", "module TinyApp/1.0 is given twice"),
        ("(--skip-live-check skips this check)", "(skip_live_check skips this check)"),
        # EasyBuild's options, and the command's --prepare that the modules lack, stay as they are.
        (
            "--rebuild and --try-toolchain=x are EasyBuild's",
            "--rebuild and --try-toolchain=x are EasyBuild's",
        ),
        ("--prepare 'x' exited with status 1", "--prepare 'x' exited with status 1"),
        # Only whole options: a path or a word that holds one is left alone.
        ("/apps/x--module/y and a--eb", "/apps/x--module/y and a--eb"),
    ],
)
def test_a_message_names_the_modules_options(message, for_a_module):
    assert module_support.in_option_names(message) == for_a_module
