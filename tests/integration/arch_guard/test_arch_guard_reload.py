"""The headline case: a job from a login node of one CPU target runs on a node of another.

For every ordered pair of distinct nodes of the EESSI-like prefix (CPU targets, and the
GPU node against nodes without one), EESSI and two user modules are loaded as on the login
node; the guard runs as on the compute node, as the TaskProlog (its output applied the way
slurmd applies it) and as ``eval "$(eessi-arch-guard --shell)"`` in a job script. The task
must end up where a fresh ``module load`` of the same modules on the compute node ends up.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import eessilike
from tests.integration.harness.guard import GPU, node_id

CPU_NODES = [(target, None) for target in eessilike.DEFAULT_TARGETS]
GPU_NODE = ("x86_64/intel/icelake", GPU)
PAIRS = list(itertools.permutations([*CPU_NODES, GPU_NODE], 2))
COMPARED = ("EESSI_SOFTWARE_SUBDIR", "EESSI_ACCEL_SUBDIR", "MODULEPATH", "PATH")


def label(node, other) -> str:
    cpu, accel = node
    if accel == other[1]:
        return cpu
    return f"{cpu} {accel or 'no accel'}"


def pair_id(pair) -> str:
    return f"{node_id(pair[0])}->{node_id(pair[1])}"


def assert_fresh_load(guard_site, env: dict, compute) -> None:
    fresh = guard_site.login(compute)
    for name in COMPARED:
        assert env.get(name) == fresh.get(name), name
    assert guard_site.module_list(env) == guard_site.module_list(fresh)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_prolog_output_gives_the_task_a_fresh_load_of_its_modules_on_this_node(guard_site, pair):
    login, compute = pair
    job = guard_site.job_env(login, compute, SLURM_LOCALID="0")

    run, task = guard_site.as_prolog(job)

    assert run.returncode == 0
    assert_fresh_load(guard_site, task, compute)
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{label(login, compute)}->{label(compute, login)}"
    assert run.stdout.endswith(
        f"print eessi-arch-guard: reloaded EESSI for {label(compute, login)} "
        f"(job environment was {label(login, compute)})\n".encode()
    )
    assert run.stderr == b""


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_shell_mode_in_a_job_script_gives_the_same_environment(guard_site, pair):
    login, compute = pair
    job = guard_site.job_env(login, compute)

    script = guard_site.in_job_script(job)

    assert script.returncode == 0, script.stderr
    assert_fresh_load(guard_site, script.env, compute)
    assert script.env["EESSI_ARCH_GUARD_RELOADED"] == f"{label(login, compute)}->{label(compute, login)}"
    assert f"eessi-arch-guard: reloaded EESSI for {label(compute, login)}" in script.stderr


def test_the_user_commands_of_the_repaired_task_are_those_built_for_this_node(guard_site):
    login, compute = CPU_NODES[0], CPU_NODES[2]
    _run, task = guard_site.as_prolog(guard_site.job_env(login, compute))

    ran = eessilike.run_shell(guard_site.lmod, task, "usera; userb")

    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.split().count(compute[0]) == 2
    assert login[0] not in ran.stderr


def test_gpu_node_gets_the_accelerator_modules(guard_site):
    _run, task = guard_site.as_prolog(guard_site.job_env(CPU_NODES[1], GPU_NODE))

    ran = eessilike.run_shell(guard_site.lmod, task, "module load GpuKit/1.0 && gpukit")

    assert ran.returncode == 0, ran.stderr
    assert str(guard_site.prefix.module_path(*GPU_NODE)) in task["MODULEPATH"].split(":")


@pytest.mark.parametrize(("local_id", "prints"), [("0", True), (None, True), ("1", False), ("63", False)])
def test_only_the_first_task_on_a_node_prints_the_message(guard_site, local_id, prints):
    extra = {} if local_id is None else {"SLURM_LOCALID": local_id}
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[1], **extra)

    run, task = guard_site.as_prolog(job)

    assert (b"\nprint " in b"\n" + run.stdout) is prints
    assert task["EESSI_SOFTWARE_SUBDIR"] == CPU_NODES[1][0]


def test_matching_environment_emits_nothing_and_says_why_when_verbose(guard_site):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[0], EESSI_ARCH_GUARD_VERBOSE="1")

    run = guard_site.run(job)
    shell = guard_site.run(job, "--shell")

    assert (run.returncode, run.stdout) == (0, b"")
    assert run.stderr == b"eessi-arch-guard: target already matches this node\n"
    assert (shell.returncode, shell.stdout) == (0, b"")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"EESSI_ARCH_GUARD": "off"}, "disabled by EESSI_ARCH_GUARD=off"),
        ({"EESSI_ARCH_GUARD": "FALSE"}, "disabled by EESSI_ARCH_GUARD=FALSE"),
        ({"EESSI_ARCH_GUARD": "0"}, "disabled by EESSI_ARCH_GUARD=0"),
        ({"EESSI_ARCH_GUARD": "no"}, "disabled by EESSI_ARCH_GUARD=no"),
        ({"EESSI_SOFTWARE_SUBDIR": ""}, "EESSI is not loaded (EESSI_SOFTWARE_SUBDIR is unset or empty)"),
    ],
)
def test_disabled_or_not_loaded_emits_nothing(guard_site, extra, reason):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[1], EESSI_ARCH_GUARD_VERBOSE="1", **extra)

    run = guard_site.run(job)

    assert (run.returncode, run.stdout) == (0, b"")
    assert run.stderr == f"eessi-arch-guard: {reason}\n".encode()


def test_guard_enabled_by_any_other_value(guard_site):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[1], EESSI_ARCH_GUARD="1")

    _run, task = guard_site.as_prolog(job)

    assert task["EESSI_SOFTWARE_SUBDIR"] == CPU_NODES[1][0]


def test_a_successful_reload_clears_an_earlier_failure_marker(guard_site):
    job = guard_site.job_env(
        CPU_NODES[0], CPU_NODES[1], EESSI_ARCH_GUARD_FAILED="x86_64/intel/haswell->restore-failed"
    )

    run, task = guard_site.as_prolog(job)

    assert b"unset EESSI_ARCH_GUARD_FAILED\n" in run.stdout
    assert "EESSI_ARCH_GUARD_FAILED" not in task


def test_omitted_names_are_never_in_the_output_even_when_the_reload_changes_them(guard_site, tmp_path):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[1], SLURM_LOCALID="0", TMPDIR=str(tmp_path), OLDPWD="/x")

    run, task = guard_site.as_prolog(job)

    names = {
        line.split(b"=")[0].split()[-1] for line in run.stdout.splitlines() if not line.startswith(b"print ")
    }
    assert not names & {b"_", b"SHLVL", b"PWD", b"OLDPWD", b"TMPDIR", b"SLURM_LOCALID"}
    assert (task["TMPDIR"], task["OLDPWD"], task["SLURM_LOCALID"]) == (str(tmp_path), "/x", "0")


def test_the_helpers_work_directory_is_removed(guard_site, tmp_path):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[1], TMPDIR=str(tmp_path))

    _run, task = guard_site.as_prolog(job)

    assert task["EESSI_SOFTWARE_SUBDIR"] == CPU_NODES[1][0]
    assert list(tmp_path.iterdir()) == []


def test_what_a_module_makes_in_the_helpers_directory_goes_with_it(guard_site, tmp_path):
    # A module whose load runs a command that leaves files and a directory in the working
    # directory, which is the helper's work directory (the one with before.env in it: the
    # login that loads the module first runs in this checkout, which must stay clean).
    compute = CPU_NODES[1]
    ran = tmp_path.parent / f"{tmp_path.name}-litter-ran"  # outside TMPDIR, which must end empty
    litter = (
        f"if [ -e before.env ]; then mkdir -p litter/deeper && touch litter/deeper/file loose-file {ran}; fi"
    )
    for node in (CPU_NODES[0], compute):
        guard_site.prefix.write_module(
            node[0], "Litter/1.0", f'execute{{cmd="{litter}", modeA={{"load"}}}}\n'
        )
    modules = (*eessilike.default_modules(guard_site.prefix), "Litter/1.0")
    job = guard_site.job_env(CPU_NODES[0], compute, modules, TMPDIR=str(tmp_path))

    _run, task = guard_site.as_prolog(job)

    assert task["EESSI_SOFTWARE_SUBDIR"] == compute[0]
    assert ran.exists(), "the module's command did not run in the helper's directory"
    assert list(tmp_path.iterdir()) == []


def test_lmod_and_module_output_never_reach_the_prolog_output(guard_site):
    compute = CPU_NODES[3]
    chatty = guard_site.prefix.write_module(
        compute[0],
        "Chatty/1.0",
        'LmodMessage("export INJECTED_BY_MESSAGE=1")\n'
        'io.stderr:write("export INJECTED_BY_STDERR=1\\n")\n'
        'setenv("CHATTY", "loaded")\n',
    )
    guard_site.prefix.write_module(CPU_NODES[0][0], "Chatty/1.0", chatty.read_text())
    modules = (*eessilike.default_modules(guard_site.prefix), "Chatty/1.0")
    job = guard_site.job_env(CPU_NODES[0], compute, modules)

    run, task = guard_site.as_prolog(job)

    assert task["CHATTY"] == "loaded"
    assert task["EESSI_SOFTWARE_SUBDIR"] == compute[0]
    assert b"INJECTED" not in run.stdout + run.stderr
    assert not {"INJECTED_BY_MESSAGE", "INJECTED_BY_STDERR"} & set(task)


def _counting_lmod(tmp_path, job: dict) -> Path:
    """``job``'s ``LMOD_CMD`` behind a wrapper that logs each call's subcommand and modules."""
    log = tmp_path / "lmod-calls"
    wrapper = tmp_path / "lmod"
    wrapper.write_text(f'#!/bin/bash\nprintf "%s\\n" "${{*:2}}" >> {log}\nexec {job["LMOD_CMD"]} "$@"\n')
    wrapper.chmod(0o755)
    job["LMOD_CMD"] = str(wrapper)
    return log


def _unloads(modules) -> str:
    """Lmod's ``load -<name>`` for each module, last first: the unloads of a load call."""
    return " ".join(f"-{module}" for module in reversed(modules))


