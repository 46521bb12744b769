"""nodeinfo: what the guard sees on a node, for each EESSI version, and its install and Lmod.

The versions are EESSI-like prefixes (``tests/support/nodeinfo.py``) and archdetect
is our stand-in, run for real; a node is simulated through ``job_env`` (``EESSI_PROC_CPUINFO``,
``EESSI_MACHINE_TYPE``, the fake nvidia-smi's compute capability). Where the report names a
target or a token, the guard's own decision for a job with the same environment is computed
beside it (``decide.decide``) and must agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import decide, decision, emit, nodeinfo
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline
from tests.support.nodeinfo import (
    BUILD,
    DIGEST,
    FIRST,
    GPU,
    HASWELL,
    ICELAKE,
    LATER,
    NONE,
    RELEASE,
    ZEN3,
    build_versions,
    install_guard,
    node_job_env,
)


@pytest.fixture(scope="module")
def eessi(tmp_path_factory):
    """An eessi_root with FIRST, LATER and NONE; version -> EessiPrefix."""
    return build_versions(tmp_path_factory.mktemp("eessi"))


@pytest.fixture
def root(eessi):
    return str(eessi[FIRST].root)


def _report(root, node, versions=None, **options):
    """``node_report`` for the simulated ``node`` (target, accel), no guard, no Lmod search."""
    options.setdefault("prefix", "/nonexistent/arch-guard")
    return nodeinfo.node_report(eessi_root=root, versions=versions, job_env=node, **options)


def _one(report, version):
    (entry,) = [entry for entry in report["eessi"] if entry["version"] == version]
    return entry


def _guard_decision(job_env, entry):
    """The guard's own decision for a job whose EESSI is ``entry``'s version, loaded for
    ``entry``'s target and accelerator (or for another CPU when there is no target)."""
    env = dict(job_env, PATH=job_env.get("PATH", nodeinfo.DEFAULT_JOB_PATH), EESSI_PREFIX=entry["prefix"])
    env["EESSI_SOFTWARE_SUBDIR"] = entry["target"] or "x86_64/amd/zen4"
    if entry["accel"]:
        env["EESSI_ACCEL_SUBDIR"] = entry["accel"]
    return decide.decide(env, emit.PROLOG, Deadline(60))


def _assert_guard_agrees(job_env, entry):
    result = _guard_decision(job_env, entry)
    if entry["problem"] is None:
        # Loaded for exactly what the report names, the guard finds nothing to repair.
        assert result.action == decision.SKIP
        assert result.detail.startswith("target already matches this node")
    else:
        assert result.action == decision.FAIL
        assert result.changes == ((decision.FAILED_MARKER, f"x86_64/amd/zen4->{entry['problem']}"),)
        assert result.detail == entry["detail"]


# the target: first candidate, a later one, none


def test_a_node_whose_first_candidate_has_software_gets_that_target(eessi, root):
    job_env = node_job_env(eessi[FIRST], ICELAKE)

    report = _report(root, job_env, [FIRST])

    entry = _one(report, FIRST)
    assert entry["cpupath"][0] == ICELAKE
    assert entry["cpupath"][-1] == "x86_64/generic"
    assert entry["target"] == ICELAKE
    assert entry["software_dir"] == str(eessi[FIRST].software_subdir_path(ICELAKE) / "software")
    assert entry["software_dir_exists"] is True
    assert (entry["problem"], entry["detail"]) == (None, None)
    assert entry["archdetect"] == str(eessi[FIRST].archdetect)
    assert entry["prefix"] == str(eessi[FIRST].prefix)
    assert entry["prefix_exists"] is True
    assert report["targets"] == {FIRST: ICELAKE}
    assert report["problems"] == {}
    assert report["changed"] is False
    _assert_guard_agrees(job_env, entry)


def test_a_node_whose_first_candidates_have_no_software_gets_a_later_one(eessi, root):
    job_env = node_job_env(eessi[LATER], ICELAKE)

    entry = _one(_report(root, job_env, [LATER]), LATER)

    assert entry["cpupath"][0] == ICELAKE
    assert entry["target"] == HASWELL
    assert entry["cpupath"].index(HASWELL) > 0
    assert entry["software_dir"] == str(eessi[LATER].software_subdir_path(HASWELL) / "software")
    assert entry["software_dir_exists"] is True
    assert entry["problem"] is None
    _assert_guard_agrees(job_env, entry)


