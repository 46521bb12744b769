"""The userns backend's sandbox, entered for real by a child process.

Each case runs ``sandbox.enter(spec)`` in a fresh Python child (``python -c``, the code of this
checkout through a symlinked ``hpcstack_ops`` package), as root and, through ``setpriv``, as the
unprivileged test user: the child then tries what EasyBuild would do and prints what happened
as JSON. The test process itself never enters a namespace, so what it sees afterwards is what
the host sees. These stay unit tests (they need no EasyBuild, only the kernel).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import mountinfo
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import sandbox
from tests.support.mountns import in_private_mounts
from tests.support.staged import snapshot

CHILD_TIMEOUT = 120
# argv: the spec, then [[name, action, path], ...]. Prints {"error"} or {"uid", "gid", "results"}.
CHILD = r"""
import errno, json, os, sys
from hpcstack_ops.staged_rebuild import sandbox

def attempt(action, path):
    try:
        if action == "create":
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return "ok"
        if action == "read":
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        if action == "readlink":
            return os.readlink(path)
        if action == "listdir":
            return sorted(os.listdir(path))
        if action == "rmdir":
            os.rmdir(path)
            return "ok"
        if action == "mkdir":
            os.mkdir(path)
            return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
    raise ValueError(action)

spec, actions = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    sandbox.enter(spec)
except sandbox.SandboxError as err:
    print(json.dumps({"error": str(err)}))
    raise SystemExit(0)
results = {name: attempt(action, path) for name, action, path in actions}
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "results": results}))
"""


def _base(user=None):
    base = Path(tempfile.mkdtemp(prefix="hpcstack-sandbox-"))
    if user is not None:
        os.chown(base, user.uid, user.gid)
    return base


def _chown_tree(root, user):
    for directory, dirs, files in os.walk(root):
        os.chown(directory, user.uid, user.gid)
        for name in dirs + files:
            os.chown(os.path.join(directory, name), user.uid, user.gid, follow_symlinks=False)


def _enter(package_dir, spec, actions=(), user=None, wrap=()):
    """Run the child (as ``user`` when given, inside ``wrap`` when given); return its report."""
    argv = [sys.executable, "-c", CHILD, json.dumps(spec), json.dumps(list(actions))]
    env = dict(user.env() if user else os.environ, PYTHONPATH=str(package_dir))
    done = subprocess.run(
        [*wrap, *(user.command(argv) if user else argv)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Site:
    """A live install path with Tiny/1.0 (to rebuild), Tiny/2.0, a file and a link beside it."""

    def __init__(self, base):
        self.software = base / "apps" / "software"
        self.modules = base / "apps" / "modules"
        self.tiny = self.software / "Tiny"
        for version in ("1.0", "2.0"):
            (self.tiny / version).mkdir(parents=True)
            (self.tiny / version / "PAYLOAD").write_text(f"live {version}\n")
        (self.tiny / "README").write_text("readme\n")
        (self.tiny / "default").symlink_to("2.0")
        (self.software / "Other" / "1.0").mkdir(parents=True)
        (self.software / "Other" / "1.0" / "PAYLOAD").write_text("other\n")
        (self.modules / "all" / "Tiny").mkdir(parents=True)
        (self.modules / "all" / "Tiny" / "1.0.lua").write_text("-- Tiny 1.0\n")
        self.generation = self.software / ".eb-staged-rebuild" / "run1"
        (self.generation / "modules").mkdir(parents=True)
        self.view = self.generation / "software" / "Tiny"

    def spec(self):
        siblings = sandbox.make_view(str(self.tiny), str(self.view), ["1.0"])
        return {
            "read_only": [str(self.software), str(self.modules)],
            "writable": [str(self.generation)],
            "views": [[str(self.view), str(self.tiny), siblings]],
            "probe": [str(self.software), str(self.modules)],
        }

    def live_state(self):
        return snapshot(self.tiny, self.software / "Other", self.modules)


def _actions(site):
    tiny = site.tiny
    return [
        ("software", "create", str(site.software / "Other" / "1.0" / "NEW")),
        ("software_top", "create", str(site.software / "NEW")),
        ("modules", "create", str(site.modules / "all" / "Tiny" / "NEW.lua")),
        ("generation", "create", str(site.generation / "NEW")),
        ("stage_before", "listdir", str(tiny / "1.0")),
        # EasyBuild's --rebuild removes the install directory, makes it again and installs.
        ("stage_rmdir", "rmdir", str(tiny / "1.0")),
        ("stage_mkdir", "mkdir", str(tiny / "1.0")),
        ("stage_write", "create", str(tiny / "1.0" / "NEW")),
        ("stage_after", "listdir", str(tiny / "1.0")),
        ("sibling_write", "create", str(tiny / "2.0" / "NEW")),
        ("sibling_read", "read", str(tiny / "2.0" / "PAYLOAD")),
        ("sibling_file_write", "create", str(tiny / "README" / "NEW")),
        ("sibling_file_read", "read", str(tiny / "README")),
        ("sibling_link", "readlink", str(tiny / "default")),
        ("sibling_link_read", "read", str(tiny / "default" / "PAYLOAD")),
        ("name_listing", "listdir", str(tiny)),
    ]


@pytest.fixture(scope="module", params=["root", "build-user"])
def sandboxed(request, package_dir, unprivileged_user):
    """One child's run in the sandbox of Tiny/1.0, with the state outside before and after."""
    user = unprivileged_user if request.param == "build-user" else None
    base = _base(user)
    site = Site(base)
    spec = site.spec()
    if user is not None:
        _chown_tree(base, user)
    live_before, mounts_before = site.live_state(), mountinfo.mount_points_under(str(base))
    report = _enter(package_dir, spec, _actions(site), user=user)
    yield {
        "site": site,
        "report": report,
        "uid": user.uid if user else 0,
        "live_before": live_before,
        "live_after": site.live_state(),
        "mounts_before": mounts_before,
        "mounts_after": mountinfo.mount_points_under(str(base)),
    }
    shutil.rmtree(base)


