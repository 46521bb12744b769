"""No test depends on the host's CPU: the fixtures' "another target" on every kind of host.

The tests that run on this machine unsimulated (the guard in real Slurm, the rollout playbook,
``arch_guard_info``, the demo's real job) take this node's target from archdetect and "a target
this node cannot use" from ``eessilike.target_elsewhere``. Here the host is simulated as each
CPU of ``testbed/eessi_like/cpuinfo/`` (Intel haswell to Sapphire Rapids, AMD zen2 to zen5,
x86_64 and aarch64 generic, Neoverse, Grace, A64FX, Axion): the chosen target must never be one
archdetect lists for that host, the repository built with only that target must really have
nothing for it (the guard's own ``no-software-dir``), and a job from a login node of that
target must be repaired by the real guard to the host's own target.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import checkout
import eessilike
import simulate_cpu
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import nodeinfo
from tests.integration.harness.guard import GuardSite

HOSTS = tuple(eessilike.CPUINFO_FIXTURES)
# Where a job is repaired for real (Lmod and the guard, about a second each): Intel hosts
# with and without AVX-512 (which list older Intel targets as compatible), AMD hosts, a
# generic x86_64 one, and an aarch64 one.
GUARDED_HOSTS = (
    "x86_64/intel/haswell",
    "x86_64/intel/icelake",
    "x86_64/intel/sapphirerapids",
    "x86_64/amd/zen3",
    "x86_64/amd/zen4",
    "x86_64/generic",
    "aarch64/neoverse_v1",
)
CHECK_TIMEOUT = 60


def _compatible(host: str) -> tuple:
    return eessilike.cpupath(eessilike.node_env(host))


@pytest.fixture(scope="module")
def choices() -> dict:
    """host -> (archdetect's cpupath for it, the target chosen as one it cannot use)."""
    found = {}
    for host in HOSTS:
        compatible = _compatible(host)
        found[host] = (compatible, eessilike.target_elsewhere(compatible))
    return found


def test_the_simulated_hosts_cover_both_vendors_and_both_machine_types(choices):
    firsts = {compatible[0] for compatible, _other in choices.values()}

    assert {
        "x86_64/intel/sapphirerapids",
        "x86_64/intel/haswell",
        "x86_64/amd/zen3",
        "x86_64/amd/zen4",
    } <= firsts
    assert any(target.startswith("aarch64/") for target in firsts)
    # An Intel host with AVX2 lists the older Intel targets: the case a fixed name got wrong.
    assert "x86_64/intel/haswell" in choices["x86_64/intel/sapphirerapids"][0]


@pytest.mark.parametrize("host", HOSTS)
def test_the_other_target_is_never_one_archdetect_lists_for_the_host(choices, host):
    compatible, other = choices[host]

    assert compatible[0] == host  # each fixture is the CPU it is named after
    assert other not in compatible
    assert other in eessilike.CPUINFO_FIXTURES  # a login node of it can be simulated


@pytest.mark.parametrize("host", [host for host in HOSTS if host.startswith("x86_64/")])
def test_an_x86_64_host_gets_another_vendor_s_target(choices, host):
    compatible, other = choices[host]

    assert other.startswith("x86_64/")
    assert other.split("/")[1] != compatible[0].split("/")[1]


@pytest.mark.parametrize("host", HOSTS)
def test_the_repository_of_only_the_other_target_has_no_software_for_the_host(tmp_path, choices, host):
    _compatible_targets, other = choices[host]
    root = tmp_path / "eessi"
    eessilike.build_prefix(root, version=eessilike.DEFAULT_VERSION, targets=(other,), accel={})
    env = nodeinfo.job_environment(str(root), eessilike.DEFAULT_VERSION, None, eessilike.node_env(host))

    report = nodeinfo.version_report(str(root), eessilike.DEFAULT_VERSION, env, CHECK_TIMEOUT)

    assert report["problem"] == nodeinfo.NO_SOFTWARE_DIR, report
    assert report["cpupath"][0] == host


@pytest.fixture(scope="module")
def guarded_site(tmp_path_factory, lmod, package_root, choices) -> GuardSite:
    """One prefix with each guarded host's own target and the target chosen as its other."""
    targets = []
    for host in GUARDED_HOSTS:
        compatible, other = choices[host]
        targets += [target for target in (compatible[0], other) if target not in targets]
    prefix = eessilike.build_prefix(tmp_path_factory.mktemp("eessi-hosts"), targets=tuple(targets), accel={})
    return GuardSite(prefix=prefix, lmod=lmod, package_root=package_root)


@pytest.mark.parametrize("host", GUARDED_HOSTS)
def test_the_guard_repairs_a_job_from_the_other_target_on_each_host(guarded_site, choices, host):
    compatible, other = choices[host]
    env = guarded_site.job_env((other, None), (host, None))
    assert env["EESSI_SOFTWARE_SUBDIR"] == other

    run, applied = guarded_site.as_prolog(env)

    assert run.returncode == 0, run.stderr
    assert applied["EESSI_SOFTWARE_SUBDIR"] == compatible[0]
    assert applied["EESSI_ARCH_GUARD_RELOADED"] == f"{other}->{compatible[0]}"


def test_target_elsewhere_prefers_the_host_s_machine_type():
    assert eessilike.target_elsewhere(("x86_64/amd/zen3", "x86_64/amd/zen2")) == "x86_64/intel/haswell"
    intel = ("x86_64/intel/icelake", "x86_64/intel/haswell")
    assert eessilike.target_elsewhere(intel) == "x86_64/amd/zen3"


def test_target_elsewhere_takes_another_machine_type_when_the_host_s_has_none_left():
    compatible = ("aarch64/neoverse_v1", "aarch64/neoverse_n1")

    assert (
        eessilike.target_elsewhere(compatible, ("aarch64/neoverse_n1", "x86_64/amd/zen3"))
        == "x86_64/amd/zen3"
    )


def test_target_elsewhere_refuses_when_every_candidate_is_compatible():
    with pytest.raises(eessilike.EessiLikeError) as caught:
        eessilike.target_elsewhere(
            ("x86_64/intel/icelake", "x86_64/intel/haswell"), ("x86_64/intel/haswell",)
        )

    assert str(caught.value) == "every candidate target is compatible with x86_64/intel/icelake"


def test_cpupath_of_an_unreadable_cpuinfo_is_an_error(tmp_path):
    node = {"EESSI_PROC_CPUINFO": str(tmp_path / "missing"), "EESSI_MACHINE_TYPE": "x86_64"}

    with pytest.raises(eessilike.EessiLikeError) as caught:
        eessilike.cpupath(node)

    assert str(caught.value).startswith("archdetect -a cpupath failed (exit ")


# testbed/simulate_cpu.py: what the other-cpu gate of make test runs the host-dependent tests under


@pytest.mark.parametrize("host", HOSTS)
def test_the_simulated_cpu_of_another_vendor_is_one_the_host_cannot_use(choices, host):
    compatible, _other = choices[host]

    simulated = simulate_cpu.other_vendor(compatible)

    assert simulated not in compatible
    assert simulated.split("/")[0] == host.split("/")[0]  # /proc/cpuinfo of the same machine type
    assert simulated.split("/")[1] != host.split("/")[1]


def _simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(checkout.REPO / "testbed" / "simulate_cpu.py"), *args],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )


