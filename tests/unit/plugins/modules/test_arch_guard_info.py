"""hpcstack.ops.arch_guard_info: ``main()`` run with module arguments, its JSON result read back.

The EESSI versions are EESSI-like prefixes (``tests/support/nodeinfo.py``) with our
archdetect stand-in, run for real; the node is simulated through ``job_env``. The module only
reads: a snapshot of the prefixes and of the guard's install is the same after every call.
"""

from __future__ import annotations

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import nodeinfo
from ansible_collections.hpcstack.ops.plugins.modules import arch_guard_info
from tests.support.module_runner import assert_failed_with, run_module
from tests.support.nodeinfo import (
    DIGEST,
    FIRST,
    GPU,
    HASWELL,
    ICELAKE,
    LATER,
    NONE,
    RELEASE,
    build_versions,
    install_guard,
    node_job_env,
)
from tests.support.staged import snapshot


@pytest.fixture(scope="module")
def eessi(tmp_path_factory):
    return build_versions(tmp_path_factory.mktemp("eessi"))


@pytest.fixture
def host(monkeypatch, tmp_path):
    """This host without an Lmod of its own: LMOD_CMD unset, no usual location."""
    monkeypatch.delenv("LMOD_CMD", raising=False)
    monkeypatch.setattr(nodeinfo, "LMOD_LOCATIONS", (str(tmp_path / "no-lmod"),))
    return tmp_path


def _info(capsys, eessi, node=(ICELAKE, None), check_mode=False, **args):
    """The module for the simulated ``node`` on the EESSI-like root, with no guard installed
    unless ``args`` name a prefix."""
    params = {
        "eessi_root": str(eessi[FIRST].root),
        "prefix": "/nonexistent/arch-guard",
        "job_env": node_job_env(eessi[FIRST], *node) if node else None,
        **args,
    }
    return run_module(capsys, arch_guard_info, params, check_mode=check_mode)


def _entry(result, version):
    (entry,) = [entry for entry in result["eessi"] if entry["version"] == version]
    return entry


def _without_invocation(result):
    return {key: value for key, value in result.items() if key != "invocation"}


# what a job would get, per version


def test_each_version_reports_the_guards_target_or_its_token(capsys, eessi, host):
    before = snapshot(eessi[FIRST].root)

    result = _info(capsys, eessi)

    assert "failed" not in result
    assert result["changed"] is False
    assert result["targets"] == {NONE: None, FIRST: ICELAKE, LATER: HASWELL}
    assert result["problems"] == {NONE: "no-software-dir"}
    assert result["available_versions"] == [NONE, FIRST, LATER]
    first = _entry(result, FIRST)
    assert (first["cpupath"][0], first["target"], first["software_dir_exists"]) == (ICELAKE, ICELAKE, True)
    later = _entry(result, LATER)
    assert (later["cpupath"][0], later["target"]) == (ICELAKE, HASWELL)
    none = _entry(result, NONE)
    assert (none["target"], none["software_dir_exists"], none["problem"]) == (None, False, "no-software-dir")
    assert snapshot(eessi[FIRST].root) == before


def test_a_gpu_node_reports_its_accelerator(capsys, eessi, host):
    result = _info(capsys, eessi, (ICELAKE, GPU), versions=[FIRST])

    assert "failed" not in result
    entry = _entry(result, FIRST)
    assert (entry["target"], entry["accelpath"], entry["accel"]) == (ICELAKE, GPU, GPU)
    assert [entry["version"] for entry in result["eessi"]] == [FIRST]


def test_a_failing_archdetect_is_archdetect_failed(capsys, eessi, host):
    job_env = node_job_env(eessi[FIRST], ICELAKE, EESSI_MACHINE_TYPE="ppc64le")

    result = _info(capsys, eessi, None, versions=[FIRST], job_env=job_env)

    assert "failed" not in result
    assert result["problems"] == {FIRST: "archdetect-failed"}
    entry = _entry(result, FIRST)
    assert entry["detail"].startswith("archdetect -a cpupath exited 1: ")
    assert entry["cpupath"] is None


def test_a_missing_version_is_archdetect_failed(capsys, eessi, host):
    result = _info(capsys, eessi, versions=["2099.01"])

    assert "failed" not in result
    assert result["problems"] == {"2099.01": "archdetect-failed"}
    assert _entry(result, "2099.01")["archdetect"] is None
    assert _entry(result, "2099.01")["prefix_exists"] is False


def test_no_versions_at_all_is_an_empty_report(capsys, eessi, host):
    result = _info(capsys, eessi, eessi_root=str(host / "no-cvmfs"))

    assert "failed" not in result
    assert result["eessi"] == []
    assert result["available_versions"] == []
    assert (result["targets"], result["problems"]) == ({}, {})


def test_the_defaults_name_cvmfs_and_the_roles_prefix(capsys, eessi, host):
    result = run_module(capsys, arch_guard_info, {})

    assert "failed" not in result
    assert result["eessi_root"] == "/cvmfs/software.eessi.io"
    assert result["guard"]["prefix"] == "/opt/hpcstack/arch-guard"
    assert result["tmpdir"] is None
    assert result["cache_dir"] == "/tmp"
    assert result["invocation"]["module_args"]["timeout"] == 60


