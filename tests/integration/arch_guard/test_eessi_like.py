"""The EESSI-like fixture: our archdetect stand-in, its prefix and its module, with real bash
and real Lmod. Nodes are the variables of ``eessilike.node_env``; node A is an Ice Lake with
an A100-class GPU (cc80), node B a Zen 3 without GPU."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

import eessilike

NODE_A = ("x86_64/intel/icelake", "accel/nvidia/cc80")
NODE_B = ("x86_64/amd/zen3", None)
FAKE_SMI_PATH = "/usr/bin:/bin"

# What the stand-in must answer for each of our fixtures: `-a cpupath`, most specific first.
ALL_TARGETS = {
    "x86_64/generic": "x86_64/generic",
    "x86_64/intel/haswell": "x86_64/intel/haswell:x86_64/generic",
    "x86_64/intel/skylake_avx512": "x86_64/intel/skylake_avx512:x86_64/intel/haswell:x86_64/generic",
    "x86_64/intel/cascadelake": (
        "x86_64/intel/cascadelake:x86_64/intel/skylake_avx512:x86_64/intel/haswell:x86_64/generic"
    ),
    "x86_64/intel/icelake": (
        "x86_64/intel/icelake:x86_64/intel/cascadelake:x86_64/intel/skylake_avx512:"
        "x86_64/intel/haswell:x86_64/generic"
    ),
    "x86_64/intel/sapphirerapids": (
        "x86_64/intel/sapphirerapids:x86_64/intel/icelake:x86_64/intel/cascadelake:"
        "x86_64/intel/skylake_avx512:x86_64/intel/haswell:x86_64/generic"
    ),
    "x86_64/amd/zen2": "x86_64/amd/zen2:x86_64/generic",
    "x86_64/amd/zen3": "x86_64/amd/zen3:x86_64/amd/zen2:x86_64/generic",
    "x86_64/amd/zen4": "x86_64/amd/zen4:x86_64/amd/zen3:x86_64/amd/zen2:x86_64/generic",
    "x86_64/amd/zen5": "x86_64/amd/zen5:x86_64/amd/zen4:x86_64/amd/zen3:x86_64/amd/zen2:x86_64/generic",
    "aarch64/generic": "aarch64/generic",
    "aarch64/neoverse_n1": "aarch64/neoverse_n1:aarch64/generic",
    "aarch64/neoverse_v1": "aarch64/neoverse_v1:aarch64/neoverse_n1:aarch64/generic",
    "aarch64/nvidia/grace": "aarch64/nvidia/grace:aarch64/neoverse_v1:aarch64/neoverse_n1:aarch64/generic",
    "aarch64/google/axion": (
        "aarch64/google/axion:aarch64/nvidia/grace:aarch64/neoverse_v1:aarch64/neoverse_n1:aarch64/generic"
    ),
    "aarch64/a64fx": "aarch64/a64fx:aarch64/generic",
    "riscv64/generic": "riscv64/generic",
    "riscv64/sifive/p550": "riscv64/sifive/p550:riscv64/generic",
    "riscv64/spacemit/x60": "riscv64/spacemit/x60:riscv64/generic",
}


def _detect(*args: str, node=None, path: str = "/usr/bin:/bin", **extra: str) -> subprocess.CompletedProcess:
    return eessilike.run_archdetect(eessilike.archdetect_env(node or {}, path=path, **extra), *args)


@pytest.fixture(scope="module")
def smi_bin(tmp_path_factory) -> Path:
    return eessilike.copy_fake_nvidia_smi(tmp_path_factory.mktemp("smi"))


@pytest.fixture(scope="module")
def eessi(tmp_path_factory) -> eessilike.EessiPrefix:
    """The default prefix, with UserB left out of neoverse_v1's tree for the missing-module test."""
    return eessilike.build_prefix(
        tmp_path_factory.mktemp("eessi"), omit={"aarch64/neoverse_v1": ["UserB/2.0"]}
    )


@pytest.fixture(scope="module")
def login_a(lmod, eessi) -> dict:
    return eessilike.login_environment(lmod, eessi, eessi.node_env(*NODE_A))


def _run(env: dict, *command: str) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def _runs(log: Path) -> list:
    return log.read_text().splitlines() if log.exists() else []