def test_a_node_no_candidate_of_which_has_software_is_no_software_dir(eessi, root):
    job_env = node_job_env(eessi[NONE], ICELAKE)

    report = _report(root, job_env, [NONE])

    entry = _one(report, NONE)
    assert entry["target"] is None
    assert entry["accel"] is None
    assert entry["cpupath"][0] == ICELAKE
    # The directory EESSI would have wanted: the most specific candidate's.
    assert entry["software_dir"] == str(eessi[NONE].software_subdir_path(ICELAKE) / "software")
    assert entry["software_dir_exists"] is False
    assert entry["problem"] == "no-software-dir"
    assert entry["detail"] == (
        f"no software directory for any of {':'.join(entry['cpupath'])} under {eessi[NONE].prefix}"
    )
    assert report["targets"] == {NONE: None}
    assert report["problems"] == {NONE: "no-software-dir"}
    _assert_guard_agrees(job_env, entry)


def test_every_version_is_reported_with_a_summary_of_targets_and_problems(eessi, root):
    report = _report(root, node_job_env(eessi[FIRST], ICELAKE))

    assert [entry["version"] for entry in report["eessi"]] == [NONE, FIRST, LATER]
    assert report["available_versions"] == [NONE, FIRST, LATER]
    assert report["targets"] == {NONE: None, FIRST: ICELAKE, LATER: HASWELL}
    assert report["problems"] == {NONE: "no-software-dir"}
    assert report["eessi_root"] == root
    assert report["node"] == os.uname().nodename.split(".")[0]


# the accelerator


def test_a_gpu_node_reports_the_accelerator_with_its_target(eessi, root):
    job_env = node_job_env(eessi[FIRST], ICELAKE, GPU)

    entry = _one(_report(root, job_env, [FIRST]), FIRST)

    assert entry["accelpath"] == GPU
    assert (entry["target"], entry["accel"]) == (ICELAKE, GPU)
    _assert_guard_agrees(job_env, entry)


def test_a_node_without_a_gpu_has_no_accelerator(eessi, root):
    entry = _one(_report(root, node_job_env(eessi[FIRST], ZEN3), [FIRST]), FIRST)

    assert (entry["target"], entry["accelpath"], entry["accel"]) == (ZEN3, None, None)


def test_without_a_target_the_accelerator_answer_is_kept_but_the_node_has_none(eessi, root):
    entry = _one(_report(root, node_job_env(eessi[NONE], ICELAKE, GPU), [NONE]), NONE)

    assert entry["accelpath"] == GPU
    assert entry["accel"] is None
    assert entry["problem"] == "no-software-dir"


# archdetect missing, failing, answering junk, hanging


def test_a_version_that_is_not_there_is_archdetect_failed(eessi, root):
    job_env = node_job_env(eessi[FIRST], ICELAKE)

    report = _report(root, job_env, ["2099.01"])

    entry = _one(report, "2099.01")
    assert entry["prefix_exists"] is False
    assert entry["archdetect"] is None
    assert (entry["cpupath"], entry["target"], entry["software_dir"]) == (None, None, None)
    assert entry["problem"] == "archdetect-failed"
    assert entry["detail"] == f"no eessi_archdetect.sh in {root}/versions/2099.01/init/eessi_archdetect.sh"
    assert report["problems"] == {"2099.01": "archdetect-failed"}
    assert report["available_versions"] == [NONE, FIRST, LATER]
    _assert_guard_agrees(job_env, entry)


def test_a_version_without_its_archdetect_script_is_archdetect_failed(tmp_path):
    prefix = build_versions(tmp_path)[FIRST]
    prefix.archdetect.unlink()

    entry = _one(_report(str(tmp_path), node_job_env(prefix, ICELAKE), [FIRST]), FIRST)

    assert entry["prefix_exists"] is True
    assert entry["archdetect"] is None
    assert entry["problem"] == "archdetect-failed"
    assert entry["detail"].startswith("no eessi_archdetect.sh in ")


