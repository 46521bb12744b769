"""The other ways a job's EESSI can have started, and the settings a login node hands on.

Each case is a login shell on one node (haswell), its environment carried to a node of
another CPU (zen3), and the guard run there as the TaskProlog and as ``eval "$(guard
--shell)"`` in a job script. What the task ends with is compared with a fresh start of EESSI
the same way on the compute node:

- ``source <root>/init/lmod/bash`` (EESSI as Lmod's default module): reloaded like a module;
- ``source <EESSI_PREFIX>/init/bash`` (no EESSI module): nothing that Lmod can load again,
  so the guard changes nothing, says so, and names what to do instead;
- ``EESSI_SOFTWARE_SUBDIR_OVERRIDE``, ``EESSI_ARCHDETECT_OPTIONS_OVERRIDE`` and
  ``EESSI_ACCELERATOR_TARGET_OVERRIDE`` set on the login node: the user's explicit choice,
  respected as a fresh load respects it, and named by ``EESSI_ARCH_GUARD_VERBOSE``;
- the EESSI module sticky (``EESSI_MODULE_STICKY``) or in an Lmod family
  (``EESSI_MODULE_FAMILY_NAME``): reloaded, sticky and in its family as before.
"""

from __future__ import annotations

import shlex

import pytest

import eessilike
from tests.integration.harness.guard import GPU, GuardSite

LOGIN = ("x86_64/intel/haswell", None)
COMPUTE = ("x86_64/amd/zen3", None)
GPU_COMPUTE = ("x86_64/intel/icelake", GPU)
MODES = ("prolog", "shell")
USER_MODULE = "UserA/1.0"
COMPARED = (
    "EESSI_SOFTWARE_SUBDIR",
    "EESSI_ACCEL_SUBDIR",
    "EESSI_SOFTWARE_PATH",
    "EESSI_MODULEPATH",
    "MODULEPATH",
    "PATH",
    "LOADEDMODULES",
    "_LMFILES_",
    "LMOD_PACKAGE_PATH",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory, lmod, package_root) -> GuardSite:
    prefix = eessilike.build_prefix(
        tmp_path_factory.mktemp("eessi-ways-in"),
        targets=(LOGIN[0], COMPUTE[0], GPU_COMPUTE[0]),
        accel={GPU_COMPUTE[0]: GPU},
    )
    return GuardSite(prefix=prefix, lmod=lmod, package_root=package_root)


def _shell(site: GuardSite, node, script: str, settings=None, base=None) -> dict:
    """What a shell on ``node`` exports after ``script``, from a clean login (or ``base``)
    with ``settings`` (the site's or user's EESSI variables), without the node's variables."""
    env = eessilike.login_base(site.prefix, site.lmod, base)
    env.update(site.prefix.node_env(*node), **(settings or {}))
    ran = eessilike.run_shell(site.lmod, env, script)
    assert ran.returncode == 0, ran.stderr
    return {name: value for name, value in ran.env.items() if name not in eessilike.NODE_VARIABLES}


def _module_load(site: GuardSite, *modules: str) -> str:
    return eessilike.load_script(site.prefix, modules)


def _lmod_init(site: GuardSite, then: str = f"module load {USER_MODULE}") -> str:
    return f". {shlex.quote(str(site.prefix.init_lmod_bash))} && {then}"


def _init_bash(site: GuardSite) -> str:
    return f". {shlex.quote(str(site.prefix.init_bash))} && module load {USER_MODULE}"


def _job(site: GuardSite, login: dict, node=COMPUTE) -> dict:
    return dict(login, **site.prefix.node_env(*node))


def _assert_like(task: dict, fresh: dict, names=COMPARED) -> None:
    for name in names:
        assert task.get(name) == fresh.get(name), name


def _verbose(site: GuardSite, job: dict) -> str:
    run = site.run(dict(job, EESSI_ARCH_GUARD_VERBOSE="1"))
    assert run.returncode == 0, run.stderr
    return run.stderr.decode()


# --------------------------------------------------------------------------- init/lmod/bash