def test_the_reload_unloads_and_loads_up_to_eessi_in_one_lmod_call_and_the_rest_in_one(guard_site, tmp_path):
    # Each Lmod call pays Lmod's start: the unloads ride on the first load call. The modules
    # after EESSI's get a call of their own, which starts with the LMOD_PACKAGE_PATH (the
    # SitePackage) EESSI's module set.
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[2], SLURM_LOCALID="0")
    modules = job["LOADEDMODULES"].split(":")
    log = _counting_lmod(tmp_path, job)

    run, task = guard_site.as_prolog(job)

    assert run.returncode == 0, run.stderr
    assert modules[0].startswith("EESSI/")
    assert log.read_text().splitlines() == [
        f"load {_unloads(modules)} {modules[0]}",
        f"load {' '.join(modules[1:])}",
    ]
    assert task["EESSI_SOFTWARE_SUBDIR"] == CPU_NODES[2][0]


def test_lmod_gets_a_terminal_width_so_it_starts_no_stty_and_the_task_never_sees_it(guard_site, tmp_path):
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[2], SLURM_LOCALID="0")
    log = tmp_path / "widths"
    wrapper = tmp_path / "lmod-width"
    wrapper.write_text(
        f'#!/bin/bash\necho "${{LMOD_TERM_WIDTH-unset}}" >> {log}\nexec {job["LMOD_CMD"]} "$@"\n'
    )
    wrapper.chmod(0o755)
    job["LMOD_CMD"] = str(wrapper)

    run, task = guard_site.as_prolog(job)

    assert run.returncode == 0, run.stderr
    assert set(log.read_text().split()) == {"80"}
    assert "LMOD_TERM_WIDTH" not in task
    assert task["EESSI_SOFTWARE_SUBDIR"] == CPU_NODES[2][0]