@pytest.mark.parametrize(
    ("node", "said"),
    [
        pytest.param({"EESSI_MACHINE_TYPE": "ppc64le"}, "archdetect -a cpupath exited 1", id="machine"),
        pytest.param(
            {"EESSI_PROC_CPUINFO": "/nonexistent/cpuinfo"}, "archdetect -a cpupath exited 1", id="cpuinfo"
        ),
        pytest.param(
            {"EESSI_ACCELERATOR_TARGET_OVERRIDE": "accel/bogus"}, "archdetect accelpath exited 1", id="accel"
        ),
    ],
)
def test_an_archdetect_that_fails_is_archdetect_failed_with_what_it_said(eessi, root, node, said):
    job_env = node_job_env(eessi[FIRST], ICELAKE, **node)

    entry = _one(_report(root, job_env, [FIRST]), FIRST)

    assert entry["archdetect"] == str(eessi[FIRST].archdetect)
    assert entry["problem"] == "archdetect-failed"
    assert entry["detail"].startswith(said + ": eessi_archdetect: ")
    assert entry["target"] is None
    _assert_guard_agrees(job_env, entry)


def _script(tmp_path, body):
    init = tmp_path / "init"
    init.mkdir()
    script = init / "eessi_archdetect.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    return init


@pytest.mark.parametrize(
    "cpupath", [pytest.param("echo ../../../etc", id="outside"), pytest.param("echo", id="empty")]
)
def test_an_archdetect_answer_that_is_not_a_target_is_archdetect_failed(eessi, root, tmp_path, cpupath):
    init = _script(tmp_path, f'if [ "$1" = -a ]; then {cpupath}; else exit 2; fi')
    job_env = {"EESSI_INIT_PREFIX": str(init)}

    entry = _one(_report(root, job_env, [FIRST]), FIRST)

    assert entry["archdetect"] == str(init / "eessi_archdetect.sh")
    assert entry["problem"] == "archdetect-failed"
    assert entry["detail"].startswith("archdetect -a cpupath answered ")
    _assert_guard_agrees(job_env, entry)


def test_an_archdetect_that_outlives_the_timeout_is_timeout(root, tmp_path):
    init = _script(tmp_path, "sleep 60")
    started = time.monotonic()

    entry = _one(_report(root, {"EESSI_INIT_PREFIX": str(init)}, [FIRST], timeout=0.5), FIRST)

    assert time.monotonic() - started < 20
    assert entry["problem"] == "timeout"
    assert entry["detail"] == "/bin/bash still running after 0.5 s"
    assert entry["target"] is None


def test_each_version_has_a_deadline_of_its_own(root, tmp_path):
    # Each version's two runs take 2 s: within a 3 s deadline each, not within one for both.
    init = _script(tmp_path, 'sleep 1; if [ "$1" = -a ]; then echo x86_64/intel/haswell; else exit 2; fi')

    report = _report(root, {"EESSI_INIT_PREFIX": str(init)}, [FIRST, LATER], timeout=3)

    assert report["targets"] == {FIRST: HASWELL, LATER: HASWELL}
    assert report["problems"] == {}


# versions: none, discovered, given


def test_an_eessi_root_without_versions_reports_none(tmp_path):
    report = _report(str(tmp_path / "no-cvmfs"), {})

    assert report["eessi"] == []
    assert report["available_versions"] == []
    assert report["targets"] == {}
    assert report["problems"] == {}


def test_only_version_directories_are_discovered(tmp_path):
    build_versions(tmp_path)
    (tmp_path / "versions" / "README").write_text("not a version\n")
    (tmp_path / "versions" / ".hidden").mkdir()

    assert nodeinfo.find_versions(str(tmp_path)) == [NONE, FIRST, LATER]


def test_given_versions_keep_their_order_once_each(eessi, root):
    report = _report(root, node_job_env(eessi[FIRST], ZEN3), [LATER, FIRST, LATER])

    assert [entry["version"] for entry in report["eessi"]] == [LATER, FIRST]
    assert list(report["targets"]) == [LATER, FIRST]


# the job's environment


def test_the_job_environment_is_built_not_inherited(tmp_path):
    env = nodeinfo.job_environment("/cvmfs/x", FIRST, "/local/tmp", {"EESSI_MACHINE_TYPE": "x86_64"})

    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "EESSI_PREFIX": f"/cvmfs/x/versions/{FIRST}",
        "TMPDIR": "/local/tmp",
        "EESSI_MACHINE_TYPE": "x86_64",
    }
    assert "TMPDIR" not in nodeinfo.job_environment("/cvmfs/x", FIRST, None, {})