def _results(sandboxed):
    report = sandboxed["report"]
    assert "error" not in report, report["error"]
    return report["results"]


# inside the sandbox


def test_the_live_software_tree_is_read_only_inside(sandboxed):
    results = _results(sandboxed)

    assert results["software"] == "EROFS"
    assert results["software_top"] == "EROFS"


def test_the_live_module_tree_is_read_only_inside(sandboxed):
    assert _results(sandboxed)["modules"] == "EROFS"


def test_the_generation_accepts_writes_inside(sandboxed):
    assert _results(sandboxed)["generation"] == "ok"
    assert (sandboxed["site"].generation / "NEW").exists()


def test_the_stage_is_at_the_live_name_version_path_inside(sandboxed):
    results = _results(sandboxed)

    assert results["stage_before"] == []  # not the live install's PAYLOAD
    assert results["stage_write"] == "ok"
    assert results["stage_after"] == ["NEW"]


def test_what_is_written_at_the_live_path_inside_lands_in_the_stage(sandboxed):
    site = sandboxed["site"]
    _results(sandboxed)

    assert sorted(os.listdir(site.view / "1.0")) == ["NEW"]
    assert sorted(os.listdir(site.tiny / "1.0")) == ["PAYLOAD"]


def test_the_stage_at_the_live_path_can_be_removed_and_made_again_inside(sandboxed):
    results = _results(sandboxed)

    assert results["stage_rmdir"] == "ok"  # not EBUSY: the stage is no mount point
    assert results["stage_mkdir"] == "ok"


def test_the_siblings_of_the_stage_are_the_live_ones_and_read_only_inside(sandboxed):
    results = _results(sandboxed)

    assert results["sibling_read"] == "live 2.0\n"
    assert results["sibling_write"] == "EROFS"
    assert results["sibling_file_read"] == "readme\n"
    assert results["sibling_file_write"] in ("ENOTDIR", "EROFS")
    assert results["sibling_link"] == "2.0"
    assert results["sibling_link_read"] == "live 2.0\n"
    assert results["name_listing"] == ["1.0", "2.0", "README", "default"]