# ----------------------------------------------------------------- archdetect stand-in


@pytest.mark.parametrize("target", sorted(ALL_TARGETS))
def test_standin_answers_each_cpuinfo_fixture(target):
    node = eessilike.node_env(target)

    best = _detect("cpupath", node=node)
    every = _detect("-a", "cpupath", node=node)

    assert (best.returncode, best.stdout, best.stderr) == (0, target + "\n", "")
    assert (every.returncode, every.stdout) == (0, ALL_TARGETS[target] + "\n")


def test_every_cpuinfo_fixture_is_named_for_its_target():
    files = sorted(p.name for p in eessilike.CPUINFO_DIR.glob("*.cpuinfo"))

    assert files == sorted(eessilike.CPUINFO_FIXTURES.values())
    assert sorted(eessilike.CPUINFO_FIXTURES) == sorted(ALL_TARGETS)


def test_fixtures_use_the_kernels_cpuinfo_layout():
    x86 = (eessilike.CPUINFO_DIR / eessilike.CPUINFO_FIXTURES["x86_64/amd/zen3"]).read_text()
    arm = (eessilike.CPUINFO_DIR / eessilike.CPUINFO_FIXTURES["aarch64/neoverse_n1"]).read_text()

    assert x86.startswith("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n")
    assert x86.count("\nflags\t\t: ") == 2
    assert arm.startswith("processor\t: 0\nBogoMIPS\t: ")
    assert "\nCPU implementer\t: 0x41\nCPU architecture: 8\n" in arm
    assert arm.count("processor\t: ") == 2


def test_lscpu_style_dump_reads_like_proc_cpuinfo(tmp_path):
    dump = tmp_path / "lscpu.cpuinfo"
    dump.write_text(
        "Architecture:        x86_64\nVendor ID:           GenuineIntel\nCPU family:          6\n"
        "Model name:          Some Xeon\n"
        "Flags:               fpu sse sse2 avx avx2 fma bmi1 bmi2 movbe f16c\n"
    )

    ran = _detect("cpupath", node={"EESSI_PROC_CPUINFO": str(dump), "EESSI_MACHINE_TYPE": "x86_64"})

    assert ran.stdout == "x86_64/intel/haswell\n"


def test_unknown_arm_implementer_is_placed_by_its_features(tmp_path):
    dump = tmp_path / "ampere-one.cpuinfo"
    dump.write_text(
        "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd atomics lrcpc dcpop asimddp cpuid\n"
        "CPU implementer\t: 0xc0\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xac3\n"
    )

    ran = _detect("-a", "cpupath", node={"EESSI_PROC_CPUINFO": str(dump), "EESSI_MACHINE_TYPE": "aarch64"})

    assert ran.stdout == "aarch64/neoverse_n1:aarch64/generic\n"


def test_unknown_x86_vendor_gets_the_generic_target(tmp_path):
    dump = tmp_path / "hygon.cpuinfo"
    dump.write_text(
        "processor\t: 0\nvendor_id\t: HygonGenuine\nflags\t\t: avx2 fma bmi1 bmi2 adx sha_ni clzero clwb\n"
    )

    ran = _detect("-a", "cpupath", node={"EESSI_PROC_CPUINFO": str(dump), "EESSI_MACHINE_TYPE": "x86_64"})

    assert (ran.returncode, ran.stdout) == (0, "x86_64/generic\n")


def test_debug_explains_on_stderr_and_keeps_the_answer():
    ran = _detect("-d", "cpupath", node=eessilike.node_env("x86_64/intel/cascadelake"))

    assert ran.stdout == "x86_64/intel/cascadelake\n"
    assert "not x86_64/intel/icelake: no avx512ifma" in ran.stderr


def test_unsupported_machine_type_exits_1():
    node = dict(eessilike.node_env("x86_64/amd/zen3"), EESSI_MACHINE_TYPE="ppc64le")

    ran = _detect("cpupath", node=node)

    assert (ran.returncode, ran.stdout) == (1, "")
    assert "unsupported machine type 'ppc64le'" in ran.stderr