@pytest.mark.parametrize("mode", MODES)
def test_eessi_started_by_init_lmod_bash_is_reloaded_as_the_default_module_it_is(site, mode):
    login = _shell(site, LOGIN, _lmod_init(site))
    assert login["LOADEDMODULES"] == f"{site.prefix.module}:{USER_MODULE}"
    assert login["__EESSI_VERSION_USED_FOR_INIT"] == site.prefix.version
    assert login["EESSI_SOFTWARE_SUBDIR"] == LOGIN[0]

    task = site.repaired(_job(site, login), mode)

    fresh = _shell(site, COMPUTE, _lmod_init(site))
    assert fresh["EESSI_SOFTWARE_SUBDIR"] == COMPUTE[0]
    _assert_like(task, fresh, (*COMPARED, "__EESSI_VERSION_USED_FOR_INIT", "LMOD_SYSTEM_DEFAULT_MODULES"))
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{LOGIN[0]}->{COMPUTE[0]}"


def test_a_job_started_by_init_lmod_bash_can_still_reset_to_this_node_s_default_after_the_guard(site):
    # init/lmod/bash run again in the job (a second run resets): the guard left Lmod's state
    # such that the reset lands on this node's target, as on a fresh login here.
    login = _shell(site, LOGIN, _lmod_init(site))

    script = site.in_job_script(_job(site, login), after=f". {shlex.quote(str(site.prefix.init_lmod_bash))}")

    assert script.returncode == 0, script.stderr
    fresh = _shell(site, COMPUTE, _lmod_init(site, then="true"))
    _assert_like(script.env, fresh)


# --------------------------------------------------------------------------- init/bash


@pytest.mark.parametrize("mode", MODES)
def test_eessi_started_by_init_bash_is_left_as_it_is_and_the_message_names_the_way_out(site, mode):
    login = _shell(site, LOGIN, _init_bash(site))
    assert login["EESSI_SOFTWARE_SUBDIR"] == LOGIN[0]
    assert login["LOADEDMODULES"] == USER_MODULE  # no EESSI module
    job = _job(site, login)

    task = site.repaired(job, mode)

    # What the task would need, and does not get: the guard cannot redo a sourced script.
    fresh = _shell(site, COMPUTE, _init_bash(site))
    assert fresh["EESSI_SOFTWARE_SUBDIR"] == COMPUTE[0]
    _assert_like(task, job)
    assert task["EESSI_ARCH_GUARD_FAILED"] == f"{LOGIN[0]}->no-eessi-module"
    assert "EESSI_ARCH_GUARD_RELOADED" not in task


def test_for_init_bash_the_guard_runs_no_lmod_and_tells_the_user_to_source_it_again(site):
    login = _shell(site, LOGIN, _init_bash(site))
    job = _job(site, login)
    job["LMOD_CMD"] = "/nonexistent/lmod"  # the decision comes before Lmod is looked at

    run = site.run(job)

    assert run.returncode == 0
    assert b"export EESSI_ARCH_GUARD_FAILED=" in run.stdout
    message = run.stdout.decode()
    assert "init/bash" in message
    assert f"source {site.prefix.prefix}/init/bash" in message
    assert "LMOD_CMD" not in message


def test_init_bash_on_a_node_that_matches_is_left_alone_without_a_failure(site):
    login = _shell(site, COMPUTE, _init_bash(site))

    run = site.run(_job(site, login))

    assert (run.returncode, run.stdout) == (0, b"")


# --------------------------------------------------------------------------- overrides


OVERRIDES = {
    "EESSI_SOFTWARE_SUBDIR_OVERRIDE": LOGIN[0],
    "EESSI_ARCHDETECT_OPTIONS_OVERRIDE": f"{LOGIN[0]}:x86_64/generic",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_a_cpu_override_from_the_login_node_is_respected_as_a_fresh_load_respects_it(site, name, mode):
    settings = {name: OVERRIDES[name]}
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)
    job = _job(site, login)

    task = site.repaired(job, mode)

    fresh = _shell(site, COMPUTE, _module_load(site, site.prefix.module, USER_MODULE), settings)
    assert fresh["EESSI_SOFTWARE_SUBDIR"] == LOGIN[0]  # the override wins on this node too
    _assert_like(task, fresh)
    assert "EESSI_ARCH_GUARD_RELOADED" not in task
    assert "EESSI_ARCH_GUARD_FAILED" not in task


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_verbose_says_which_override_was_respected(site, name):
    settings = {name: OVERRIDES[name]}
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)

    said = _verbose(site, _job(site, login))

    assert "target already matches this node" in said
    assert f"{name}={OVERRIDES[name]}" in said
    assert "respected" in said


