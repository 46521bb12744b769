"""The kernel features the build backends rely on, exercised as an unprivileged user."""

from __future__ import annotations

import errno
import os


def test_the_test_user_is_unprivileged(unprivileged_user):
    assert unprivileged_user.uid != 0
    assert unprivileged_user.run(["id", "-u"]).stdout.strip() == str(unprivileged_user.uid)


def test_bwrap_runs_a_command_as_the_unprivileged_user(unprivileged_user):
    done = unprivileged_user.run(["bwrap", "--dev-bind", "/", "/", "true"])
    assert done.returncode == 0, done.stderr


def test_bwrap_reports_the_failure_of_the_command_it_runs(unprivileged_user):
    done = unprivileged_user.run(["bwrap", "--dev-bind", "/", "/", "false"])
    assert done.returncode == 1


def test_unshare_user_and_mount_namespace_runs_as_the_unprivileged_user(unprivileged_user):
    done = unprivileged_user.run(["unshare", "--user", "--map-root-user", "--mount", "true"])
    assert done.returncode == 0, done.stderr


def test_a_read_only_bind_mount_in_a_user_namespace_makes_writes_fail_with_erofs(
    unprivileged_user, user_tmp_path
):
    live = user_tmp_path / "live"
    live.mkdir()
    os.chown(live, unprivileged_user.uid, unprivileged_user.gid)
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && touch "$1/probe"'
    done = unprivileged_user.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(live)]
    )
    assert done.returncode != 0
    assert os.strerror(errno.EROFS) in done.stderr, done.stderr
    assert not (live / "probe").exists()
