"""The decision once the restore helper reported, its labels, and the switches read from the task."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import (
    archdetect,
    decide,
    decision,
    emit,
    envdelta,
    restore,
    settings,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.common import proc
from tests.support.slurm_taskprolog import parse

ZEN3 = decide.Node("x86_64/amd/zen3", None)
ICELAKE = decide.Node("x86_64/intel/icelake", None)
ICELAKE_GPU = decide.Node("x86_64/intel/icelake", "accel/nvidia/cc80")
MODES = [emit.PROLOG, emit.SHELL]
FAILED = decision.FAILED_MARKER
RELOADED = decision.RELOADED_MARKER

# test_envdelta.py pins the module's list to the reference's.
OMITTED = [*sorted(envdelta.OMITTED_NAMES), "BASH_FUNC_module%%", "SLURM_JOB_ID", "SLURM_"]


def _task(**extra):
    """A task that inherited a zen3 login node's EESSI environment."""
    env = {
        "EESSI_SOFTWARE_SUBDIR": "x86_64/amd/zen3",
        "MODULEPATH": "/cvmfs/x86_64/amd/zen3/modules/all",
        "LOADEDMODULES": "EESSI/2023.06",
        "HOME": "/home/user",
    }
    env.update(extra)
    return env


def _decide(task, after_updates, mode=emit.PROLOG, *, was=ZEN3, now=ICELAKE, removed=()):
    """``from_report`` for a helper whose before is ``task`` and whose after applies the updates."""
    after = dict(task, EESSI_SOFTWARE_SUBDIR=now.cpu, MODULEPATH=f"/cvmfs/{now.cpu}/modules/all")
    after.update(after_updates)
    for name in removed:
        after.pop(name, None)
    return decide.from_report(task, mode, restore.Report(dict(task), after), was=was, now=now)


def _slurm_applies(result: decision.Decision, task, local_id="1"):
    """The task's environment (str -> str) after Slurm applied the prolog output."""
    env = {os.fsencode(name): os.fsencode(value) for name, value in task.items()}
    applied = parse(emit.prolog_output(result, local_id), env)
    return {os.fsdecode(name): os.fsdecode(value) for name, value in applied.env.items()}


def _assert_unsafe_failure(result: decision.Decision, was_label="x86_64/amd/zen3"):
    assert result.action == decision.FAIL
    assert result.changes == ((FAILED, f"{was_label}->unsafe-environment"),)
    assert "cannot be passed to the task" in result.message
    assert "module reset" in result.message
    assert "--export=NONE" in result.message


def test_a_reload_exports_the_delta_and_the_reloaded_marker():
    result = _decide(_task(), {"EESSI_CPU_FAMILY": "x86_64"})
    assert result.action == decision.RELOAD
    assert result.changes == (
        ("EESSI_CPU_FAMILY", "x86_64"),
        ("EESSI_SOFTWARE_SUBDIR", "x86_64/intel/icelake"),
        ("MODULEPATH", "/cvmfs/x86_64/intel/icelake/modules/all"),
        (RELOADED, "x86_64/amd/zen3->x86_64/intel/icelake"),
    )
    assert result.detail == "reloaded x86_64/amd/zen3->x86_64/intel/icelake"
    assert result.message == (
        "eessi-arch-guard: reloaded EESSI for x86_64/intel/icelake (job environment was x86_64/amd/zen3)"
    )


def test_slurm_applying_a_reload_gives_the_restored_environment():
    task = _task(OLD_ONLY="x")
    result = _decide(task, {"EESSI_CPU_FAMILY": "x86_64"}, removed=["OLD_ONLY"])
    assert _slurm_applies(result, task) == {
        "EESSI_SOFTWARE_SUBDIR": "x86_64/intel/icelake",
        "MODULEPATH": "/cvmfs/x86_64/intel/icelake/modules/all",
        "LOADEDMODULES": "EESSI/2023.06",
        "HOME": "/home/user",
        "EESSI_CPU_FAMILY": "x86_64",
        RELOADED: "x86_64/amd/zen3->x86_64/intel/icelake",
    }