def test_an_override_in_the_callers_environment_does_not_reach_archdetect(eessi, root, monkeypatch):
    monkeypatch.setenv("EESSI_SOFTWARE_SUBDIR_OVERRIDE", HASWELL)
    monkeypatch.setenv("EESSI_PROC_CPUINFO", "/nonexistent/cpuinfo")

    entry = _one(_report(root, node_job_env(eessi[FIRST], ZEN3), [FIRST]), FIRST)

    assert entry["target"] == ZEN3
    assert entry["problem"] is None


def test_an_override_given_in_job_env_does(eessi, root):
    job_env = node_job_env(eessi[FIRST], ZEN3, EESSI_SOFTWARE_SUBDIR_OVERRIDE=HASWELL)

    entry = _one(_report(root, job_env, [FIRST]), FIRST)

    assert entry["cpupath"][0] == HASWELL
    assert entry["target"] == HASWELL
    _assert_guard_agrees(job_env, entry)


def test_numbers_in_job_env_become_strings(eessi, root):
    job_env = dict(node_job_env(eessi[FIRST], ICELAKE), EESSI_LIKE_GPU_COMPUTE_CAP=8.0)

    entry = _one(_report(root, job_env, [FIRST]), FIRST)

    assert entry["accel"] == GPU


# the cache directory


def test_the_cache_dir_is_the_jobs_tmpdir_when_it_is_a_directory(root, tmp_path):
    report = _report(root, {}, ["2099.01"], tmpdir=str(tmp_path))

    assert report["tmpdir"] == str(tmp_path)
    assert report["cache_dir"] == str(tmp_path)


@pytest.mark.parametrize("tmpdir", [None, "", "/nonexistent/job-tmp"])
def test_the_cache_dir_is_tmp_without_a_tmpdir_directory(root, tmpdir):
    report = _report(root, {}, ["2099.01"], tmpdir=tmpdir)

    assert report["tmpdir"] == (tmpdir or None)
    assert report["cache_dir"] == "/tmp"


# the guard's install


def test_a_whole_install_is_installed_with_its_release(tmp_path):
    prefix = install_guard(tmp_path / "guard")

    guard = nodeinfo.guard_install(str(prefix))

    assert guard == {
        "prefix": str(prefix),
        "installed": True,
        "version": RELEASE["version"],
        "digest": DIGEST,
        "python": RELEASE["python"],
        "launcher": str(prefix / "bin" / "eessi-arch-guard"),
        "code": str(prefix / "lib" / "current" / "hpcstack_ops"),
        "problem": None,
    }


def test_keys_of_release_json_beyond_the_three_are_ignored(tmp_path):
    prefix = install_guard(tmp_path / "guard", {**RELEASE, "build": "0123456789abcdef"})

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is True
    assert "build" not in guard


@pytest.mark.parametrize("exists", [False, True], ids=["no-prefix", "empty-prefix"])
def test_nothing_installed_is_not_installed_without_a_problem(tmp_path, exists):
    prefix = tmp_path / "guard"
    if exists:
        prefix.mkdir()

    guard = nodeinfo.guard_install(str(prefix))

    assert guard == {
        "prefix": str(prefix),
        "installed": False,
        "version": None,
        "digest": None,
        "python": None,
        "launcher": None,
        "code": None,
        "problem": None,
    }


