"""What the modules share: one command call with check mode, diff mode and SIGTERM, and the
text that diff mode compares."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.errors import setting
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import module_support, settings
from tests.support import hostile

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


def test_a_refusal_becomes_one_line_its_kind_and_no_result():
    def refuse(dry_run):
        raise errors.UsageError("no run x under /s/runs")

    assert module_support.run(refuse, False) == (None, {"msg": "no run x under /s/runs", "error": "usage"})


def test_sigterm_during_a_command_becomes_a_failure_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)

    def terminated(dry_run):
        # To the main thread, as a process's own SIGTERM reaches its Python handler there.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        time.sleep(5)
        return {"changed": True}

    result, failure = module_support.run(terminated, False)

    assert (result, failure) == (
        None,
        {"msg": "terminated by signal 15; completed steps were reversed", "error": "terminated"},
    )
    assert signal.getsignal(signal.SIGTERM) is before


# A failure names the module's options, and says its kind


def _failure(err):
    def fail(dry_run):
        raise err

    result, failure = module_support.run(fail, False)
    assert result is None
    return failure


@pytest.mark.parametrize(
    ("message", "for_a_module", "on_the_command_line"),
    [
        (
            f"{setting('grace_hours')} must not be negative",
            "grace_hours must not be negative",
            "--grace-hours must not be negative",
        ),
        (
            f"no state root: give {setting('state_root')} DIR or set X",
            "no state root: give state_root DIR or set X",
            "no state root: give --state-root DIR or set X",
        ),
        (
            f"{setting('modules')} TinyApp/1.0 is given twice",
            "modules TinyApp/1.0 is given twice",
            "--module TinyApp/1.0 is given twice",
        ),
        (
            f"({setting('skip_live_check')} skips this check)",
            "(skip_live_check skips this check)",
            "(--skip-live-check skips this check)",
        ),
        # The command's --prepare, which the modules lack, keeps the command line's name.
        (
            f"{setting('prepare')} 'x' exited with status 1",
            "--prepare 'x' exited with status 1",
            "--prepare 'x' exited with status 1",
        ),
        # EasyBuild's options are text, not settings: they stay as they are.
        (
            "--rebuild and --try-toolchain=x are EasyBuild's",
            "--rebuild and --try-toolchain=x are EasyBuild's",
            "--rebuild and --try-toolchain=x are EasyBuild's",
        ),
        # Only the setting named: a path or a word that holds an option's name is left alone.
        (
            f"/apps/x--module/y and a--eb, not {setting('eb')}",
            "/apps/x--module/y and a--eb, not eb",
            "/apps/x--module/y and a--eb, not --eb",
        ),
    ],
)
def test_a_failure_names_the_modules_options_where_the_command_line_names_its_flags(
    message, for_a_module, on_the_command_line
):
    err = errors.UsageError(message)

    assert _failure(err) == {"msg": for_a_module, "error": "usage"}
    assert err.render(settings.flag) == on_the_command_line


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (errors.UsageError("bad"), "usage"),
        (errors.LockError("cannot lock"), "lock"),
        (errors.LockHeld("held by run1"), "lock_held"),
        (errors.JournalError("journal /j: truncated"), "journal"),
        (errors.PublishError("publish of run run1 failed"), "publish_failed"),
        (FileNotFoundError(2, "No such file or directory", "/x"), "os_error"),
    ],
    ids=["usage", "lock", "lock_held", "journal", "publish_failed", "os_error"],
)
def test_a_failure_carries_the_stable_kind_of_its_error(err, kind):
    assert _failure(err)["error"] == kind


def test_a_real_refusal_of_a_setting_names_the_option_in_a_module():
    result, failure = module_support.run(lambda dry_run: settings.lock_timeout({"lock_timeout": -1.0}), False)

    assert result is None
    assert failure == {"msg": "lock_timeout must be 0 or more seconds, not -1.0", "error": "usage"}


def test_the_diff_shows_a_module_file_s_control_characters_escaped_and_keeps_its_lines_and_tabs():
    # A line break of the file stays one; a carriage return would hide the line before it.
    text = f'local root = "/apps/{hostile.IN_A_PATH}\r"\n\tsetenv("X", "1")\n'
    state = dict(LIVE, module_text=text, module_file=f"/m/{hostile.IN_A_PATH}.lua")

    shown = module_support.render({"A/1": state})

    assert shown == (
        f"# A/1: /apps/software/A/1 inode 11\n# /m/{hostile.IN_A_PATH_SHOWN}.lua\n"
        f'local root = "/apps/{hostile.IN_A_PATH_SHOWN}\\r"\n\tsetenv("X", "1")\n'
    )
    hostile.assert_shown_safely(shown.replace("\t", " "))