def test_a_reload_clears_an_earlier_failure_with_unset():
    task = _task(**{FAILED: "x86_64/amd/zen3->timeout"})
    result = _decide(task, {})
    assert result.changes[-1] == (FAILED, None)
    output = emit.prolog_output(result, "1")
    assert output.endswith(b"unset EESSI_ARCH_GUARD_FAILED\n")
    assert FAILED not in _slurm_applies(result, task)


def test_a_reload_without_an_earlier_failure_unsets_nothing():
    output = emit.prolog_output(_decide(_task(), {}), "0")
    assert b"unset" not in output


def test_a_reload_replaces_an_earlier_reloaded_marker():
    task = _task(**{RELOADED: "x86_64/intel/haswell->x86_64/amd/zen3"})
    assert _slurm_applies(_decide(task, {}), task)[RELOADED] == "x86_64/amd/zen3->x86_64/intel/icelake"


@pytest.mark.parametrize("mode", MODES)
def test_a_helper_that_selected_another_target_is_a_restore_failure(mode):
    result = _decide(_task(), {"EESSI_SOFTWARE_SUBDIR": "x86_64/generic"}, mode)
    assert result.action == decision.FAIL
    assert result.changes == ((FAILED, "x86_64/amd/zen3->restore-failed"),)
    assert "'x86_64/generic', not 'x86_64/intel/icelake'" in result.detail


def test_a_helper_that_left_eessi_unloaded_is_a_restore_failure():
    result = _decide(_task(), {}, removed=["EESSI_SOFTWARE_SUBDIR"])
    assert result.changes == ((FAILED, "x86_64/amd/zen3->restore-failed"),)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", OMITTED)
def test_an_omitted_name_is_never_emitted(mode, name):
    task = _task(**{name: "task"})
    changed = _decide(task, {name: "after"}, mode)
    vanished = _decide(task, {}, mode, removed=[name])
    new = _decide(_task(), {name: "new"}, mode)
    for result in (changed, vanished, new):
        assert result.action == decision.RELOAD
        assert name not in dict(result.changes)


@pytest.mark.parametrize("prompt", ["PS1", "PS2", "PS3", "PROMPT_COMMAND"])
@pytest.mark.parametrize("bad", ["\n", "\r", "\0", "x" * 4094])
def test_an_uncarriable_prompt_setting_is_left_and_the_rest_emitted(prompt, bad):
    task = _task(**{prompt: "$ "})
    result = _decide(task, {prompt: f"new{bad}prompt", "NEW": "1"})
    assert result.action == decision.RELOAD
    assert prompt not in dict(result.changes)
    env = _slurm_applies(result, task)
    assert env[prompt] == "$ "
    assert env["NEW"] == "1"
    assert env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/intel/icelake"


@pytest.mark.parametrize("prompt", ["PS1", "PS2", "PS3", "PROMPT_COMMAND"])
def test_the_shell_form_carries_a_prompt_with_a_newline(prompt):
    result = _decide(_task(), {prompt: "two\nlines $ "}, emit.SHELL)
    assert dict(result.changes)[prompt] == "two\nlines $ "


@pytest.mark.parametrize("bad", ["\n", "\r", "\0", "end\n", "\r\n"])
@pytest.mark.parametrize("name", ["MODULEPATH", "NEW_NAME", "PS4X", "PS"])
def test_a_control_character_in_any_other_value_fails_the_whole_restore(name, bad):
    task = _task()
    result = _decide(task, {name: f"/a{bad}/b", "OTHER": "1"})
    _assert_unsafe_failure(result)
    assert _slurm_applies(result, task) == dict(task, **{FAILED: "x86_64/amd/zen3->unsafe-environment"})


def test_the_shell_form_carries_newlines_and_quotes():
    value = "line one\nline 'two' \"three\" $HOME `x` \\"
    result = _decide(_task(), {"MULTI": value}, emit.SHELL)
    assert result.action == decision.RELOAD
    stdout, stderr = emit.shell_output(result)
    assert b"export MULTI='line one\nline '\"'\"'two'\"'\"' \"three\" $HOME `x` \\'\n" in stdout
    assert stderr == result.message.encode() + b"\n"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["a-b", "1A", "A B", "x.y", "é", os.fsdecode(b"N\xff")])