def test_missing_cpuinfo_exits_1_naming_it(tmp_path):
    missing = tmp_path / "gone.cpuinfo"

    ran = _detect("cpupath", node={"EESSI_PROC_CPUINFO": str(missing), "EESSI_MACHINE_TYPE": "x86_64"})

    assert (ran.returncode, ran.stdout) == (1, "")
    assert f"cannot read cpuinfo {missing}" in ran.stderr


def test_cpuinfo_that_is_a_directory_exits_1(tmp_path):
    ran = _detect("cpupath", node={"EESSI_PROC_CPUINFO": str(tmp_path), "EESSI_MACHINE_TYPE": "x86_64"})

    assert ran.returncode == 1
    assert f"cannot read cpuinfo {tmp_path}" in ran.stderr


@pytest.mark.parametrize("args", [(), ("-x", "cpupath"), ("gpupath",), ("cpupath", "accelpath")])
def test_bad_command_line_exits_1_with_usage(args):
    ran = _detect(*args)

    assert (ran.returncode, ran.stdout) == (1, "")
    assert "usage: eessi_archdetect.sh [-d] [-a] cpupath|accelpath" in ran.stderr


def test_accelpath_reports_the_first_gpus_compute_capability(smi_bin):
    ran = _detect("accelpath", path=f"{smi_bin}:{FAKE_SMI_PATH}", EESSI_LIKE_GPU_COMPUTE_CAP="9.0,8.0")

    assert (ran.returncode, ran.stdout) == (0, "accel/nvidia/cc90\n")


def test_accelpath_without_nvidia_smi_exits_2():
    ran = _detect("accelpath", path=FAKE_SMI_PATH)

    assert (ran.returncode, ran.stdout) == (2, "")


def test_accelpath_when_nvidia_smi_finds_no_device_exits_3(smi_bin):
    ran = _detect("accelpath", path=f"{smi_bin}:{FAKE_SMI_PATH}", EESSI_LIKE_GPU_COMPUTE_CAP="")

    assert (ran.returncode, ran.stdout) == (3, "")


def test_accelpath_when_nvidia_smi_answers_nonsense_exits_3(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\n")
    smi.chmod(0o755)

    ran = _detect("accelpath", path=f"{tmp_path}:{FAKE_SMI_PATH}")

    assert (ran.returncode, ran.stdout) == (3, "")


def test_software_subdir_override_short_circuits_cpupath(tmp_path):
    node = {"EESSI_PROC_CPUINFO": str(tmp_path / "absent"), "EESSI_MACHINE_TYPE": "ppc64le"}

    best = _detect("cpupath", node=node, EESSI_SOFTWARE_SUBDIR_OVERRIDE="x86_64/amd/zen2")
    every = _detect("-a", "cpupath", node=node, EESSI_SOFTWARE_SUBDIR_OVERRIDE="x86_64/amd/zen2")

    assert (best.returncode, best.stdout) == (0, "x86_64/amd/zen2\n")
    assert (every.returncode, every.stdout) == (0, "x86_64/amd/zen2\n")


def test_accelerator_override_answers_without_nvidia_smi():
    ran = _detect("accelpath", path=FAKE_SMI_PATH, EESSI_ACCELERATOR_TARGET_OVERRIDE="accel/amd/gfx90a")

    assert (ran.returncode, ran.stdout) == (0, "accel/amd/gfx90a\n")


def test_malformed_accelerator_override_exits_1():
    ran = _detect("accelpath", path=FAKE_SMI_PATH, EESSI_ACCELERATOR_TARGET_OVERRIDE="nvidia/cc80")

    assert (ran.returncode, ran.stdout) == (1, "")
    assert "EESSI_ACCELERATOR_TARGET_OVERRIDE='nvidia/cc80'" in ran.stderr


def test_run_log_gets_one_line_per_run(tmp_path):
    log = tmp_path / "runs.log"
    node = eessilike.node_env("x86_64/amd/zen3")

    first = _detect("-a", "cpupath", node=node, EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log))
    second = _detect("accelpath", node=node, EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log))

    lines = _runs(log)
    assert (first.returncode, second.returncode) == (0, 2)
    assert [line.split(" ", 1)[1] for line in lines] == ["-a cpupath", "accelpath"]
    assert all(line.split(" ", 1)[0].isdigit() for line in lines)
    assert lines[0].split()[0] != lines[1].split()[0]