def test_an_options_override_is_taken_as_eessi_s_module_takes_it_without_running_cpupath(site, tmp_path):
    # EESSI's module skips archdetect's cpupath when EESSI_ARCHDETECT_OPTIONS_OVERRIDE is
    # set; so does the guard: the stand-in's run log shows accelpath only.
    settings = {"EESSI_ARCHDETECT_OPTIONS_OVERRIDE": OVERRIDES["EESSI_ARCHDETECT_OPTIONS_OVERRIDE"]}
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)
    log = tmp_path / "runs"
    log.touch()

    run = site.run(dict(_job(site, login), EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log)))

    assert (run.returncode, run.stdout) == (0, b"")
    runs = log.read_text().split()
    assert "cpupath" not in runs
    assert "accelpath" in runs


def test_an_options_override_without_any_software_directory_is_a_failure_naming_it(site):
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE))
    job = dict(_job(site, login), EESSI_ARCHDETECT_OPTIONS_OVERRIDE="x86_64/amd/zen9")

    run = site.run(job)

    assert run.returncode == 0
    assert b"EESSI_ARCH_GUARD_FAILED=" in run.stdout
    assert b"x86_64/amd/zen9" in run.stdout


@pytest.mark.parametrize("mode", MODES)
def test_an_accelerator_override_is_kept_through_a_reload_for_another_cpu(site, mode):
    # A job from a haswell login node that chose the GPU subtree by hand, run on an icelake
    # GPU node: the CPU is reloaded for icelake, the accelerator stays the one chosen.
    settings = {"EESSI_ACCELERATOR_TARGET_OVERRIDE": GPU}
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)
    assert login["EESSI_ACCEL_SUBDIR"] == GPU

    task = site.repaired(_job(site, login, GPU_COMPUTE), mode)

    fresh = _shell(site, GPU_COMPUTE, _module_load(site, site.prefix.module, USER_MODULE), settings)
    _assert_like(task, fresh)
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{LOGIN[0]}->{GPU_COMPUTE[0]}"


def test_verbose_names_the_accelerator_override_kept_through_the_reload(site):
    settings = {"EESSI_ACCELERATOR_TARGET_OVERRIDE": GPU}
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)

    said = _verbose(site, _job(site, login, GPU_COMPUTE))

    assert f"reloaded {LOGIN[0]}" in said
    assert f"EESSI_ACCELERATOR_TARGET_OVERRIDE={GPU}" in said


# --------------------------------------------------------------------------- sticky, family


SITE_SETTINGS = {
    "sticky": {"EESSI_MODULE_STICKY": "1"},
    "family": {"EESSI_MODULE_FAMILY_NAME": "stack"},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setting", sorted(SITE_SETTINGS))
def test_a_sticky_or_family_eessi_module_is_reloaded_and_stays_so(site, setting, mode):
    settings = SITE_SETTINGS[setting]
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)
    assert login["EESSI_SOFTWARE_SUBDIR"] == LOGIN[0]

    task = site.repaired(_job(site, login), mode)

    fresh = _shell(site, COMPUTE, _module_load(site, site.prefix.module, USER_MODULE), settings)
    assert fresh["EESSI_SOFTWARE_SUBDIR"] == COMPUTE[0]
    _assert_like(task, fresh, (*COMPARED, "LMOD_FAMILY_STACK", "LMOD_FAMILY_STACK_VERSION"))
    assert task["EESSI_ARCH_GUARD_RELOADED"] == f"{LOGIN[0]}->{COMPUTE[0]}"


def test_the_sticky_eessi_module_still_needs_force_to_unload_after_the_guard(site):
    settings = SITE_SETTINGS["sticky"]
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)

    script = site.in_job_script(_job(site, login), after=f"module unload {site.prefix.module}")

    assert script.returncode == 0, script.stderr
    assert script.env["EESSI_SOFTWARE_SUBDIR"] == COMPUTE[0]
    assert site.prefix.module in script.env["LOADEDMODULES"].split(":")


def test_in_a_family_the_reloaded_eessi_module_still_swaps_out_on_loading_another_member(site):
    settings = SITE_SETTINGS["family"]
    login = _shell(site, LOGIN, _module_load(site, site.prefix.module, USER_MODULE), settings)
    other = site.prefix.module_dir / "OtherStack" / "1.0.lua"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text('family("stack")\n')

    script = site.in_job_script(_job(site, login), after="module load OtherStack/1.0")

    assert script.returncode == 0, script.stderr
    loaded = script.env["LOADEDMODULES"].split(":")
    assert "OtherStack/1.0" in loaded
    assert site.prefix.module not in loaded
    assert script.env["LMOD_FAMILY_STACK"] == "OtherStack"
