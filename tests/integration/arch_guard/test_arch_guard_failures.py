"""Each way the guard can fail, caused for real: the task keeps the environment it arrived with.

Each test creates the cause (a node EESSI has no software for, an archdetect that cannot
answer, a module name the helper refuses, a value a prolog line cannot carry, a missing or
broken Lmod, a helper that dies, a module the node lacks) and checks the one export the
guard then makes, ``EESSI_ARCH_GUARD_FAILED``, its message and exit status 0, in both modes.
"""

from __future__ import annotations

import stat

import pytest

import eessilike

HASWELL = ("x86_64/intel/haswell", None)
ICELAKE_GPU = ("x86_64/intel/icelake", "accel/nvidia/cc80")
ZEN3 = ("x86_64/amd/zen3", None)
NEOVERSE_N1 = ("aarch64/neoverse_n1", None)
REMEDY = b"add 'module reset' to the job script or submit with --export=NONE"


def assert_failure_keeps_the_environment(guard_site, job: dict, marker: str) -> None:
    """Prolog and shell mode leave ``job`` as it was, but for EESSI_ARCH_GUARD_FAILED=marker."""
    run, task = guard_site.as_prolog(dict(job, SLURM_LOCALID="0"))
    assert run.returncode == 0
    assert task == dict(job, SLURM_LOCALID="0", EESSI_ARCH_GUARD_FAILED=marker)
    (message,) = [line for line in run.stdout.splitlines() if line.startswith(b"print ")]
    assert message.startswith(b"print eessi-arch-guard: ")
    assert message.endswith(REMEDY)
    # archdetect's and Lmod's complaints stay with the guard: only its own detail may show.
    verbose = job.get("EESSI_ARCH_GUARD_VERBOSE") == "1"
    assert len(run.stderr.splitlines()) == (1 if verbose else 0)
    assert run.stderr.startswith(b"eessi-arch-guard: ") or not verbose

    shell = guard_site.run(job, "--shell")
    assert shell.returncode == 0
    assert shell.stdout == f"export EESSI_ARCH_GUARD_FAILED='{marker}'\n".encode()
    assert shell.stderr.endswith(REMEDY + b"\n")


def executable(path, text: str):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_node_without_software_for_its_cpu_is_no_software_dir(guard_site):
    # Our prefix has no x86_64/generic tree: an old CPU with none of the newer targets' flags.
    job = guard_site.job_env(HASWELL, ("x86_64/generic", None))

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->no-software-dir")


@pytest.mark.parametrize(
    "node_vars",
    [
        pytest.param({"EESSI_MACHINE_TYPE": "ppc64le"}, id="unsupported-machine"),
        pytest.param({"EESSI_PROC_CPUINFO": "/nonexistent/cpuinfo"}, id="unreadable-cpuinfo"),
        pytest.param({"EESSI_ACCELERATOR_TARGET_OVERRIDE": "accel/bogus"}, id="malformed-accel-override"),
    ],
)
def test_archdetect_that_cannot_answer_is_archdetect_failed(guard_site, node_vars):
    job = guard_site.job_env(HASWELL, ZEN3, **node_vars)

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->archdetect-failed")


def test_missing_archdetect_is_archdetect_failed(guard_site, tmp_path):
    job = guard_site.job_env(HASWELL, ZEN3, EESSI_INIT_PREFIX=str(tmp_path))
    job["EESSI_PREFIX"] = str(tmp_path)

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->archdetect-failed")


@pytest.mark.parametrize(
    ("cpupath", "accelpath"),
    [
        pytest.param("echo ../../../etc", "exit 2", id="target-outside-the-prefix"),
        pytest.param("echo", "exit 2", id="empty-answer"),
        pytest.param("echo x86_64/amd/zen3", "echo 'NVIDIA-SMI has failed'", id="accelpath-junk-with-exit-0"),
        pytest.param("echo x86_64/amd/zen3", "exit 4", id="accelpath-unknown-exit"),
    ],
)
def test_archdetect_answer_that_is_not_a_target_is_archdetect_failed(
    guard_site, tmp_path, cpupath, accelpath
):
    executable(
        tmp_path / "eessi_archdetect.sh",
        f'#!/bin/bash\nif [ "$1" = -a ]; then {cpupath}; else {accelpath}; fi\n',
    )
    job = guard_site.job_env(HASWELL, ZEN3, EESSI_INIT_PREFIX=str(tmp_path))

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->archdetect-failed")