def test_unwritable_run_log_exits_1(tmp_path):
    log = tmp_path / "no-such-dir" / "runs.log"

    ran = _detect(
        "cpupath", node=eessilike.node_env("x86_64/amd/zen3"), EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log)
    )

    assert (ran.returncode, ran.stdout) == (1, "")
    assert f"cannot append to run log {log}" in ran.stderr


# ----------------------------------------------------------------- the built prefix


def test_build_prefix_writes_the_eessi_layout(eessi):
    prefix = eessi.prefix

    assert eessi.prefix == eessi.root / "versions" / "2023.06"
    assert (eessi.module_dir / "EESSI" / "2023.06.lua").is_file()
    assert os.access(eessi.archdetect, os.X_OK)
    assert (eessi.init_prefix / "arch_specs" / "x86_64").is_file()
    assert os.access(eessi.gpu_bin / "nvidia-smi", os.X_OK)
    for target in eessilike.DEFAULT_TARGETS:
        software = eessi.software_subdir_path(target)
        assert os.access(software / "software" / "UserA" / "1.0" / "bin" / "usera", os.X_OK)
        assert (software / "modules" / "all" / "UserA" / "1.0.lua").is_file()
    icelake = eessi.software_subdir_path("x86_64/intel/icelake")
    assert (icelake / "accel" / "nvidia" / "cc80" / "modules" / "all" / "GpuKit" / "1.0.lua").is_file()
    assert sorted(p.name for p in (prefix / "compat" / "linux").iterdir()) == ["aarch64", "riscv64", "x86_64"]
    assert not (eessi.software_subdir_path("x86_64/amd/zen3") / "accel").exists()
    assert not (eessi.module_path("aarch64/neoverse_v1") / "UserB").exists()


@pytest.mark.parametrize("family", eessilike.MACHINES)
def test_each_layer_s_lmod_runs_on_a_node_of_its_family_and_is_refused_on_the_others(eessi, lmod, family):
    layer = eessi.layer(family)
    script = f". {shlex.quote(str(layer.lmod_init))} && module -t avail EESSI"
    for node in eessilike.MACHINES:
        env = {"PATH": "/usr/bin:/bin", "EESSI_MACHINE_TYPE": node, "MODULEPATH": str(eessi.module_dir)}

        ran = eessilike.run_shell(lmod, env, script, lmod_init=False)

        assert ran.env["LMOD_CMD"] == str(layer.lmod_cmd)
        if node == family:
            assert ran.returncode == 0, ran.stderr
            assert f"EESSI/{eessi.version}" in ran.stderr
        else:
            # Lmod's `module` evaluates what its command printed: nothing, as the kernel
            # refused the layer's lua.
            assert "Exec format error" in ran.stderr
            assert f"EESSI/{eessi.version}" not in ran.stderr


def test_installed_archdetect_uses_its_own_tables(eessi):
    env = eessilike.archdetect_env(eessi.node_env("aarch64/nvidia/grace"))

    ran = eessilike.run_archdetect(env, "cpupath", script=eessi.archdetect)

    assert ran.stdout == "aarch64/nvidia/grace\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"targets": ["x86_64/intel/haswell", "sparc/t5"]}, "target 'sparc/t5' is not"),
        ({"accel": {"x86_64/amd/zen2": "accel/nvidia/cc80"}}, "not among the targets"),
        ({"accel": {"x86_64/intel/icelake": "accel/amd/gfx90a"}}, "is not accel/nvidia/ccNN"),
        ({"omit": {"x86_64/amd/zen3": ["UserZ/9"]}}, "unknown modules ['UserZ/9']"),
        ({"omit": {"x86_64/amd/zen2": ["UserA/1.0"]}}, "omit names x86_64/amd/zen2"),
    ],
)
def test_build_prefix_refuses_a_request_it_cannot_build(tmp_path, kwargs, message):
    with pytest.raises(eessilike.EessiLikeError) as caught:
        eessilike.build_prefix(tmp_path, **kwargs)

    assert message in str(caught.value)
    assert not (tmp_path / "versions").exists()


def test_build_prefix_refuses_to_build_a_version_twice(tmp_path):
    eessilike.build_prefix(tmp_path, targets=["x86_64/amd/zen3"], accel={})

    with pytest.raises(eessilike.EessiLikeError, match="exists already"):
        eessilike.build_prefix(tmp_path, targets=["x86_64/amd/zen3"], accel={})