def test_an_invalid_name_fails_the_whole_restore(mode, name):
    task = _task(**{name: "old"})
    for result in (
        _decide(task, {name: "new"}, mode),
        _decide(task, {}, mode, removed=[name]),
        _decide(_task(), {name: "new"}, mode),
    ):
        _assert_unsafe_failure(result)


def test_an_invalid_name_the_reload_left_alone_does_not_matter():
    task = _task(**{"a-b": "1"})
    assert _decide(task, {}).action == decision.RELOAD


def _value_for_line(name, length):
    return "v" * (length - len(f"export {name}=\n"))


def test_an_export_line_of_exactly_4094_bytes_passes():
    task = _task()
    value = _value_for_line("BIG", 4094)
    result = _decide(task, {"BIG": value})
    assert result.action == decision.RELOAD
    assert max(len(line) for line in emit.prolog_output(result, "0").splitlines(keepends=True)) == 4094
    assert _slurm_applies(result, task)["BIG"] == value


def test_an_export_line_of_4095_bytes_fails_the_whole_restore():
    _assert_unsafe_failure(_decide(_task(), {"BIG": _value_for_line("BIG", 4095)}))


def test_the_shell_form_carries_a_value_longer_than_a_prolog_line():
    value = _value_for_line("BIG", 4095) * 3
    assert dict(_decide(_task(), {"BIG": value}, emit.SHELL).changes)["BIG"] == value


def test_an_unset_line_over_4094_bytes_fails_the_whole_restore():
    # "unset " + 4090 + "\n" is 4097 bytes: an old slurmd would unset a name cut at 4088
    # characters and read the rest of the name as a line of its own.
    name = "N" * 4090
    task = _task(**{name: "1"})
    result = _decide(task, {}, removed=[name])
    _assert_unsafe_failure(result)


def test_an_unset_line_of_exactly_4094_bytes_passes():
    name = "N" * (4094 - len("unset \n"))
    task = _task(**{name: "1"})
    result = _decide(task, {}, removed=[name])
    assert result.action == decision.RELOAD
    assert name not in _slurm_applies(result, task)


def test_labels_name_the_accelerators_only_when_they_differ():
    result = _decide(_task(), {}, was=ZEN3, now=ICELAKE_GPU)
    assert (
        dict(result.changes)[RELOADED] == "x86_64/amd/zen3 no accel->x86_64/intel/icelake accel/nvidia/cc80"
    )
    assert result.message == (
        "eessi-arch-guard: reloaded EESSI for x86_64/intel/icelake accel/nvidia/cc80 "
        "(job environment was x86_64/amd/zen3 no accel)"
    )
    same = _decide(_task(), {}, was=decide.Node("x86_64/amd/zen3", "accel/nvidia/cc80"), now=ICELAKE_GPU)
    assert dict(same.changes)[RELOADED] == "x86_64/amd/zen3->x86_64/intel/icelake"


def test_a_failure_label_names_the_accelerator_when_it_differs():
    result = _decide(_task(), {"BAD": "a\nb"}, was=ZEN3, now=ICELAKE_GPU)
    _assert_unsafe_failure(result, "x86_64/amd/zen3 no accel")


def test_node_label_forms():
    gpu = decide.Node("x86_64/amd/zen3", "accel/nvidia/cc80")
    assert ZEN3.label() == "x86_64/amd/zen3"
    assert ZEN3.label(ICELAKE) == "x86_64/amd/zen3"
    assert ZEN3.label(ICELAKE_GPU) == "x86_64/amd/zen3 no accel"
    assert gpu.label(ZEN3) == "x86_64/amd/zen3 accel/nvidia/cc80"
    assert gpu.label(ICELAKE_GPU) == "x86_64/amd/zen3"