def test_the_build_runs_as_the_user_that_started_it(sandboxed):
    assert sandboxed["report"]["uid"] == sandboxed["uid"]
    assert _results(sandboxed)


# outside, after the child exited


def test_nothing_is_mounted_outside_after_the_child_exits(sandboxed):
    assert sandboxed["mounts_before"] == []
    assert sandboxed["mounts_after"] == []


def test_the_live_tree_is_unchanged_after_the_child_exits(sandboxed):
    assert sandboxed["live_after"] == sandboxed["live_before"]


# mounts below a read-only root, and the failures of enter


def _mount_tmpfs_then(path, options="mode=0777"):
    """A wrapper: a private mount namespace with a tmpfs at ``path``, then the child."""
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    return in_private_mounts(script, options, str(path))


@pytest.mark.parametrize("who", ["root", "build-user"])
def test_a_mount_below_a_read_only_root_is_read_only_too(package_dir, unprivileged_user, who):
    # nosuid,nodev,noexec are locked for a user namespace: the remount has to repeat them.
    user = unprivileged_user if who == "build-user" else None
    base = _base(user)
    try:
        site = Site(base)
        (site.software / "Sub").mkdir()
        spec = {"read_only": [str(site.software)], "writable": [], "views": [], "probe": [str(site.software)]}
        if user is not None:
            _chown_tree(base, user)
        actions = [("sub", "create", str(site.software / "Sub" / "NEW"))]

        report = _enter(
            package_dir,
            spec,
            actions,
            user=user,
            wrap=_mount_tmpfs_then(site.software / "Sub", "nosuid,nodev,noexec,mode=0777"),
        )

        assert report.get("results") == {"sub": "EROFS"}, report
    finally:
        shutil.rmtree(base)