def test_node_env_refuses_a_target_without_fixture(eessi):
    with pytest.raises(eessilike.EessiLikeError, match="no cpuinfo fixture for x86_64/intel/graniterapids"):
        eessi.node_env("x86_64/intel/graniterapids")


def test_prefix_node_env_reads_the_prefixs_cpuinfo_copies(eessi):
    node = eessi.node_env("x86_64/intel/icelake", "accel/nvidia/cc80")

    assert node == {
        "EESSI_PROC_CPUINFO": str(
            eessi.root / "node-cpuinfo" / "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo"
        ),
        "EESSI_MACHINE_TYPE": "x86_64",
        "EESSI_LIKE_GPU_COMPUTE_CAP": "8.0",
    }
    assert (
        Path(node["EESSI_PROC_CPUINFO"]).read_text()
        == (eessilike.CPUINFO_DIR / "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo").read_text()
    )


# ----------------------------------------------------------------- the EESSI module


def test_loading_on_node_a_selects_node_a(eessi, login_a):
    software = eessi.software_subdir_path("x86_64/intel/icelake")

    assert login_a["EESSI_SOFTWARE_SUBDIR"] == "x86_64/intel/icelake"
    assert login_a["EESSI_ACCEL_SUBDIR"] == "accel/nvidia/cc80"
    assert login_a["EESSI_VERSION"] == "2023.06"
    assert login_a["EESSI_PREFIX"] == str(eessi.prefix)
    assert login_a["EESSI_INIT_PREFIX"] == str(eessi.init_prefix)
    assert login_a["EESSI_SOFTWARE_PATH"] == str(software)
    assert login_a["EESSI_MODULEPATH"] == str(software / "modules" / "all")
    assert login_a["EESSI_CPU_FAMILY"] == "x86_64"
    assert login_a["EPREFIX"] == str(eessi.prefix / "compat" / "linux" / "x86_64")
    site_software = (
        eessi.root / "host_injections" / "2023.06" / "software" / "linux" / "x86_64" / "intel" / "icelake"
    )
    assert login_a["EESSI_SITE_SOFTWARE_PATH"] == str(site_software)
    assert login_a["MODULEPATH"].split(":") == [
        str(site_software / "modules" / "all"),  # the site's first, as EESSI puts it
        str(software / "accel" / "nvidia" / "cc80" / "modules" / "all"),
        str(software / "modules" / "all"),
        str(eessi.module_dir),
    ]
    assert login_a["LOADEDMODULES"] == "EESSI/2023.06:UserA/1.0:UserB/2.0"
    assert login_a["PATH"].endswith(f"{login_a['EPREFIX']}/bin:{eessi.login_path}")


@pytest.mark.parametrize("target", eessilike.DEFAULT_TARGETS)
def test_user_modules_load_on_every_target_and_say_it(lmod, eessi, target):
    modules = (eessi.module, "UserA/1.0") if target == "aarch64/neoverse_v1" else None

    env = eessilike.login_environment(lmod, eessi, eessi.node_env(target), modules)

    assert env["EESSI_SOFTWARE_SUBDIR"] == target
    assert _run(env, "usera") == target
    assert env["EBROOTUSERA"] == str(eessi.software_subdir_path(target) / "software" / "UserA" / "1.0")
    if modules is None:
        assert _run(env, "userb") == target
        assert env["EBVERSIONUSERB"] == "2.0"


def test_module_missing_on_one_target_fails_to_load_there(lmod, eessi):
    with pytest.raises(eessilike.EessiLikeError) as caught:
        eessilike.login_environment(lmod, eessi, eessi.node_env("aarch64/neoverse_v1"))

    assert "module load EESSI/2023.06 UserA/1.0 UserB/2.0 failed" in str(caught.value)
    assert "UserB/2.0" in str(caught.value).split("failed", 1)[1]