def test_module_name_the_helper_refuses_is_unsafe_module_name(guard_site):
    # Lmod loads a module whose name starts with '_'; the guard only passes plain names on.
    for target in (HASWELL[0], ZEN3[0]):
        module = guard_site.prefix.module_path(target) / "_private" / "1.0.lua"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text('setenv("PRIVATE", "1")\n')
    modules = (*eessilike.default_modules(guard_site.prefix), "_private/1.0")
    job = guard_site.job_env(HASWELL, ZEN3, modules)
    assert "_private/1.0" in job["LOADEDMODULES"].split(":")

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->unsafe-module-name")


@pytest.mark.parametrize(
    "lmod_cmd", [pytest.param("/nonexistent/lmod", id="missing"), pytest.param(None, id="unset")]
)
def test_node_without_the_jobs_lmod_is_lmod_unavailable(guard_site, lmod_cmd):
    job = guard_site.job_env(HASWELL, ZEN3)
    if lmod_cmd is None:
        del job["LMOD_CMD"]
    else:
        job["LMOD_CMD"] = lmod_cmd

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->lmod-unavailable")


def test_lmod_cmd_that_is_not_executable_is_lmod_unavailable(guard_site, tmp_path):
    (tmp_path / "lmod").write_text("#!/bin/sh\n")
    job = guard_site.job_env(HASWELL, ZEN3, LMOD_CMD=str(tmp_path / "lmod"))

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->lmod-unavailable")


def test_helper_killed_by_a_signal_is_restore_failed(guard_site, tmp_path):
    lmod = executable(tmp_path / "lmod", "#!/bin/sh\nkill -KILL $PPID\n")
    (tmp_path / "tmp").mkdir()
    job = guard_site.job_env(HASWELL, ZEN3, LMOD_CMD=str(lmod), TMPDIR=str(tmp_path / "tmp"))

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->restore-failed")
    assert list((tmp_path / "tmp").iterdir()) == []


def test_lmod_that_reloads_nothing_is_restore_failed(guard_site, tmp_path):
    lmod = executable(tmp_path / "lmod", "#!/bin/sh\nexit 0\n")
    job = guard_site.job_env(HASWELL, ZEN3, LMOD_CMD=str(lmod), EESSI_ARCH_GUARD_VERBOSE="1")

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->restore-failed")
    run = guard_site.run(job)
    assert b"after the reload EESSI_SOFTWARE_SUBDIR is 'x86_64/intel/haswell'" in run.stderr


def test_tmpdir_nobody_can_write_puts_the_helpers_work_directory_in_tmp(guard_site):
    # As slurmstepd does: a TMPDIR the job cannot write falls back to /tmp.
    job = guard_site.job_env(HASWELL, ZEN3, TMPDIR="/proc", SLURM_LOCALID="0")

    run, task = guard_site.as_prolog(job)

    assert (run.returncode, run.stderr) == (0, b"")
    assert task["EESSI_SOFTWARE_SUBDIR"] == ZEN3[0]


def test_module_missing_on_this_nodes_target_fails_with_both_labels(guard_site):
    guard_site.prefix.write_module(HASWELL[0], "OnlyOnHaswell/1.0", 'setenv("ONLY", "haswell")\n')
    modules = (*eessilike.default_modules(guard_site.prefix), "OnlyOnHaswell/1.0")
    job = guard_site.job_env(HASWELL, ZEN3, modules, EESSI_ARCH_GUARD_VERBOSE="1")

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->x86_64/amd/zen3")
    run = guard_site.run(job)
    assert b"module OnlyOnHaswell/1.0 failed to load" in run.stderr


def test_gpu_module_on_a_node_without_gpu_fails_with_both_accelerator_labels(guard_site):
    modules = (*eessilike.default_modules(guard_site.prefix), "GpuKit/1.0")
    job = guard_site.job_env(ICELAKE_GPU, ZEN3, modules)

    assert_failure_keeps_the_environment(
        guard_site, job, "x86_64/intel/icelake accel/nvidia/cc80->x86_64/amd/zen3 no accel"
    )