@pytest.mark.parametrize(
    ("release", "problem"),
    [
        pytest.param("{", "{release} is not JSON (1 bytes)", id="truncated"),
        pytest.param(b"\xff\xfe", "{release} is not JSON (2 bytes)", id="not-utf8"),
        pytest.param("[]", "{release} is not a JSON object", id="list"),
        pytest.param(
            {**RELEASE, "digest": "abc"}, "{release}: digest is not a SHA-256 in hex ('abc')", id="digest"
        ),
        pytest.param(
            {**RELEASE, "python": "python3"},
            "{release}: python is not an absolute path ('python3')",
            id="python",
        ),
        pytest.param(
            {"digest": DIGEST, "python": "/usr/bin/python3"},
            "{release}: version is not a version (None)",
            id="no-version",
        ),
        pytest.param(
            {**RELEASE, "version": 1}, "{release}: version is not a version (1)", id="version-number"
        ),
        pytest.param(None, "{release} is missing", id="missing"),
        pytest.param(" " * (64 * 1024 + 1), "{release} is larger than 65536 bytes", id="huge"),
    ],
)
def test_a_broken_release_json_is_reported_not_raised(tmp_path, release, problem):
    prefix = install_guard(tmp_path / "guard", release)

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is False
    assert guard["problem"] == problem.format(release=prefix / "release.json")
    assert (guard["version"], guard["digest"], guard["python"]) == (None, None, None)
    assert guard["launcher"] == str(prefix / "bin" / "eessi-arch-guard")


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("directory", "{release} is not a regular file"),
        # Opened without waiting for a writer: a plain open() would hang here.
        ("fifo", "{release} is not a regular file"),
        ("symlink", "{release} is a symbolic link; refusing to follow it"),
    ],
)
def test_a_release_json_that_is_not_a_regular_file_is_reported_without_waiting(tmp_path, kind, problem):
    prefix = install_guard(tmp_path / "guard", None)
    release = prefix / "release.json"
    if kind == "directory":
        release.mkdir()
    elif kind == "fifo":
        os.mkfifo(release)
    else:
        (tmp_path / "elsewhere.json").write_text(json.dumps(RELEASE))
        release.symlink_to(tmp_path / "elsewhere.json")

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is False
    assert guard["problem"] == problem.format(release=release)


def test_a_launcher_that_is_not_executable_is_a_problem(tmp_path):
    prefix = install_guard(tmp_path / "guard", launcher_mode=0o644)

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is False
    assert guard["launcher"] is None
    assert guard["version"] == RELEASE["version"]
    assert guard["problem"] == f"the launcher {prefix}/bin/eessi-arch-guard is not an executable file"


def test_missing_code_is_a_problem(tmp_path):
    prefix = install_guard(tmp_path / "guard")
    build = prefix / "lib" / BUILD
    (build / "hpcstack_ops" / "__init__.py").unlink()
    (build / "hpcstack_ops").rmdir()
    build.rmdir()

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is False
    assert guard["code"] is None
    assert guard["problem"] == f"the guard's code is not in {prefix}/lib/current/hpcstack_ops"


def test_an_interpreter_that_is_gone_is_a_problem(tmp_path):
    prefix = install_guard(tmp_path / "guard", {**RELEASE, "python": str(tmp_path / "python3.8")})

    guard = nodeinfo.guard_install(str(prefix))

    assert guard["installed"] is False
    assert guard["python"] == str(tmp_path / "python3.8")
    assert guard["problem"] == (
        f"the guard's interpreter {tmp_path}/python3.8 (from {prefix}/release.json) is not an executable file"
    )


# Lmod


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_lmod_from_the_option(tmp_path):
    lmod = _executable(tmp_path / "lmod")

    assert nodeinfo.lmod_report(str(lmod), {"LMOD_CMD": "/elsewhere"}) == {
        "cmd": str(lmod),
        "executable": True,
        "source": "option",
    }


def test_lmod_from_the_environment_even_when_it_does_not_run(tmp_path):
    report = nodeinfo.lmod_report(None, {"LMOD_CMD": str(tmp_path / "gone")})

    assert report == {"cmd": str(tmp_path / "gone"), "executable": False, "source": "environment"}


def test_lmod_that_is_not_executable_is_reported_so(tmp_path):
    lmod = tmp_path / "lmod"
    lmod.write_text("#!/bin/sh\n")

    assert nodeinfo.lmod_report(str(lmod), {})["executable"] is False


def test_lmod_is_else_the_first_executable_usual_location(tmp_path, monkeypatch):
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "lmod").write_text("not executable\n")
    found = _executable(tmp_path / "lmod" / "8.7.37" / "libexec" / "lmod")
    _executable(tmp_path / "lmod" / "8.7.40" / "libexec" / "lmod")
    monkeypatch.setattr(
        nodeinfo, "LMOD_LOCATIONS", (str(tmp_path / "first" / "lmod"), f"{tmp_path}/lmod/*/libexec/lmod")
    )

    assert nodeinfo.lmod_report(None, {}) == {"cmd": str(found), "executable": True, "source": "search"}