@pytest.mark.parametrize(
    ("node", "selected"),
    [
        ("x86_64/intel/cascadelake", "x86_64/intel/haswell"),
        ("x86_64/intel/sapphirerapids", "x86_64/intel/icelake"),
        ("x86_64/amd/zen5", "x86_64/amd/zen3"),
        ("aarch64/google/axion", "aarch64/neoverse_v1"),
    ],
)
def test_module_selects_the_first_candidate_with_a_software_dir(lmod, eessi, node, selected):
    env = eessilike.login_environment(lmod, eessi, eessi.node_env(node), [eessi.module])

    assert env["EESSI_SOFTWARE_SUBDIR"] == selected
    assert env["EESSI_ARCHDETECT_OPTIONS"] == ALL_TARGETS[node]


def test_module_fails_when_no_candidate_has_a_software_dir(lmod, eessi):
    env = eessilike.login_base(eessi, lmod)
    env.update(eessi.node_env("aarch64/a64fx"))

    ran = eessilike.run_shell(lmod, env, eessilike.load_script(eessi, [eessi.module]))

    assert ran.returncode != 0
    assert "no software directory under" in ran.stderr
    assert "aarch64/a64fx:aarch64/generic" in ran.stderr
    assert "EESSI_SOFTWARE_SUBDIR" not in ran.env
    assert ran.env.get("LOADEDMODULES", "") == ""


def test_archdetect_options_override_skips_cpu_detection(lmod, eessi, tmp_path):
    log = tmp_path / "runs.log"
    node = dict(
        eessi.node_env(*NODE_A),
        EESSI_ARCHDETECT_OPTIONS_OVERRIDE="x86_64/amd/zen3:x86_64/generic",
        EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log),
    )

    env = eessilike.login_environment(lmod, eessi, node, [eessi.module])

    assert env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/amd/zen3"
    assert [line.split(" ", 1)[1] for line in _runs(log)] == ["accelpath"]


def test_accelerator_modules_only_on_a_node_with_that_gpu(lmod, eessi, login_a):
    no_gpu = eessilike.login_environment(lmod, eessi, eessi.node_env("x86_64/intel/icelake"), [eessi.module])
    other_cpu = eessilike.login_environment(
        lmod, eessi, eessi.node_env("x86_64/intel/haswell", "accel/nvidia/cc80"), [eessi.module]
    )
    accel_modules = str(eessi.module_path("x86_64/intel/icelake", "accel/nvidia/cc80"))

    assert accel_modules in login_a["MODULEPATH"].split(":")
    assert no_gpu["EESSI_ACCEL_SUBDIR"] == ""
    assert accel_modules not in no_gpu["MODULEPATH"]
    assert "/accel/" not in no_gpu["MODULEPATH"]
    assert other_cpu["EESSI_ACCEL_SUBDIR"] == "accel/nvidia/cc80"
    assert "/accel/" not in other_cpu["MODULEPATH"]
    assert "EESSI_MODULEPATH_ACCEL" not in other_cpu


def test_gpu_module_loads_from_the_accelerator_subtree(lmod, eessi):
    env = eessilike.login_environment(lmod, eessi, eessi.node_env(*NODE_A), [eessi.module, "GpuKit/1.0"])

    assert _run(env, "gpukit") == "x86_64/intel/icelake accel/nvidia/cc80"


def test_written_module_exporting_a_newline_value_survives_the_login(lmod, tmp_path):
    prefix = eessilike.build_prefix(tmp_path, targets=["x86_64/amd/zen3"], accel={})
    prefix.write_module(
        "x86_64/amd/zen3",
        "Odd/1.0",
        'execute{cmd="export ODD_VALUE=$\'two\\nlines = and Ünïcode\'", modeA={"load"}}\n',
    )

    env = eessilike.login_environment(
        lmod, prefix, prefix.node_env("x86_64/amd/zen3"), [prefix.module, "Odd/1.0"]
    )

    assert env["ODD_VALUE"] == "two\nlines = and Ünïcode"


def test_lmod_setenv_cuts_a_value_at_its_newline(lmod, tmp_path):
    """Measured on Lmod 8.6.19: its bash output does not quote a newline, so setenv() keeps
    only the first line (the rest runs as a command). Modules that need a multi-line value
    export it through execute{}, as the test above does."""
    prefix = eessilike.build_prefix(tmp_path, targets=["x86_64/amd/zen3"], accel={})
    prefix.write_module("x86_64/amd/zen3", "Odd/1.0", 'setenv("ODD_VALUE", "two\\nlines")\n')

    env = eessilike.login_environment(
        lmod, prefix, prefix.node_env("x86_64/amd/zen3"), [prefix.module, "Odd/1.0"]
    )

    assert env["ODD_VALUE"] == "two"