def test_a_module_that_cannot_load_is_found_by_loading_them_one_by_one(guard_site, tmp_path):
    guard_site.prefix.write_module(CPU_NODES[0][0], "OnlyOnHaswellToo/1.0", 'setenv("ONLY", "haswell")\n')
    modules = (*eessilike.default_modules(guard_site.prefix), "OnlyOnHaswellToo/1.0")
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[2], modules, EESSI_ARCH_GUARD_VERBOSE="1")
    log = _counting_lmod(tmp_path, job)

    run = guard_site.run(job)

    assert run.returncode == 0
    assert b"module OnlyOnHaswellToo/1.0 failed to load" in run.stderr
    calls = log.read_text().splitlines()
    assert calls[:2] == [
        f"load {_unloads(modules)} {modules[0]}",
        f"load {' '.join(modules[1:])}",
    ]
    assert calls[2:] == [f"load {module}" for module in modules]


def test_when_the_first_call_fails_nothing_of_it_is_kept_and_each_module_goes_one_by_one(
    guard_site, tmp_path
):
    # A module loaded before EESSI's whose file is gone by the time the job runs: the first
    # call (the unloads and the loads up to EESSI's) fails as a whole, so the modules are
    # unloaded one by one, then loaded one by one up to the one that cannot be loaded.
    early = guard_site.prefix.module_dir / "EarlyGone" / "1.0.lua"
    early.parent.mkdir(parents=True, exist_ok=True)
    early.write_text('setenv("EARLY_GONE", "1")\n')
    modules = ("EarlyGone/1.0", *eessilike.default_modules(guard_site.prefix))
    job = guard_site.job_env(CPU_NODES[0], CPU_NODES[2], modules, EESSI_ARCH_GUARD_VERBOSE="1")
    early.unlink()
    log = _counting_lmod(tmp_path, job)

    run = guard_site.run(job)

    assert run.returncode == 0
    assert b"module EarlyGone/1.0 failed to load" in run.stderr
    assert b"EESSI_ARCH_GUARD_FAILED=" in run.stdout
    calls = log.read_text().splitlines()
    assert calls == [
        f"load {_unloads(modules)} {modules[0]} {modules[1]}",
        *(f"unload {module}" for module in reversed(modules)),
        f"load {modules[0]}",
    ]
