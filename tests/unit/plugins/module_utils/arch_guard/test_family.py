"""CPU families: the node's and the job's, which Lmod runs here, and how the first Lmod call
starts (``arch_guard/family.py``). Pure functions, but for ``lmod_for_node``, which looks at
files (made here in a temporary directory)."""

from __future__ import annotations

import base64
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import family

PREFIX = "/cvmfs/software.eessi.io/versions/2023.06"
X86_LAYER = f"{PREFIX}/compat/linux/x86_64"
ARM_LAYER = f"{PREFIX}/compat/linux/aarch64"
ZEN3 = f"{PREFIX}/software/linux/x86_64/amd/zen3"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
SITE_ZEN3 = "/cvmfs/software.eessi.io/host_injections/2023.06/software/linux/x86_64/amd/zen3"


def _pushed(*values: str) -> str:
    """Lmod's pushenv stack: each value base64-encoded, the top first."""
    return ":".join(base64.b64encode(value.encode()).decode() for value in values)


def _x86_job(**extra: str) -> dict:
    """What EESSI's module leaves in a job from an x86_64 zen3 login node."""
    env = {
        "EESSI_CPU_FAMILY": "x86_64",
        "EPREFIX": X86_LAYER,
        "EESSI_EPREFIX": X86_LAYER,
        "EESSI_SOFTWARE_PATH": ZEN3,
        "EESSI_SITE_SOFTWARE_PATH": SITE_ZEN3,
        "PATH": f"{ZEN3}/software/UserA/1.0/bin:{X86_LAYER}/usr/bin:{X86_LAYER}/bin:{SYSTEM_PATH}",
        "LMOD_RC": f"{SITE_ZEN3}/.lmod/lmodrc.lua:{ZEN3}/.lmod/lmodrc.lua",
        "LMOD_PACKAGE_PATH": f"{ZEN3}/.lmod",
        "__LMOD_STACK_LMOD_PACKAGE_PATH": _pushed(f"{ZEN3}/.lmod"),
        "LMOD_CMD": f"{X86_LAYER}/usr/share/Lmod/libexec/lmod",
    }
    env.update(extra)
    return env


# ------------------------------------------------------------------ the node's and the job's


def test_the_node_s_family_is_archdetect_s_machine_type_else_the_kernel_s():
    assert family.node_family({"EESSI_MACHINE_TYPE": "riscv64"}) == "riscv64"
    assert family.node_family({}) == os.uname().machine
    assert family.node_family({"EESSI_MACHINE_TYPE": ""}) == os.uname().machine


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"EESSI_CPU_FAMILY": "aarch64", "EPREFIX": X86_LAYER}, "aarch64"),
        ({"EPREFIX": X86_LAYER + "/"}, "x86_64"),
        ({}, None),
        ({"EPREFIX": "/"}, None),
    ],
)
def test_the_job_s_family_is_eessi_cpu_family_else_eprefix_s_last_component(env, expected):
    assert family.job_family(env) == expected


def test_a_fresh_start_takes_the_family_of_the_target_unless_the_override_names_one():
    assert family.eessi_family({}, "aarch64/neoverse_v1") == "aarch64"
    assert family.eessi_family({"EESSI_CPU_FAMILY_OVERRIDE": "x86_64"}, "aarch64/neoverse_v1") == "x86_64"


# ------------------------------------------------------------------ what runs on this node


def test_the_job_s_layer_of_another_family_leaves_path_and_the_rest_stays():
    env = _x86_job()

    runnable = family.runnable(env, "aarch64")

    assert runnable["PATH"] == f"{ZEN3}/software/UserA/1.0/bin:/usr/local/bin:/usr/bin:/bin"
    assert {name: value for name, value in runnable.items() if name != "PATH"} == {
        name: value for name, value in env.items() if name != "PATH"
    }
    assert env["PATH"].startswith(ZEN3)  # a copy: the task's own is untouched


def test_a_layer_of_the_node_s_own_family_stays_on_path():
    env = _x86_job()

    assert family.runnable(env, "x86_64") == env
    assert family.foreign_layers(env, "x86_64") == ()


def test_without_layer_takes_only_directories_inside_the_layer():
    path = f"{X86_LAYER}:{X86_LAYER}/bin/:{X86_LAYER}-old/bin:/usr/bin"

    assert family.without_layer(path, (X86_LAYER,)) == f"{X86_LAYER}-old/bin:/usr/bin"
    assert family.without_layer(path, ()) == path


def test_a_job_without_a_layer_takes_nothing_from_path():
    env = {"PATH": "/usr/bin", "EESSI_CPU_FAMILY": "x86_64"}

    assert family.foreign_layers(env, "aarch64") == ()
    assert family.runnable(env, "aarch64") == env


# ------------------------------------------------------------------ which Lmod


def _layer_lmod(root, layer: str) -> str:
    """``<root>/<layer>/usr/share/Lmod``: an executable libexec/lmod and init/bash."""
    pkg = os.path.join(str(root), layer.lstrip("/"), "usr", "share", "Lmod")
    os.makedirs(os.path.join(pkg, "libexec"))
    os.makedirs(os.path.join(pkg, "init"))
    command = os.path.join(pkg, "libexec", "lmod")
    with open(command, "w") as script:
        script.write("#!/bin/false\n")
    os.chmod(command, 0o700)
    with open(os.path.join(pkg, "init", "bash"), "w") as init:
        init.write("export LMOD_CMD=...\n")
    return command


