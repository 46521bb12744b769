"""What the role writes on a node, on real directories: the code, the switch, the launcher and
its check, removal, the kept line; a rerun that writes nothing; check mode that writes nothing;
and the launcher check, which never runs what another user could have written.

The code is this checkout's (the archive the role sends), compiled and run by /usr/bin/python3.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import stat
import tarfile

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.lookup.tree_archive import archive_bytes
from ansible_collections.hpcstack.ops.plugins.lookup.tree_digest import digest_files, list_tree
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import installed
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import install, plan, slurmconf

PYTHON = "/usr/bin/python3"
CODE_DIRS = ["plugins/module_utils/common", "plugins/module_utils/arch_guard"]
OTHER_UID = 65534


@pytest.fixture(scope="module")
def code():
    files = list_tree(str(checkout.REPO), [*CODE_DIRS, "plugins/module_utils/__init__.py"])
    data = archive_bytes(str(checkout.REPO), files, {"plugins/module_utils": installed.PACKAGE})
    digest = digest_files(str(checkout.REPO), list_tree(str(checkout.REPO), CODE_DIRS))
    return base64.b64encode(data).decode(), installed.release_record("0.1.0", digest, PYTHON)


def _launcher(prefix, **overrides):
    return plan.launcher_text(
        plan.Settings(dict({"prefix": str(prefix), "timeout": 60}, **overrides)), PYTHON
    )


def _install(prefix, code, **launcher):
    archive, release = code
    return [
        install.install_code(str(prefix), release["build"], archive, PYTHON),
        install.switch(str(prefix), release["build"], release),
        install.write_launcher(str(prefix), launcher=_launcher(prefix, **launcher), python=PYTHON),
    ]


def _tree(prefix):
    return {
        str(path.relative_to(prefix)): (stat.S_IMODE(path.lstat().st_mode), path.lstat().st_uid)
        for path in sorted(prefix.rglob("*"))
    }


def test_an_install_writes_the_code_the_launcher_and_the_release_and_a_rerun_writes_nothing(tmp_path, code):
    prefix = tmp_path / "opt" / "arch-guard"
    _archive, release = code

    first = _install(prefix, code)
    tree = _tree(prefix)
    again = _install(prefix, code)

    assert [result["changed"] for result in first] == [True, True, True]
    assert [result["changed"] for result in again] == [False, False, False], again
    assert _tree(prefix) == tree
    assert os.readlink(prefix / "lib" / "current") == release["build"]
    assert json.loads((prefix / "release.json").read_text()) == release
    assert (prefix / "bin" / "eessi-arch-guard").read_text() == _launcher(prefix)
    assert not (prefix / "bin" / "task-prolog").exists()
    modes = {stat.S_IMODE((prefix / name).stat().st_mode) for name in ("", "bin", "lib", "lib/current")}
    assert modes == {0o755}
    assert all(uid == 0 for _mode, uid in tree.values())
    assert all(mode & 0o022 == 0 for name, (mode, _uid) in tree.items() if name != "lib/current")
    assert list(
        (prefix / "lib" / "current" / "hpcstack_ops" / "arch_guard" / "__pycache__").glob("launcher.*.pyc")
    )


def test_a_new_build_is_switched_in_and_the_one_before_it_kept(tmp_path, code):
    prefix = tmp_path / "arch-guard"
    archive, release = code
    _install(prefix, code)
    (prefix / "lib" / "0123456789abcdef").mkdir()  # a build two releases back
    later = dict(release, build="fedcba9876543210")

    install.install_code(str(prefix), later["build"], archive, PYTHON)
    switched = install.switch(str(prefix), later["build"], later)

    assert os.readlink(prefix / "lib" / "current") == later["build"]
    assert sorted(os.listdir(prefix / "lib")) == sorted([release["build"], later["build"], "current"])
    assert (
        f"switched {prefix}/lib/current to {later['build']} (was {release['build']})" in switched["actions"]
    )


def test_check_mode_says_what_it_would_write_and_writes_nothing(tmp_path, code):
    archive, release = code
    prefix = tmp_path / "site" / "arch-guard"

    results = [
        install.install_code(str(prefix), release["build"], archive, PYTHON, dry_run=True),
        install.switch(str(prefix), release["build"], release, dry_run=True),
        install.write_launcher(
            str(prefix), launcher=_launcher(prefix), python=PYTHON, dry_run=True, diff=True
        ),
        install.keep_line(str(tmp_path / "state"), "/etc/slurm/slurm.conf", None, dry_run=True),
    ]

    assert all(result["changed"] for result in results)
    assert results[2]["diff"][0]["after"] == _launcher(prefix)
    assert os.listdir(tmp_path) == []


def test_the_wrapper_is_written_with_a_prolog_to_chain_and_removed_without_one(tmp_path, code):
    prefix = tmp_path / "arch-guard"
    _install(prefix, code)
    wrapper = plan.wrapper_text(plan.Settings({"prefix": str(prefix)}), "/etc/slurm/prolog.sh")

    chained = install.write_wrapper(str(prefix), wrapper=wrapper)
    same = install.write_wrapper(str(prefix), wrapper=wrapper)
    (prefix / "bin" / "task-prolog").unlink()
    os.mkfifo(prefix / "bin" / "task-prolog")  # a FIFO where it was: never read, replaced
    again = install.write_wrapper(str(prefix), wrapper=wrapper)
    mode = stat.S_IMODE((prefix / "bin" / "task-prolog").stat().st_mode)
    unchained = install.write_wrapper(str(prefix), wrapper=None)
    none = install.write_wrapper(str(prefix), wrapper=None)

    assert chained["actions"] == [f"wrote {prefix}/bin/task-prolog"]
    assert same == {"changed": False, "actions": [], "diff": []}
    assert again["actions"] == [f"wrote {prefix}/bin/task-prolog"]
    assert mode == 0o755
    assert unchained["actions"] == [f"removed {prefix}/bin/task-prolog, since there is nothing to chain"]
    assert none["changed"] is False
    assert not os.path.lexists(prefix / "bin" / "task-prolog")


def test_a_wrapper_in_check_mode_is_said_and_not_written(tmp_path):
    prefix = tmp_path / "arch-guard"
    wrapper = plan.wrapper_text(plan.Settings({"prefix": str(prefix)}), "/etc/slurm/prolog.sh")

    result = install.write_wrapper(str(prefix), wrapper=wrapper, dry_run=True, diff=True)

    assert result["actions"][-1] == f"would write {prefix}/bin/task-prolog"
    assert result["diff"] == [
        {
            "before": "",
            "after": wrapper,
            "before_header": f"{prefix}/bin/task-prolog",
            "after_header": f"{prefix}/bin/task-prolog",
        }
    ]
    assert not os.path.lexists(prefix)


def test_a_launcher_changed_by_hand_and_a_group_writable_bin_are_put_back(tmp_path, code):
    prefix = tmp_path / "arch-guard"
    _install(prefix, code)
    with (prefix / "bin" / "eessi-arch-guard").open("a") as handle:
        handle.write("# changed by hand\n")
    (prefix / "bin").chmod(0o775)

    result = install.write_launcher(str(prefix), launcher=_launcher(prefix), python=PYTHON)

    assert result["actions"] == [
        f"set {prefix}/bin to root's, mode 0755",
        f"wrote {prefix}/bin/eessi-arch-guard",
    ]
    assert (prefix / "bin" / "eessi-arch-guard").read_text() == _launcher(prefix)


def _marking_launcher(path, marker, uid=0, mode=0o755):
    """A launcher that leaves ``marker`` when it runs: run, it would run as root."""
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(mode)
    os.chown(path, uid, uid)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("uid", "mode", "why"),
    [
        (OTHER_UID, 0o755, f"belongs to uid {OTHER_UID}; refusing to run it as root"),
        (0, 0o775, "is writable by group or others (mode 0775); refusing to run it as root"),
        (0, 0o757, "is writable by group or others (mode 0757); refusing to run it as root"),
    ],
)
def test_the_launcher_check_never_runs_a_file_another_user_could_have_written(tmp_path, uid, mode, why):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ran"
    content = _marking_launcher(bin_dir / "eessi-arch-guard", marker, uid, mode)

    with install.dirfd.Directory.open(bin_dir) as held, pytest.raises(install.trust.Untrusted) as refused:
        install.run_launcher(held, content, PYTHON)

    assert str(refused.value) == f"arch_guard: {bin_dir}/eessi-arch-guard {why}"
    assert not marker.exists()


def test_the_launcher_check_runs_only_the_bytes_it_wrote(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ran"
    _marking_launcher(bin_dir / "eessi-arch-guard", marker)

    with install.dirfd.Directory.open(bin_dir) as held, pytest.raises(install.InstallError) as refused:
        install.run_launcher(held, b"#!/bin/sh\nexit 0\n", PYTHON)

    assert "changed while it was checked; refusing to run it" in str(refused.value)
    assert not marker.exists()


def test_the_launcher_check_refuses_an_interpreter_others_could_have_written(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "python3").symlink_to(PYTHON)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ran"
    content = _marking_launcher(bin_dir / "eessi-arch-guard", marker)

    with install.dirfd.Directory.open(bin_dir) as held, pytest.raises(install.InstallError) as refused:
        install.run_launcher(held, content, str(shared / "python3"))

    assert f"the interpreter {shared}/python3 is in {shared}, which is writable by group or others" in str(
        refused.value
    )
    assert not marker.exists()


def test_a_launcher_that_cannot_load_the_guard_fails_the_check(tmp_path, code):
    prefix = tmp_path / "arch-guard"
    _install(prefix, code)
    os.unlink(prefix / "lib" / "current")

    with pytest.raises(install.InstallError) as failed:
        install.write_launcher(str(prefix), launcher=_launcher(prefix), python=PYTHON)

    assert str(failed.value).startswith(
        f"arch_guard: the launcher {prefix}/bin/eessi-arch-guard does not run the guard"
    )
    assert "cannot load the guard (ModuleNotFoundError)" in str(failed.value)


def test_removal_takes_the_whole_prefix_and_nothing_else(tmp_path, code):
    prefix = tmp_path / "arch-guard"
    _install(prefix, code)
    (tmp_path / "beside").mkdir()

    checked = install.remove(str(prefix), dry_run=True)
    removed = install.remove(str(prefix))
    again = install.remove(str(prefix))

    assert checked["changed"] is True
    assert removed["actions"] == [f"removed {prefix}"]
    assert again["changed"] is False
    assert os.listdir(tmp_path) == ["beside"]


def test_the_kept_line_is_written_root_s_0600_in_a_0700_directory_and_forgotten(tmp_path):
    state = tmp_path / "var" / "state"
    line = 'TaskProlog = "/etc/slurm/prolog.sh" # the site\'s'

    kept = install.keep_line(str(state), "/etc/slurm/slurm.conf", line)
    same = install.keep_line(str(state), "/etc/slurm/slurm.conf", line)
    state.chmod(0o755)
    mode_back = install.keep_line(str(state), "/etc/slurm/slurm.conf", line)
    text = (state / slurmconf.KEPT_FILE).read_text()
    mode = stat.S_IMODE((state / slurmconf.KEPT_FILE).stat().st_mode)
    forgotten = install.forget_line(str(state))

    assert kept["changed"] is True
    assert same["changed"] is False
    assert mode_back["actions"] == [f"set {state} to root's, mode 0700"]
    assert slurmconf.parse_kept(text) == {"slurm_conf": "/etc/slurm/slurm.conf", "line": line}
    assert (mode, stat.S_IMODE(state.stat().st_mode)) == (0o600, 0o700)
    assert forgotten["actions"] == [f"removed {state}/{slurmconf.KEPT_FILE}"]
    assert not (state / slurmconf.KEPT_FILE).exists()


def test_a_code_archive_that_leaves_its_directory_is_refused(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("../escaped.py")
        archive.addfile(member, io.BytesIO(b""))
    prefix = tmp_path / "arch-guard"

    with pytest.raises(install.InstallError, match=re.escape("the code's archive names '../escaped.py'")):
        install.install_code(str(prefix), "0" * 16, base64.b64encode(buffer.getvalue()).decode(), PYTHON)

    assert not (tmp_path / "escaped.py").exists()
    assert not (prefix / "lib" / "escaped.py").exists()