def test_deadline_that_passes_is_timeout(guard_site, tmp_path):
    lmod = executable(tmp_path / "lmod", "#!/bin/sh\nexec sleep 300\n")
    (tmp_path / "tmp").mkdir()
    job = guard_site.job_env(
        HASWELL, ZEN3, LMOD_CMD=str(lmod), EESSI_ARCH_GUARD_TIMEOUT="2", TMPDIR=str(tmp_path / "tmp")
    )

    assert_failure_keeps_the_environment(guard_site, job, "x86_64/intel/haswell->timeout")
    # The helper's work directory goes even when the deadline kills the helper.
    assert list((tmp_path / "tmp").iterdir()) == []


def module_with(guard_site, name: str, lua_on_zen3: str) -> tuple:
    """``name`` harmless on haswell (the login node) and ``lua_on_zen3`` on zen3 (this node)."""
    guard_site.prefix.write_module(HASWELL[0], name, 'setenv("HARMLESS", "1")\n')
    guard_site.prefix.write_module(ZEN3[0], name, lua_on_zen3)
    return (*eessilike.default_modules(guard_site.prefix), name)


NEWLINE_VALUE = (
    'execute{cmd="export BANNER=$\'first\\\\nsecond\'", modeA={"load"}}\n'
    'execute{cmd="unset BANNER", modeA={"unload"}}\n'
)
LONG_VALUE = 'setenv("LONGVAR", string.rep("x", 5000))\n'


@pytest.mark.parametrize(
    ("name", "lua"),
    [
        pytest.param("Banner/1.0", NEWLINE_VALUE, id="newline"),
        pytest.param("Long/1.0", LONG_VALUE, id="over-4094-bytes"),
    ],
)
def test_value_a_prolog_line_cannot_carry_is_unsafe_environment_in_prolog_mode(guard_site, name, lua):
    job = guard_site.job_env(HASWELL, ZEN3, module_with(guard_site, name, lua), SLURM_LOCALID="0")

    run, task = guard_site.as_prolog(job)

    assert run.returncode == 0
    assert task == dict(job, EESSI_ARCH_GUARD_FAILED="x86_64/intel/haswell->unsafe-environment")
    assert max(len(line) for line in run.stdout.splitlines(keepends=True)) <= 4094


@pytest.mark.parametrize(
    ("name", "lua", "variable", "value"),
    [
        pytest.param("Banner/1.0", NEWLINE_VALUE, "BANNER", "first\nsecond", id="newline"),
        pytest.param("Long/1.0", LONG_VALUE, "LONGVAR", "x" * 5000, id="over-4094-bytes"),
    ],
)
def test_shell_mode_carries_what_a_prolog_line_cannot(guard_site, name, lua, variable, value):
    job = guard_site.job_env(HASWELL, ZEN3, module_with(guard_site, name, lua))

    script = guard_site.in_job_script(job)

    assert script.returncode == 0, script.stderr
    assert script.env[variable] == value
    assert script.env["EESSI_SOFTWARE_SUBDIR"] == ZEN3[0]
    assert script.env["EESSI_ARCH_GUARD_RELOADED"] == "x86_64/intel/haswell->x86_64/amd/zen3"


def test_prompt_that_a_prolog_line_cannot_carry_is_left_and_the_rest_applied(guard_site):
    lua = 'execute{cmd="export PS1=$\'two\\\\nlines> \'", modeA={"load"}}\nsetenv("PROMPT_MODULE", "zen3")\n'
    job = guard_site.job_env(HASWELL, ZEN3, module_with(guard_site, "Prompt/1.0", lua), PS1="login> ")

    run, task = guard_site.as_prolog(job)
    script = guard_site.in_job_script(job)

    assert (task["PS1"], task["PROMPT_MODULE"], task["EESSI_SOFTWARE_SUBDIR"]) == ("login> ", "zen3", ZEN3[0])
    assert b"PS1" not in run.stdout
    assert script.env["PS1"] == "two\nlines> "