def test_write_module_refuses_a_path_that_is_not_name_version(eessi):
    with pytest.raises(eessilike.EessiLikeError, match="is not <Name>/<version>"):
        eessi.write_module("x86_64/amd/zen3", "../../escape/1.0", "")


def test_unloading_the_module_removes_what_it_set(lmod, eessi, login_a):
    ran = eessilike.job_shell(lmod, login_a, {}, "module unload EESSI")

    assert ran.returncode == 0, ran.stderr
    left = sorted(
        name for name in ran.env if name.startswith("EESSI_") and not name.startswith("EESSI_LIKE_")
    )
    assert left == ["EESSI_MACHINE_TYPE", "EESSI_PROC_CPUINFO"]
    assert "EPREFIX" not in ran.env
    assert "LMOD_RC" not in ran.env
    assert ran.env["MODULEPATH"] == str(eessi.module_dir)


# ----------------------------------------------------------------- source_sh reuse


def test_job_on_node_b_inherits_node_a_target(lmod, eessi, login_a):
    """No module command at all: the job runs node A's builds on node B."""
    ran = eessilike.job_shell(lmod, login_a, eessi.node_env(*NODE_B), "usera >&2")

    assert ran.returncode == 0
    assert ran.env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/intel/icelake"
    assert ran.stderr.strip() == "x86_64/intel/icelake"


def test_refresh_on_node_b_replays_node_a_detection(lmod, eessi, login_a, tmp_path):
    """``module refresh`` re-evaluates the loaded EESSI module; its ``source_sh`` finds the
    record in the module table and replays it instead of running archdetect."""
    log = tmp_path / "runs.log"
    node_b = dict(eessi.node_env(*NODE_B), EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log))

    ran = eessilike.job_shell(lmod, login_a, node_b, "module refresh")

    assert ran.returncode == 0, ran.stderr
    assert _runs(log) == []
    assert ran.env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/intel/icelake"
    assert ran.env["EESSI_ACCEL_SUBDIR"] == "accel/nvidia/cc80"
    assert ran.env["MODULEPATH"] == login_a["MODULEPATH"]


def test_load_again_on_node_b_detects_again_with_this_lmod(lmod, eessi, login_a, tmp_path):
    """Measured on Lmod 8.6.19: ``module load`` of the loaded EESSI module unloads it first
    (Master.load), which drops the source_sh record, so detection runs again on node B.
    The replay needs a command that keeps the module loaded (refresh, above)."""
    log = tmp_path / "runs.log"
    node_b = dict(eessi.node_env(*NODE_B), EESSI_ARCHDETECT_STANDIN_RUNLOG=str(log))

    ran = eessilike.job_shell(lmod, login_a, node_b, f"module load {eessi.module}")

    assert ran.returncode == 0, ran.stderr
    assert [line.split(" ", 1)[1] for line in _runs(log)] == ["-a cpupath", "accelpath"]
    assert ran.env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/amd/zen3"


def test_unload_then_load_on_node_b_gives_what_a_fresh_load_gives(lmod, eessi, login_a):
    node_b = eessi.node_env(*NODE_B)

    ran = eessilike.job_shell(lmod, login_a, node_b, f"module unload EESSI && module load {eessi.module}")
    fresh = eessilike.fresh_load(lmod, eessi, node_b)

    assert ran.returncode == 0, ran.stderr
    assert ran.env["EESSI_SOFTWARE_SUBDIR"] == "x86_64/amd/zen3"
    assert ran.env["EESSI_ACCEL_SUBDIR"] == ""
    for name in ("EESSI_SOFTWARE_PATH", "EESSI_MODULEPATH", "EESSI_ARCHDETECT_OPTIONS", "MODULEPATH", "PATH"):
        assert ran.env[name] == fresh[name], name
    assert ran.env["LOADEDMODULES"] == fresh["LOADEDMODULES"] == "EESSI/2023.06:UserA/1.0:UserB/2.0"
    assert _run(ran.env, "usera") == "x86_64/amd/zen3"