def test_a_command_under_simulate_cpu_sees_that_cpu_and_the_machine_does_not():
    real = eessilike.cpupath()
    simulated = simulate_cpu.other_vendor(real)

    done = _simulate("--", "bash", str(eessilike.STANDIN), "cpupath")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == simulated
    assert eessilike.cpupath() == real  # the bind mount stayed in the command's namespace


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("x86_64/intel/nehalem", "simulate_cpu: no cpuinfo dump for x86_64/intel/nehalem; known: "),
        ("riscv64/thead/c910", "simulate_cpu: no cpuinfo dump for riscv64/thead/c910; known: "),
    ],
)
def test_simulate_cpu_refuses_a_cpu_it_has_no_dump_for(target, message):
    done = _simulate("--as", target, "--", "true")

    assert done.returncode == 2
    assert done.stderr.startswith(message)


def test_simulate_cpu_refuses_a_cpu_of_another_machine_type():
    x86_64 = eessilike.cpupath()[0].startswith("x86_64/")
    other_machine = "aarch64/neoverse_v1" if x86_64 else "x86_64/amd/zen3"

    done = _simulate("--as", other_machine, "--", "true")

    assert done.returncode == 2
    assert done.stderr.startswith(f"simulate_cpu: {other_machine} is not of this machine's type")


def test_simulate_cpu_without_a_command_is_a_usage_error():
    done = _simulate("--as", "x86_64/amd/zen3")

    assert done.returncode == 2
    assert "no command given" in done.stderr
