"""``probe --path DIR``: what works here, and the open-004 recommendations for what does not.

``recommendations`` is a pure function of a report and gets report dicts; ``easybuild_version``
runs small scripts that print what ``eb --version`` prints; ``probe`` runs for real on a
temporary directory (as root, where bubblewrap and user namespaces work).
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors, mountinfo
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import probe

BANNER = "This is EasyBuild 5.4.0 (framework: 5.4.0, easyblocks: 5.4.0) on host node01."
# A report in which nothing needs a recommendation.
FINE = {
    "filesystem": "ext4",
    "exchange": True,
    "exchange_errno": None,
    "bwrap": True,
    "userns": True,
    "max_user_namespaces": 63936,
    "auto_backend": "bwrap",
    "easybuild_version": "5.4.2",
}
CONTRACT_KEYS = {
    "path",
    "filesystem",
    "exchange",
    "exchange_errno",
    "bwrap",
    "userns",
    "max_user_namespaces",
    "auto_backend",
    "easybuild_version",
    "recommendations",
    "changed",
}


def _eb(tmp_path, body, name="eb"):
    bin_dir = tmp_path / "eb-bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def _report(**changes):
    return dict(FINE, **changes)


# recommendations


def test_no_recommendation_when_everything_works():
    assert probe.recommendations(FINE) == []


@pytest.mark.parametrize("version", ["5.4.1", "5.4.2", "5.4.10", "5.10.0", "6.0.0"])
def test_no_easybuild_recommendation_for_the_validated_release_or_a_newer_one(version):
    assert probe.recommendations(_report(easybuild_version=version)) == []


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"bwrap": False},
            "bubblewrap: 'bwrap --dev-bind / / true' fails for this user; use the bwrap backend only "
            "where it succeeds, else the userns backend",
        ),
        (
            {"userns": False, "max_user_namespaces": 63936},
            "user namespaces: not available (user.max_user_namespaces=63936); keep it non-zero for the "
            "build account under a documented exception, or use a setuid bubblewrap that passes the "
            "probe, or accept the unsandboxed installpath fallback",
        ),
        (
            {"exchange": False, "exchange_errno": "EINVAL", "filesystem": "fuse.sshfs"},
            "directory exchange: fails with EINVAL on fuse.sshfs; publishing uses the three-rename "
            "fallback, in which the live name is briefly missing: require a filesystem where the exchange "
            "works for prefixes where that is unacceptable, else publish in a frozen release window",
        ),
        (
            {"filesystem": "nfs4"},
            "cross-node lock: nfs4 is shared; contend for the state-root lock from two build nodes, and "
            "if both acquire it, use a scheduler singleton or another measured distributed lock before "
            "deployment",
        ),
        (
            {"easybuild_version": None},
            "EasyBuild: not found; pin the pipeline to 5.4.1 (the release the integration tests "
            "validate) or a newer validated release",
        ),
        (
            {"easybuild_version": "5.4.0"},
            "EasyBuild: 5.4.0; pin the pipeline to 5.4.1 (the release the integration tests "
            "validate) or a newer validated release",
        ),
    ],
    ids=["bwrap", "userns", "exchange", "shared-filesystem", "no-easybuild", "old-easybuild"],
)
def test_each_finding_gets_its_one_line_recommendation(changes, line):
    assert probe.recommendations(_report(**changes)) == [line]


def test_user_namespaces_limited_to_zero_get_the_recommendation_even_if_the_probe_passed():
    lines = probe.recommendations(_report(max_user_namespaces=0))

    assert len(lines) == 1
    assert lines[0].startswith("user namespaces: not available (user.max_user_namespaces=0)")


UNMEASURED = [name for name, measured in probe.SHARED_FILESYSTEMS.items() if measured is None]


@pytest.mark.parametrize("filesystem", UNMEASURED)
def test_every_unmeasured_shared_filesystem_gets_the_cross_node_lock_recommendation(filesystem):
    assert probe.recommendations(_report(filesystem=filesystem)) == [
        f"cross-node lock: {filesystem} is shared; contend for the state-root lock from two build nodes, "
        "and if both acquire it, use a scheduler singleton or another measured distributed lock before "
        "deployment"
    ]


@pytest.mark.parametrize(
    ("filesystem", "measured"),
    [("fuse.glusterfs", "GlusterFS 10.3"), ("fuse.ceph-fuse", "CephFS 16.2.15 (ceph-fuse)")],
)
def test_a_measured_shared_filesystem_gets_what_was_measured(filesystem, measured):
    # What tests/integration/cluster/test_cluster_sharedfs.py measured from two nodes: both the full
    # protocol and a flock-only contender are excluded across nodes.
    assert probe.recommendations(_report(filesystem=filesystem))[0] == (
        f"cross-node lock: {filesystem} is shared; the lock was measured coherent across nodes on "
        f"{measured} (flock reaches the other nodes too, so a publisher taking only the flock (0.2.0) is "
        "excluded as well); confirm it on this site's version by contending for the state-root lock from "
        "two build nodes before deployment"
    )


def test_glusterfs_gets_the_volume_setting_other_nodes_need_to_see_a_publish():
    # What tests/integration/cluster/test_cluster_rebuild.py needs of the test cluster's volume: without
    # it a job on another client that keeps using the live path kept the old tree.
    assert probe.recommendations(_report(filesystem="fuse.glusterfs"))[1:] == [
        "renames: on GlusterFS 10.3 a job on another node that keeps using the live path kept the old "
        "tree after a publish; set performance.stat-prefetch off (or performance.md-cache-timeout 0) on "
        "the volume"
    ]


def test_cephfs_needs_no_setting_for_its_renames():
    assert len(probe.recommendations(_report(filesystem="fuse.ceph-fuse"))) == 1


def test_the_kernel_cephfs_client_is_shared_but_not_measured():
    # ceph-fuse and the kernel client keep locks in different code: one measurement is not the other's.
    assert probe.SHARED_FILESYSTEMS["ceph"] is None
    assert probe.SHARED_FILESYSTEMS["fuse.ceph-fuse"] is not None


def test_every_measurement_names_what_was_measured_and_both_lock_answers():
    measured = {name: facts for name, facts in probe.SHARED_FILESYSTEMS.items() if facts is not None}
    assert sorted(measured) == ["fuse.ceph-fuse", "fuse.glusterfs"]
    for facts in measured.values():
        assert set(facts) - {"renames"} == {"measured", "coherent", "flock"}
        assert isinstance(facts["coherent"], bool)
        assert isinstance(facts["flock"], bool)


def test_a_filesystem_measured_with_a_local_flock_says_to_drain_flock_only_publishers():
    line = probe._cross_node_lock("fuse.x", {"measured": "X 1.0", "coherent": True, "flock": False})
    assert line == (
        "cross-node lock: fuse.x is shared; the lock was measured coherent across nodes on X 1.0 (flock "
        "stays on each node, so drain publishers taking only the flock (0.2.0) first); confirm it on this "
        "site's version by contending for the state-root lock from two build nodes before deployment"
    )


def test_a_filesystem_measured_not_coherent_says_so():
    line = probe._cross_node_lock("fuse.x", {"measured": "X 1.0", "coherent": False, "flock": False})
    assert line == (
        "cross-node lock: fuse.x is shared and the lock was measured NOT coherent across nodes on X 1.0; "
        "use a scheduler singleton or another measured distributed lock"
    )


def test_several_findings_give_one_line_each_in_a_fixed_order():
    report = _report(
        bwrap=False,
        userns=False,
        max_user_namespaces=0,
        exchange=False,
        exchange_errno="EINVAL",
        filesystem="nfs",
        easybuild_version=None,
    )

    lines = probe.recommendations(report)

    prefixes = ["bubblewrap:", "user namespaces:", "directory exchange:", "cross-node lock:", "EasyBuild:"]
    assert len(lines) == len(prefixes)
    assert all(line.startswith(prefix) for line, prefix in zip(lines, prefixes))
    assert not [line for line in lines if "\n" in line]


# easybuild_version


def test_easybuild_version_parses_the_banner_of_eb_version(tmp_path):
    eb = _eb(tmp_path, f'echo "{BANNER}"\n')

    assert probe.easybuild_version(eb) == (5, 4, 0)


def test_easybuild_version_passes_version_to_eb(tmp_path):
    eb = _eb(tmp_path, f'[ "$1" = --version ] && echo "{BANNER}"\n')

    assert probe.easybuild_version(eb) == (5, 4, 0)


def test_easybuild_version_runs_eb_with_the_python_beside_it(tmp_path):
    eb = _eb(tmp_path, f'[ "$EB_PYTHON" = "$(dirname "$0")/python3" ] && echo "{BANNER}"\n')
    _eb(tmp_path, "exit 0\n", name="python3")

    assert probe.easybuild_version(eb) == (5, 4, 0)


def test_easybuild_version_of_a_failing_eb_is_none(tmp_path):
    eb = _eb(tmp_path, "echo 'ERROR: Failed to import easybuild' >&2\nexit 1\n")

    assert probe.easybuild_version(eb) is None


def test_easybuild_version_of_an_eb_without_the_banner_is_none(tmp_path):
    eb = _eb(tmp_path, "echo 'eb, but not EasyBuild'\n")

    assert probe.easybuild_version(eb) is None


def test_easybuild_version_of_a_missing_eb_is_none(tmp_path):
    assert probe.easybuild_version(str(tmp_path / "no-such-eb")) is None


def test_easybuild_version_of_a_file_that_is_not_executable_is_none(tmp_path):
    eb = _eb(tmp_path, f'echo "{BANNER}"\n')
    os.chmod(eb, 0o644)

    assert probe.easybuild_version(eb) is None


# exchange_works and max_user_namespaces


def test_the_exchange_works_on_the_test_filesystem_and_leaves_nothing(tmp_path):
    assert probe.exchange_works(str(tmp_path)) == (True, None)
    assert list(tmp_path.iterdir()) == []


def test_max_user_namespaces_is_the_kernel_s_setting():
    with open("/proc/sys/user/max_user_namespaces", encoding="utf-8") as handle:
        expected = int(handle.read())

    assert probe.max_user_namespaces() == expected


# probe


@pytest.fixture
def report(tmp_path):
    target = tmp_path / "apps"
    target.mkdir()
    eb = _eb(tmp_path, f'echo "{BANNER}"\n')
    return target, probe.probe(str(target), eb)


def test_probe_reports_every_key_of_the_contract(report):
    _target, result = report

    assert set(result) >= CONTRACT_KEYS
    assert result["changed"] is False


def test_probe_reports_the_path_and_its_filesystem(report):
    target, result = report

    assert result["path"] == str(target)
    assert result["filesystem"] == mountinfo.filesystem_of(str(target))


def test_probe_reports_a_working_exchange_and_leaves_the_directory_empty(report):
    target, result = report

    assert (result["exchange"], result["exchange_errno"]) == (True, None)
    assert list(target.iterdir()) == []


def test_probe_reports_the_sandboxes_that_work_here(report):
    _target, result = report

    assert (result["bwrap"], result["userns"], result["auto_backend"]) == (True, True, "bwrap")
    assert result["max_user_namespaces"] == probe.max_user_namespaces()


def test_probe_reports_the_easybuild_version_and_the_recommendation_it_needs(report):
    _target, result = report

    assert result["easybuild_version"] == "5.4.0"
    assert result["recommendations"] == [
        "EasyBuild: 5.4.0; pin the pipeline to 5.4.1 (the release the integration tests validate) or a "
        "newer validated release"
    ]


def test_the_validated_easybuild_is_the_one_the_project_pins():
    pins = (checkout.REPO / "requirements" / "dev.txt").read_text()
    pinned = re.search(r"^easybuild-framework==(\d+)\.(\d+)\.(\d+)", pins, re.MULTILINE)

    assert pinned is not None
    assert tuple(int(part) for part in pinned.groups()) == probe.EASYBUILD_VALIDATED


def test_probe_reports_no_easybuild_when_eb_fails(tmp_path):
    eb = _eb(tmp_path, "exit 1\n")

    result = probe.probe(str(tmp_path / "eb-bin"), eb)

    assert result["easybuild_version"] is None
    assert result["recommendations"][-1].startswith("EasyBuild: not found;")


def test_probe_of_a_relative_path_reports_it_absolute(tmp_path, monkeypatch):
    (tmp_path / "apps").mkdir()
    monkeypatch.chdir(tmp_path)

    result = probe.probe("apps", str(tmp_path / "no-such-eb"))

    assert result["path"] == str(tmp_path / "apps")


def test_probe_refuses_a_missing_directory(tmp_path):
    with pytest.raises(errors.UsageError) as caught:
        probe.probe(str(tmp_path / "missing"), str(tmp_path / "no-such-eb"))

    assert str(caught.value) == f"probe --path {tmp_path / 'missing'}: not a directory"


def test_probe_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("")

    with pytest.raises(errors.UsageError) as caught:
        probe.probe(str(tmp_path / "file"), str(tmp_path / "no-such-eb"))

    assert str(caught.value) == f"probe --path {tmp_path / 'file'}: not a directory"