def test_the_lmod_of_another_family_s_layer_is_replaced_by_the_node_family_s(tmp_path):
    job_lmod = _layer_lmod(tmp_path, X86_LAYER)
    node_lmod = _layer_lmod(tmp_path, ARM_LAYER)

    chosen = family.lmod_for_node(job_lmod, "aarch64")

    assert chosen.command == node_lmod
    assert chosen.init == os.path.join(os.path.dirname(os.path.dirname(node_lmod)), "init", "bash")
    assert chosen.job_layer == str(tmp_path) + X86_LAYER
    assert chosen.missing is None


def test_an_lmod_of_the_node_s_family_or_of_no_layer_is_the_job_s_own(tmp_path):
    job_lmod = _layer_lmod(tmp_path, X86_LAYER)

    for lmod_cmd in (job_lmod, "/usr/share/lmod/lmod/libexec/lmod", "/opt/compat/linux/sparc/lmod", ""):
        chosen = family.lmod_for_node(lmod_cmd, "x86_64" if lmod_cmd == job_lmod else "aarch64")
        assert (chosen.command, chosen.init, chosen.missing) == (lmod_cmd, None, None)


def test_no_layer_for_the_node_s_family_names_what_was_looked_for(tmp_path):
    job_lmod = _layer_lmod(tmp_path, X86_LAYER)

    chosen = family.lmod_for_node(job_lmod, "riscv64")

    assert chosen.missing == job_lmod.replace("/x86_64/", "/riscv64/")
    assert chosen.job_layer == str(tmp_path) + X86_LAYER


def test_a_layer_whose_lmod_has_no_init_script_is_missing_it(tmp_path):
    job_lmod = _layer_lmod(tmp_path, X86_LAYER)
    node_lmod = _layer_lmod(tmp_path, ARM_LAYER)
    init = os.path.join(os.path.dirname(os.path.dirname(node_lmod)), "init", "bash")
    os.unlink(init)

    assert family.lmod_for_node(job_lmod, "aarch64").missing == init


def test_a_node_lmod_that_is_not_executable_is_missing(tmp_path):
    job_lmod = _layer_lmod(tmp_path, X86_LAYER)
    node_lmod = _layer_lmod(tmp_path, ARM_LAYER)
    os.chmod(node_lmod, 0o644)

    assert family.lmod_for_node(job_lmod, "aarch64").missing == node_lmod


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (f"{X86_LAYER}/usr/share/Lmod/libexec/lmod", "x86_64"),
        (f"{PREFIX}/compat/linux/riscv64/usr/bin/lua", "riscv64"),
        ("/opt/x/compat/linux/x86_64/y/compat/linux/aarch64/bin/z", "aarch64"),  # the innermost
        ("/usr/share/lmod/lmod/libexec/lmod", None),
        (f"{PREFIX}/compat/macos/x86_64/bin/bash", None),
        (f"{PREFIX}/compat/linux/sparc64/bin/bash", None),
    ],
)
def test_the_layer_a_program_lies_in(program, expected):
    assert family.layer_of(program) == expected


# ------------------------------------------------------------------ the first Lmod call


def test_the_first_call_starts_without_what_the_job_s_eessi_added():
    env = _x86_job()

    settings = family.before_eessi(env, "aarch64")

    assert settings == {
        "PATH": f"{ZEN3}/software/UserA/1.0/bin:/usr/local/bin:/usr/bin:/bin",
        "LMOD_RC": None,
        "LMOD_PACKAGE_PATH": None,
    }


def test_the_site_s_own_settings_stay_for_the_first_call():
    site_rc, site_package = "/etc/site/lmodrc.lua", "/etc/site/lmod"
    env = _x86_job(
        LMOD_RC=f"{SITE_ZEN3}/.lmod/lmodrc.lua:{ZEN3}/.lmod/lmodrc.lua:{site_rc}",
        __LMOD_STACK_LMOD_PACKAGE_PATH=_pushed(f"{ZEN3}/.lmod", site_package),
    )

    settings = family.before_eessi(env, "x86_64")

    assert settings == {"LMOD_RC": site_rc, "LMOD_PACKAGE_PATH": site_package}  # PATH: same family


@pytest.mark.parametrize(
    "stack",
    ["", _pushed("/elsewhere/.lmod", "/etc/site/lmod"), "not base64!", _pushed(f"{ZEN3}/.lmod")],
    ids=["no-stack", "another-top", "unreadable", "nothing-under"],
)
def test_a_package_path_with_nothing_known_under_it_is_unset_for_the_first_call(stack):
    env = _x86_job(__LMOD_STACK_LMOD_PACKAGE_PATH=stack)

    assert family.before_eessi(env, "x86_64")["LMOD_PACKAGE_PATH"] is None


def test_a_package_path_that_is_not_eessi_s_is_left_as_it_is():
    env = _x86_job(LMOD_PACKAGE_PATH="/etc/site/lmod")

    assert "LMOD_PACKAGE_PATH" not in family.before_eessi(env, "x86_64")


def test_without_eessi_s_variables_nothing_is_changed():
    env = {"PATH": "/usr/bin", "LMOD_RC": "/etc/site/lmodrc.lua", "LMOD_PACKAGE_PATH": "/etc/site/lmod"}

    assert family.before_eessi(env, "aarch64") == {}