def test_an_empty_accelerator_is_no_accelerator():
    assert decide.Node("x86_64/amd/zen3", "") == ZEN3
    assert decide.Node("x86_64/amd/zen3", "").label(ICELAKE_GPU) == "x86_64/amd/zen3 no accel"


def test_a_label_is_one_printable_line():
    node = decide.Node("x86_64/\n\r\0\x1b/zen3", None)
    assert node.label() == "x86_64/\\n\\r\\x00\\x1b/zen3"


def test_printable_escapes_what_a_terminal_or_slurm_would_act_on():
    assert decide.printable("a\nb\rc\0d\te\x1bf") == "a\\nb\\rc\\x00d\\te\\x1bf"
    assert decide.printable(os.fsdecode(b"x\xffy")) == "x\\xffy"
    assert decide.printable("x86_64/intel/icelake é") == "x86_64/intel/icelake é"


def test_printable_shortens_long_text():
    assert decide.printable("x" * 200) == "x" * 200
    assert decide.printable("x" * 201) == "x" * 197 + "..."


@pytest.mark.parametrize("value", ["0", "off", "no", "false", "OFF", "False", " no ", "NO\n"])
def test_values_that_disable_the_guard(value):
    assert settings.disabled_by({"EESSI_ARCH_GUARD": value}) == value


@pytest.mark.parametrize("value", ["1", "", "on", "yes", "true", "disabled", "0 0", "nope"])
def test_values_that_leave_the_guard_on(value):
    assert settings.disabled_by({"EESSI_ARCH_GUARD": value}) is None


def test_an_unset_switch_leaves_the_guard_on():
    assert settings.disabled_by({}) is None


@pytest.mark.parametrize(
    ("value", "seconds"), [("5", 5.0), ("0.5", 0.5), (" 7 ", 7.0), ("1e3", 1000.0), ("86400", 86400.0)]
)
def test_the_timeout_variable_sets_the_deadline(value, seconds):
    assert settings.timeout_seconds({"EESSI_ARCH_GUARD_TIMEOUT": value}) == seconds


@pytest.mark.parametrize("value", ["", "abc", "0", "-1", "inf", "nan", "-inf", "1e400", "5s"])
def test_an_unusable_timeout_falls_back_to_60_seconds(value):
    assert settings.timeout_seconds({"EESSI_ARCH_GUARD_TIMEOUT": value}) == 60.0


@pytest.mark.parametrize("value", ["86400", "2147483", "3000000", "1e7", "1e10", "1e300"])
def test_every_accepted_timeout_can_bound_a_real_child(value):
    # A site that sets a huge timeout to mean "no deadline" must still get a working guard:
    # the deadline is handed to poll(), whose millisecond timeout is a C int (~24.8 days).
    seconds = settings.timeout_seconds({"EESSI_ARCH_GUARD_TIMEOUT": value})
    result = proc.run_child(["/bin/true"], env={}, deadline=proc.Deadline(seconds))
    assert result.returncode == 0


def test_without_the_timeout_variable_the_deadline_is_60_seconds():
    assert settings.timeout_seconds({}) == settings.DEFAULT_TIMEOUT_SECONDS == 60.0


def test_the_overrides_of_eessi_s_module_in_the_job_are_named_as_its_own_choice():
    detection = archdetect.Detection(["aarch64/nvidia/grace"], None, ["EESSI_SOFTWARE_SUBDIR_OVERRIDE=x"])
    env = {
        "EESSI_CPU_FAMILY_OVERRIDE": "x86_64",
        "EESSI_ACCEL_SOFTWARE_SUBDIR_OVERRIDE": "",
        "EESSI_VERSION_OVERRIDE": "2023.06",
    }

    note = decide.respected_overrides(detection, env)

    assert note == (
        "; EESSI_SOFTWARE_SUBDIR_OVERRIDE=x, EESSI_CPU_FAMILY_OVERRIDE=x86_64, "
        "EESSI_VERSION_OVERRIDE=2023.06 respected as the job's own choice"
    )
    assert decide.respected_overrides(archdetect.Detection(["a/b"], None), {}) == ""
