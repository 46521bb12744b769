"""The mount table as ``/proc/self/mountinfo`` reports it.

Mounts are made for real in a child in a private mount namespace (``unshare --mount``, as
root), and the child reads its own table with this checkout's ``mountinfo``; the test
process's table is never changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ansible_collections.hpcstack.ops.plugins.module_utils.common import mountinfo
from tests.support.mountns import in_private_mounts

CHILD_TIMEOUT = 120
# argv: a root. Prints mount_points_under(root), filesystem_of of each, and the mounts() rows.
REPORT = r"""
import json, sys
from hpcstack_ops.common import mountinfo
root = sys.argv[1]
points = mountinfo.mount_points_under(root)
print(json.dumps({
    "under": points,
    "filesystems": {point: mountinfo.filesystem_of(point) for point in points},
    "mounts": [list(row) for row in mountinfo.mounts() if row[0].startswith(root)],
}))
"""


def _in_namespace(package_dir, root, mounts, extra=""):
    """Mount each ``(fstype, path)`` in a private mount namespace, then report on ``root``."""
    script = "set -e\n"
    for index, (fstype, _path) in enumerate(mounts):
        script += f'mount -t {fstype} none "${index + 1}"\n'
    script += extra + 'exec "$PYTHON" -c "$REPORT" "$ROOT"\n'
    done = subprocess.run(
        in_private_mounts(script, *(str(p) for _t, p in mounts)),
        env=dict(
            os.environ, PYTHONPATH=str(package_dir), PYTHON=sys.executable, REPORT=REPORT, ROOT=str(root)
        ),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# filesystem_of


def test_filesystem_of_proc_is_proc():
    assert mountinfo.filesystem_of("/proc") == "proc"


def test_filesystem_of_a_path_below_a_mount_point_is_that_mount_s():
    assert mountinfo.filesystem_of("/proc/self/status") == "proc"


def test_filesystem_of_a_directory_is_what_findmnt_reports(tmp_path):
    found = subprocess.run(
        ["findmnt", "--noheadings", "--output", "FSTYPE", "--target", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )

    assert mountinfo.filesystem_of(str(tmp_path)) == found.stdout.strip()


def test_filesystem_of_a_symlink_is_that_of_its_target(tmp_path):
    (tmp_path / "proc-link").symlink_to("/proc")

    assert mountinfo.filesystem_of(str(tmp_path / "proc-link")) == "proc"


def test_filesystem_of_a_missing_path_is_that_of_the_mount_above_it(tmp_path):
    assert mountinfo.filesystem_of(str(tmp_path / "missing")) == mountinfo.filesystem_of(str(tmp_path))


def test_filesystem_of_a_stacked_mount_point_is_the_top_mount_s(package_dir, tmp_path):
    point = tmp_path / "stacked"
    point.mkdir()

    report = _in_namespace(package_dir, point, [("tmpfs", point), ("ramfs", point)])

    assert report["filesystems"] == {str(point): "ramfs"}


# mounts and the escapes in mountinfo


def test_mounts_lists_proc_and_the_root_filesystem():
    table = dict(mountinfo.mounts())

    assert table["/proc"] == "proc"
    assert "/" in table


def test_unescape_decodes_space_tab_newline_and_backslash():
    assert mountinfo._unescape(b"/a\\040b\\011c\\012d\\134e") == "/a b\tc\nd\\e"


def test_unescape_leaves_a_path_without_escapes_as_it_is():
    assert mountinfo._unescape(b"/apps/software/Tiny-1.0_x+y") == "/apps/software/Tiny-1.0_x+y"


def test_unescape_decodes_bytes_that_are_not_utf_8_like_os_fsdecode():
    assert mountinfo._unescape(b"/caf\xe9") == os.fsdecode(b"/caf\xe9")


def test_a_mount_point_with_a_space_a_tab_and_a_backslash_is_read_back_exactly(package_dir, tmp_path):
    point = tmp_path / "dir with space\tand\\backslash"
    point.mkdir()

    report = _in_namespace(package_dir, tmp_path, [("tmpfs", point)])

    assert report["mounts"] == [[str(point), "tmpfs"]]
    assert report["filesystems"] == {str(point): "tmpfs"}


# mount_points_under


def test_mount_points_under_a_tree_without_mounts_is_empty(tmp_path):
    assert mountinfo.mount_points_under(str(tmp_path)) == []


def test_mount_points_under_lists_nested_mounts_shallowest_first(package_dir, tmp_path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()

    report = _in_namespace(
        package_dir,
        tmp_path,
        [("tmpfs", tmp_path / "b"), ("tmpfs", tmp_path / "a")],
        extra='mkdir "$2/deep"\nmount -t tmpfs none "$2/deep"\n',
    )

    assert report["under"] == [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "a" / "deep")]


def test_mount_points_under_includes_the_root_when_it_is_a_mount_point(package_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()

    report = _in_namespace(
        package_dir, root, [("tmpfs", root)], extra='mkdir "$1/sub"\nmount -t tmpfs none "$1/sub"\n'
    )

    assert report["under"] == [str(root), str(root / "sub")]


def test_mount_points_under_leaves_out_a_sibling_that_only_shares_the_prefix(package_dir, tmp_path):
    root, sibling = tmp_path / "apps", tmp_path / "apps-old"
    root.mkdir()
    sibling.mkdir()

    report = _in_namespace(package_dir, root, [("tmpfs", sibling)])

    assert report["under"] == []


def test_mount_points_under_lists_a_stacked_mount_point_once(package_dir, tmp_path):
    point = tmp_path / "stacked"
    point.mkdir()

    report = _in_namespace(package_dir, tmp_path, [("tmpfs", point), ("tmpfs", point)])

    assert report["under"] == [str(point)]
    assert len(report["mounts"]) == 2
