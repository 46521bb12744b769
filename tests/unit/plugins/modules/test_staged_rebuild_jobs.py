"""The staged_rebuild module's job options in-process, where no Slurm is needed: the job
options refused without ``job``, and check mode listing the jobs of a site file's targets.
Submitting, waiting and the per-target report run on the cluster
(``tests/integration/cluster/test_cluster_jobs.py``)."""

from __future__ import annotations

from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.support.module_runner import APP, assert_failed_with, run_module
from tests.support.staged import FAKE_EB


def _site_file(site, tmp_path):
    path = tmp_path / "targets.ini"
    path.write_text(
        "[target zen3]\n"
        "cpu = x86_64/amd/zen3\n"
        f"installpath = {site.installpath}\n"
        f"state-root = {site.state_root}\n"
        "constraint = zen3\n"
    )
    return path


def _args(site, **extra):
    return {
        "modules": [APP],
        "easyconfigs": [APP.replace("/", "-") + ".eb"],
        "eb": str(FAKE_EB),
        "backend": "installpath",
        "rebuild": "always",
        **extra,
    }


def test_job_options_without_job_fail_and_build_nothing(site, capsys):
    before = site.snapshot()

    for option, value in (("targets", ["zen3"]), ("job_cores", 4), ("publish", "together")):
        result = run_module(
            capsys, staged_rebuild, _args(site, installpath=str(site.installpath), **{option: value})
        )
        assert result["failed"] is True, option
        assert result["error"] == "usage", result
        assert result["msg"].startswith(option if option != "targets" else "target"), result["msg"]
    assert site.snapshot() == before
    assert not site.state_root.exists()


def test_check_mode_lists_each_target_s_job_and_the_publish_job_and_submits_nothing(site, capsys, tmp_path):
    site_file = _site_file(site, tmp_path)
    before = site.snapshot()

    result = run_module(
        capsys,
        staged_rebuild,
        _args(site, job=True, targets_file=str(site_file), targets=["all"], publish="together", job_cores=2),
        check_mode=True,
    )

    assert result["changed"] is True
    assert [(job["target"], job["publish"]) for job in result["jobs"]] == [("zen3", False), (None, True)]
    build, publish = result["jobs"]
    assert "--constraint=zen3" in build["sbatch"]
    assert "--cpus-per-task=2" in build["sbatch"]
    assert f"job-start {result['run_id']} --state-root {site.state_root}" in build["script"]
    assert "--dependency=afterok:<job of zen3>" in publish["sbatch"]
    assert site.snapshot() == before
    assert not site.state_root.exists(), "check mode queued a run"


def test_targets_with_an_installpath_fail_as_the_site_file_names_the_trees(site, capsys, tmp_path):
    site_file = _site_file(site, tmp_path)

    result = run_module(
        capsys,
        staged_rebuild,
        _args(
            site, job=True, targets_file=str(site_file), targets=["zen3"], installpath=str(site.installpath)
        ),
    )

    assert_failed_with(
        result,
        "state_root and installpath go without targets: the site file names each target's trees",
        "usage",
    )
