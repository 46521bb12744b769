"""The survey on real files: what it reports of the prefix, the release, the state directory,
slurm.conf and the interpreters, and what it refuses to wait on or to start."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import slurmconf, slurmd, survey
from tests.support.nodeinfo import RELEASE, install_guard

CONF = "ClusterName=test\nTaskProlog = {site}  # ours\n"


def _site(tmp_path):
    site = tmp_path / "site" / "prolog.sh"
    site.parent.mkdir()
    site.write_text("#!/bin/sh\n")
    site.chmod(0o755)
    return site


def test_the_prefix_its_files_and_the_release_are_reported(tmp_path):
    prefix = install_guard(tmp_path / "guard", dict(RELEASE, build="fedcba9876543210"))

    found = survey.survey(prefix=str(prefix))

    assert found["parents"][-1] == {
        "path": str(prefix),
        "type": "directory",
        "uid": 0,
        "gid": 0,
        "mode": 0o755,
    }
    assert [seen["path"] for seen in found["parents"]][:2] == ["/", "/tmp"]
    launcher = prefix / "bin" / "eessi-arch-guard"
    assert found["guard"][str(launcher)]["sha256"] == hashlib.sha256(launcher.read_bytes()).hexdigest()
    assert set(found["guard"]) == {str(prefix), str(prefix / "bin"), str(prefix / "lib"), str(launcher)}
    assert found["release"] == dict(RELEASE, build="fedcba9876543210")
    assert found["release_problem"] is None


@pytest.mark.parametrize(
    ("kind", "problem"),
    [("fifo", "{path} is not a regular file"), ("garbage", "{path} is not JSON (3 bytes)")],
)
def test_a_release_json_that_cannot_be_used_is_a_problem_not_a_hang(tmp_path, kind, problem):
    prefix = install_guard(tmp_path / "guard", None)
    path = prefix / "release.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("{x:")

    found = survey.survey(prefix=str(prefix))

    assert (found["release"], found["release_problem"]) == (None, problem.format(path=path))


def test_a_prefix_not_there_yet_reports_the_directories_that_are(tmp_path):
    found = survey.survey(prefix=str(tmp_path / "missing" / "arch-guard"))

    assert found["parents"][-1]["path"] == str(tmp_path)
    assert (found["guard"], found["release"]) == ({}, None)


def test_the_kept_line_and_the_state_directory_are_reported(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    site = _site(tmp_path)
    line = f"TaskProlog={site}"
    (state / slurmconf.KEPT_FILE).write_text(slurmconf.kept_text("/etc/slurm/slurm.conf", line))

    found = survey.survey(state_dir=str(state))

    assert found["state"]["stat"] == {
        "path": str(state),
        "type": "directory",
        "uid": 0,
        "gid": 0,
        "mode": 0o700,
    }
    assert found["state"]["parents"][-1]["path"] == str(tmp_path)
    assert found["state"]["kept"] == {
        "slurm_conf": "/etc/slurm/slurm.conf",
        "line": line,
        "text": slurmconf.kept_text("/etc/slurm/slurm.conf", line),
    }
    # The TaskProlog the kept line names is looked at, for the chain's check.
    assert found["prologs"][str(site)]["type"] == "file"


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("fifo", "{path} is not a regular file"),
        ("symlink", "{path} is a symbolic link; refusing to follow it"),
        ("other", "{path} is not a TaskProlog line the role kept"),
    ],
)
def test_a_kept_file_that_cannot_be_used_is_a_problem(tmp_path, kind, problem):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / slurmconf.KEPT_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text(slurmconf.kept_text("/x", None))
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("[1]\n")

    found = survey.survey(state_dir=str(state))

    assert (found["state"]["kept"], found["state"]["problem"]) == (None, problem.format(path=path))


@pytest.mark.parametrize("configless_pids", [[], [4242]])
def test_slurm_conf_its_task_prolog_lines_and_its_identity_are_reported(
    tmp_path, monkeypatch, configless_pids
):
    # Which slurmd processes count is test_slurmd.py's, on real processes; here the machine's
    # own (another test's configless slurmd, started at any moment) would decide the answer.
    asked = []
    monkeypatch.setattr(slurmd, "configless_pids", lambda user: asked.append(user) or configless_pids)
    site = _site(tmp_path)
    real = tmp_path / "shared" / "slurm.conf"
    real.parent.mkdir()
    real.write_text(CONF.format(site=site))
    conf = tmp_path / "slurm.conf"
    conf.symlink_to(real)  # sites link it to shared storage: followed

    found = survey.survey(slurm_conf=str(conf))["slurm_conf"]

    assert found["problem"] is None
    assert found["task_prolog"] == [{"text": f"TaskProlog = {site}  # ours", "terminated": True}]
    identity = found["identity"]
    info = real.stat()
    assert (identity["ino"], identity["dev"]) == (
        info.st_ino,
        f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}",
    )
    assert identity["sha256"] == hashlib.sha256(real.read_bytes()).hexdigest()
    assert all(identity[name] for name in ("fstype", "source", "boot_id"))
    assert (identity["configless"], asked) == (bool(configless_pids), [found["slurmd_user"]])


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("missing", "file not found: {path}"),
        ("fifo", "not a regular file: {path}"),
        ("dir", "not a regular file: {path}"),
    ],
)
def test_a_slurm_conf_that_cannot_be_read_is_a_problem_not_a_hang(tmp_path, kind, problem):
    conf = tmp_path / "slurm.conf"
    if kind == "fifo":
        os.mkfifo(conf)
    elif kind == "dir":
        conf.mkdir()

    found = survey.survey(slurm_conf=str(conf))["slurm_conf"]

    assert found["problem"] == problem.format(path=conf)
    assert (found["task_prolog"], found["identity"]["sha256"]) == ([], None)


@pytest.mark.parametrize("kind", ["missing", "a directory", "not executable"])
def test_the_task_prolog_slurm_conf_names_is_looked_at_as_it_is(tmp_path, kind):
    """What the plan refuses a TaskProlog to chain from (test_plan.py: chain-missing,
    chain-a-directory, chain-not-executable-for-all)."""
    site = tmp_path / "site" / "prolog.sh"
    if kind == "a directory":
        site.mkdir(parents=True)
        site.chmod(0o755)
    elif kind == "not executable":
        site.parent.mkdir()
        site.write_text("#!/bin/sh\n")
        site.chmod(0o644)
    conf = tmp_path / "slurm.conf"
    conf.write_text(f'TaskProlog = "{site}"   # the site\'s own\n')

    found = survey.survey(slurm_conf=str(conf))["prologs"]

    if kind == "missing":
        assert found == {str(site): None}
    else:
        assert found[str(site)]["type"] == ("directory" if kind == "a directory" else "file")
        assert found[str(site)]["mode"] == (0o755 if kind == "a directory" else 0o644)


def test_interpreters_are_started_up_to_the_first_suitable_one(tmp_path):
    found = survey.survey(python=[str(tmp_path / "none"), "/usr/bin/python3", "/usr/bin/python3.11"])[
        "python"
    ]

    assert [probe["path"] for probe in found] == [str(tmp_path / "none"), "/usr/bin/python3"]
    assert (found[0]["version"], found[0]["problem"]) == (None, "does not run")
    assert survey.suitable(found[1]["version"])


def test_an_interpreter_another_user_could_have_written_is_not_started(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    marker = tmp_path / "ran"
    planted = shared / "python3"
    planted.write_text(f"#!/bin/sh\ntouch {marker}\necho 3.12.0\n")
    planted.chmod(0o755)

    [found] = survey.survey(python=[str(planted)])["python"]

    assert found["version"] is None
    assert (
        found["problem"]
        == f"not started: it is in {shared}, which is writable by group or others (mode 0777)"
    )
    assert not marker.exists()


def _scontrol(tmp_path, script, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    scontrol = folder / "scontrol"
    scontrol.write_text(script)
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")


def test_the_nodes_slurm_lists_for_the_configuration(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    _scontrol(
        tmp_path,
        '#!/bin/sh\necho "NodeName=c1 Arch=x"\necho "NodeName=c2 CONF=$SLURM_CONF"\n',
        monkeypatch,
    )

    found = survey.survey(slurm_conf=str(conf), slurm_nodes=True)

    assert found["nodes"] == ["c1", "c2"]


def test_a_failing_scontrol_fails_the_survey_with_its_message(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    _scontrol(
        tmp_path,
        "#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n",
        monkeypatch,
    )

    with pytest.raises(survey.SurveyError) as failed:
        survey.survey(slurm_conf=str(conf), slurm_nodes=True)

    assert str(failed.value) == (
        "arch_guard: scontrol show nodes failed: slurm_load_node error: Unable to contact slurm controller"
    )


def test_the_module_s_facts_are_plain_json(tmp_path):
    site = _site(tmp_path)
    conf = tmp_path / "slurm.conf"
    conf.write_bytes(CONF.format(site=site).encode() + b"# \xff not UTF-8\n")

    found = survey.survey(
        prefix=str(tmp_path / "guard"), state_dir=str(tmp_path / "state"), slurm_conf=str(conf), python=[]
    )

    assert json.loads(json.dumps(found)) == found