def test_a_read_only_root_reached_through_a_symlink_is_read_only(package_dir, tmp_path):
    # An install path below a symlink (/apps -> /gpfs/apps) passes the symlink checks, which
    # stop at the software root.
    site = Site(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    linked_software = tmp_path / "link" / "apps" / "software"
    spec = {"read_only": [str(linked_software)], "writable": [], "views": [], "probe": [str(linked_software)]}
    actions = [("software", "create", str(linked_software / "Other" / "NEW"))]

    report = _enter(package_dir, spec, actions)

    assert report.get("results") == {"software": "EROFS"}, report
    assert not (site.software / "Other" / "NEW").exists()


def test_enter_refuses_a_probe_path_that_stays_writable(package_dir, tmp_path):
    site = Site(tmp_path)
    spec = {"read_only": [str(site.modules)], "writable": [], "views": [], "probe": [str(site.software)]}

    report = _enter(package_dir, spec)

    assert report == {"error": f"{site.software} is writable inside the sandbox"}
    assert sorted(os.listdir(site.software)) == [".eb-staged-rebuild", "Other", "Tiny"]  # probe file removed


def test_enter_reports_a_read_only_root_that_does_not_exist(package_dir, tmp_path):
    missing = tmp_path / "missing"
    spec = {"read_only": [str(missing)], "writable": [], "views": [], "probe": []}

    report = _enter(package_dir, spec)

    assert report == {"error": f"mount {missing} {missing}: {os.strerror(errno.ENOENT)}"}


def test_enter_reports_a_view_whose_placeholder_is_missing(package_dir, tmp_path):
    site = Site(tmp_path)
    spec = site.spec()
    os.rmdir(site.view / "2.0")

    report = _enter(package_dir, spec)

    assert report["error"].startswith(f"mount {site.tiny / '2.0'} {site.view / '2.0'}: ")


def test_enter_as_the_build_user_on_a_tree_it_cannot_read_is_reported_not_run(
    package_dir,
    unprivileged_user,
    tmp_path,
):
    # tmp_path is root's and private: the user cannot even reach it.
    site = Site(tmp_path)
    spec = {"read_only": [str(site.software)], "writable": [], "views": [], "probe": [str(site.software)]}

    report = _enter(
        package_dir, spec, [("software", "create", str(site.software / "NEW"))], user=unprivileged_user
    )

    assert set(report) == {"error"}
    assert report["error"].startswith(f"mount {site.software} {site.software}: ")


# require_read_only, in this process


def test_require_read_only_raises_when_the_path_is_writable(tmp_path):
    with pytest.raises(sandbox.SandboxError) as caught:
        sandbox.require_read_only(str(tmp_path))

    assert str(caught.value) == f"{tmp_path} is writable inside the sandbox"
    assert list(tmp_path.iterdir()) == []  # the probe file is removed again


def test_require_read_only_names_an_error_that_is_not_erofs(tmp_path):
    with pytest.raises(sandbox.SandboxError) as caught:
        sandbox.require_read_only(str(tmp_path / "missing"))

    assert str(caught.value) == f"probe write in {tmp_path / 'missing'} failed with ENOENT, not EROFS"


def test_require_read_only_passes_where_writes_fail_with_erofs(package_dir, tmp_path):
    (tmp_path / "ro").mkdir()
    spec = {"read_only": [str(tmp_path / "ro")], "writable": [], "views": [], "probe": [str(tmp_path / "ro")]}

    report = _enter(package_dir, spec, [("write", "create", str(tmp_path / "ro" / "NEW"))])

    assert report.get("results") == {"write": "EROFS"}, report


# make_view


def _live_name_dir(tmp_path):
    live = tmp_path / "software" / "Tiny"
    for version in ("1.0", "2.0"):
        (live / version).mkdir(parents=True)
        (live / version / "PAYLOAD").write_text(version)
    (live / "README").write_text("readme\n")
    (live / "default").symlink_to("2.0")
    os.mkfifo(live / "control")
    return live


def test_make_view_gives_each_staged_version_an_empty_directory(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    sandbox.make_view(str(live), str(view), ["1.0"])

    assert (view / "1.0").is_dir()
    assert list((view / "1.0").iterdir()) == []


def test_make_view_returns_the_siblings_that_need_a_bind_mount(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    siblings = sandbox.make_view(str(live), str(view), ["1.0"])

    assert siblings == ["2.0", "README"]


def test_make_view_makes_an_empty_directory_for_a_directory_and_an_empty_file_for_a_file(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    sandbox.make_view(str(live), str(view), ["1.0"])

    assert (view / "2.0").is_dir()
    assert list((view / "2.0").iterdir()) == []
    assert stat.S_ISREG(os.lstat(view / "README").st_mode)
    assert (view / "README").read_bytes() == b""


def test_make_view_copies_a_symlink_instead_of_mounting_it(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    siblings = sandbox.make_view(str(live), str(view), ["1.0"])

    assert os.readlink(view / "default") == "2.0"
    assert "default" not in siblings


def test_make_view_skips_a_fifo(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    siblings = sandbox.make_view(str(live), str(view), ["1.0"])

    assert not os.path.lexists(view / "control")
    assert "control" not in siblings


def test_make_view_leaves_the_live_name_directory_as_it_was(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"
    before = snapshot(live)

    sandbox.make_view(str(live), str(view), ["1.0"])

    assert snapshot(live) == before


def test_make_view_makes_a_staged_version_that_is_not_live_yet(tmp_path):
    live, view = _live_name_dir(tmp_path), tmp_path / "view" / "Tiny"

    siblings = sandbox.make_view(str(live), str(view), ["3.0"])

    assert (view / "3.0").is_dir()
    assert siblings == ["1.0", "2.0", "README"]


def test_make_view_of_a_missing_live_name_directory_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        sandbox.make_view(str(tmp_path / "software" / "Missing"), str(tmp_path / "view"), ["1.0"])