def test_no_lmod_anywhere_is_reported_as_none(tmp_path, monkeypatch):
    monkeypatch.setattr(nodeinfo, "LMOD_LOCATIONS", (str(tmp_path / "lmod"), f"{tmp_path}/*/libexec/lmod"))

    assert nodeinfo.lmod_report(None, {"LMOD_CMD": ""}) == {"cmd": None, "executable": False, "source": None}


# refusals


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"eessi_root": "cvmfs"}, "eessi_root must be an absolute path, not 'cvmfs'", id="root"),
        pytest.param(
            {"prefix": "opt/guard"}, "prefix must be an absolute path, not 'opt/guard'", id="prefix"
        ),
        pytest.param({"lmod_cmd": "lmod"}, "lmod_cmd must be an absolute path, not 'lmod'", id="lmod"),
        pytest.param({"tmpdir": "tmp"}, "tmpdir must be an absolute path, not 'tmp'", id="tmpdir"),
        pytest.param(
            {"versions": ["../etc"]},
            "versions: '../etc' is not the name of a directory under versions/",
            id="dotdot",
        ),
        pytest.param(
            {"versions": ["a/b"]},
            "versions: 'a/b' is not the name of a directory under versions/",
            id="slash",
        ),
        pytest.param(
            {"versions": [".."]}, "versions: '..' is not the name of a directory under versions/", id="parent"
        ),
        pytest.param({"timeout": 0}, "timeout must be more than 0 and at most 86400 seconds", id="zero"),
        pytest.param({"timeout": 86401}, "timeout must be more than 0 and at most 86400 seconds", id="day"),
        pytest.param(
            {"timeout": float("nan")}, "timeout must be more than 0 and at most 86400 seconds", id="nan"
        ),
        pytest.param(
            {"job_env": {"EESSI_PREFIX": "/x"}},
            "job_env must not set EESSI_PREFIX: it is each version's prefix",
            id="prefix-var",
        ),
        pytest.param(
            {"job_env": {"TMPDIR": "/x"}},
            "job_env must not set TMPDIR: give the job's TMPDIR as tmpdir",
            id="tmpdir-var",
        ),
        pytest.param({"job_env": {"1X": "y"}}, "job_env: '1X' is not a variable name", id="name"),
        pytest.param({"job_env": {"A": ["b"]}}, "job_env: A must be a string, not list", id="list"),
        pytest.param({"job_env": {"A": True}}, "job_env: A must be a string, not bool", id="bool"),
        pytest.param({"job_env": {"A": "b\0c"}}, "job_env: A contains a NUL byte", id="nul"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(tmp_path, options, message):
    options = {"eessi_root": str(tmp_path), **options}

    with pytest.raises(nodeinfo.NodeInfoError) as refused:
        nodeinfo.node_report(**options)

    assert str(refused.value) == message


# SIGTERM

SIGTERM_RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.arch_guard import nodeinfo
from hpcstack_ops.common.deadline import Terminated
try:
    nodeinfo.node_report(
        eessi_root=sys.argv[2], versions=["2023.06"], prefix="/nonexistent",
        job_env={"EESSI_INIT_PREFIX": sys.argv[3]},
    )
except Terminated as err:
    print("raised:", err)
"""


def _is_running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_sigterm_kills_the_running_archdetect_and_raises_terminated(package_dir, tmp_path):
    pids = tmp_path / "pids"
    init = _script(tmp_path, f"sleep 300 & echo $! > {pids}; wait")
    runner = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_RUNNER, str(package_dir), str(tmp_path / "eessi"), str(init)],
        stdout=subprocess.PIPE,
        text=True,
    )
    give_up = time.monotonic() + 60
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < give_up:
        time.sleep(0.05)

    runner.send_signal(signal.SIGTERM)
    out = runner.communicate(timeout=60)[0]

    assert out == "raised: terminated by SIGTERM\n"
    assert runner.returncode == 0
    sleeper = int(pids.read_text())
    give_up = time.monotonic() + 5
    while _is_running(sleeper) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not _is_running(sleeper)