def test_the_jobs_tmpdir_gives_the_cache_dir(capsys, eessi, host):
    result = _info(capsys, eessi, versions=[FIRST], tmpdir=str(host))

    assert "failed" not in result
    assert (result["tmpdir"], result["cache_dir"]) == (str(host), str(host))


# check mode, a second call


def test_check_mode_returns_what_a_normal_call_returns(capsys, eessi, host):
    normal = _info(capsys, eessi)

    checked = _info(capsys, eessi, check_mode=True)

    assert "failed" not in checked
    assert checked["changed"] is False
    assert _without_invocation(checked) == _without_invocation(normal)


# the guard's install


def test_an_installed_guard_is_reported_with_its_release(capsys, eessi, host):
    prefix = install_guard(host / "guard")
    before = snapshot(prefix)

    result = _info(capsys, eessi, versions=[FIRST], prefix=str(prefix))

    assert "failed" not in result
    assert result["guard"] == {
        "prefix": str(prefix),
        "installed": True,
        "version": RELEASE["version"],
        "digest": DIGEST,
        "python": RELEASE["python"],
        "launcher": str(prefix / "bin" / "eessi-arch-guard"),
        "code": str(prefix / "lib" / "current" / "hpcstack_ops"),
        "problem": None,
    }
    assert snapshot(prefix) == before


def test_a_guard_not_installed_is_reported_with_nulls(capsys, eessi, host):
    result = _info(capsys, eessi, versions=[FIRST], prefix=str(host / "guard"))

    assert "failed" not in result
    assert result["guard"]["installed"] is False
    assert result["guard"]["problem"] is None
    assert [result["guard"][key] for key in ("version", "digest", "python", "launcher", "code")] == [None] * 5


def test_a_corrupt_release_json_is_reported_not_failed(capsys, eessi, host):
    prefix = install_guard(host / "guard", '{"version": "0.1.0",')

    result = _info(capsys, eessi, versions=[FIRST], prefix=str(prefix))

    assert "failed" not in result
    assert result["guard"]["installed"] is False
    assert result["guard"]["problem"] == f"{prefix}/release.json is not JSON (20 bytes)"
    assert result["targets"] == {FIRST: ICELAKE}


# Lmod


def test_no_lmod_is_reported_not_failed(capsys, eessi, host):
    result = _info(capsys, eessi, versions=[FIRST])

    assert "failed" not in result
    assert result["lmod"] == {"cmd": None, "executable": False, "source": None}


def test_an_lmod_cmd_that_does_not_run_is_reported(capsys, eessi, host):
    result = _info(capsys, eessi, versions=[FIRST], lmod_cmd=str(host / "lmod"))

    assert "failed" not in result
    assert result["lmod"] == {"cmd": str(host / "lmod"), "executable": False, "source": "option"}


def test_lmod_cmd_comes_from_the_modules_environment(capsys, eessi, host, monkeypatch):
    lmod = host / "lmod"
    lmod.write_text("#!/bin/sh\n")
    lmod.chmod(0o755)
    monkeypatch.setenv("LMOD_CMD", str(lmod))

    result = _info(capsys, eessi, versions=[FIRST])

    assert "failed" not in result
    assert result["lmod"] == {"cmd": str(lmod), "executable": True, "source": "environment"}


# refusals: failed, one line, no traceback


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"eessi_root": "cvmfs"}, "eessi_root must be an absolute path, not 'cvmfs'", id="root"),
        pytest.param(
            {"versions": ["../etc"]},
            "versions: '../etc' is not the name of a directory under versions/",
            id="version",
        ),
        pytest.param({"timeout": 0}, "timeout must be more than 0 and at most 86400 seconds", id="timeout"),
        pytest.param(
            {"job_env": {"EESSI_PREFIX": "/x"}},
            "job_env must not set EESSI_PREFIX: it is each version's prefix",
            id="job-env",
        ),
        pytest.param({"tmpdir": "scratch"}, "tmpdir must be an absolute path, not 'scratch'", id="tmpdir"),
    ],
)
def test_bad_options_fail_with_one_line(capsys, eessi, host, args, message):
    result = _info(capsys, eessi, **args)

    assert_failed_with(result, message)


def test_an_option_of_the_wrong_type_fails_with_ansibles_one_line(capsys, eessi, host):
    result = _info(capsys, eessi, timeout="soon")

    assert result["failed"] is True
    assert "\n" not in result["msg"]
    assert "timeout" in result["msg"]
    assert "float" in result["msg"]


def test_an_unknown_option_fails_with_ansibles_one_line(capsys, eessi, host):
    result = _info(capsys, eessi, eessi_prefix="/cvmfs")

    assert result["failed"] is True
    assert "\n" not in result["msg"]
    assert result["msg"].startswith("Unsupported parameters for")
    assert "eessi_prefix" in result["msg"]
