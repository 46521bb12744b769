"""Who could replace what the role writes: the rule for a directory on the way, the survey's
walk from /, and the writes' walk, which makes what is missing itself and refuses what
another user made. (A racing process of another uid is in test_arch_guard_role_attacks.py.)"""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import trust

OTHER_UID = 65534


def _facts(kind="directory", uid=0, mode=0o755):
    return {"path": "/x", "type": kind, "uid": uid, "gid": 0, "mode": mode}


@pytest.mark.parametrize(
    ("seen", "why"),
    [
        (_facts(), None),
        (_facts(mode=0o1777), None),  # sticky: others cannot replace root's entries in it
        (_facts(mode=0o700), None),
        (_facts(mode=0o775), "is writable by group or others (mode 0775)"),
        (_facts(mode=0o757), "is writable by group or others (mode 0757)"),
        (_facts(uid=OTHER_UID), f"belongs to uid {OTHER_UID}"),
        (_facts(uid=OTHER_UID, mode=0o1777), f"belongs to uid {OTHER_UID}"),
        (_facts(kind="symlink", mode=0o777), "is a symlink"),
        (_facts(kind="file"), "is a file"),
    ],
)
def test_a_directory_on_the_way_is_root_s_alone_or_sticky(seen, why):
    assert trust.distrust(seen) == why


def test_the_survey_s_walk_stops_at_a_link_and_at_what_is_missing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    through_link = trust.look(str(tmp_path / "link" / "arch-guard"))
    missing = trust.look(str(tmp_path / "real" / "missing" / "arch-guard"))

    assert through_link[-1] == {
        "path": str(tmp_path / "link"),
        "type": "symlink",
        "uid": 0,
        "gid": 0,
        "mode": 0o777,
    }
    assert through_link[0]["path"] == "/"
    assert missing[-1]["path"] == str(tmp_path / "real")
    assert trust.first_distrusted(missing) is None


def test_the_writes_walk_makes_what_is_missing_root_s_and_sets_its_own_directories(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    prefix = sticky / "site" / "arch-guard"
    walk = trust.Walk(str(prefix))

    with walk.open(str(prefix), own=1, mode=0o755) as held:
        made = os.fstat(held.fd)

    site = (sticky / "site").stat()
    assert (site.st_uid, stat.S_IMODE(site.st_mode)) == (0, 0o755)
    assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (0, 0, 0o755)
    assert walk.changed == [f"made {sticky / 'site'}", f"made {prefix}"]

    prefix.chmod(0o775)
    again = trust.Walk(str(prefix))
    with again.open(str(prefix), own=1, mode=0o755):
        pass

    assert stat.S_IMODE(prefix.stat().st_mode) == 0o755
    assert again.changed == [f"set {prefix} to root's, mode 0755"]


@pytest.mark.parametrize("kind", ["another user's", "a symlink", "writable by others"])
def test_a_directory_on_the_way_that_others_could_replace_is_refused_naming_it(tmp_path, kind):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    planted = sticky / "site"
    if kind == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        planted.symlink_to(tmp_path / "elsewhere")
    else:
        planted.mkdir()
        if kind == "another user's":
            os.chown(planted, OTHER_UID, OTHER_UID)
        else:
            planted.chmod(0o777)
    prefix = planted / "arch-guard"

    with pytest.raises(trust.Untrusted) as refused:
        trust.Walk(str(prefix)).open(str(prefix), own=1, mode=0o755)

    assert str(refused.value).startswith(
        f"arch_guard: {planted} must be a directory (not a symlink) owned by root"
    )
    assert "\n" not in str(refused.value)
    assert not os.path.lexists(tmp_path / "elsewhere" / "arch-guard")
    assert not os.path.lexists(planted / "arch-guard") or kind == "a symlink"


def test_an_own_directory_of_another_user_is_refused_not_taken_over(tmp_path):
    prefix = tmp_path / "arch-guard"
    prefix.mkdir()
    os.chown(prefix, OTHER_UID, OTHER_UID)

    with pytest.raises(trust.Untrusted, match=f"{prefix} belongs to uid {OTHER_UID}"):
        trust.Walk(str(prefix)).open(str(prefix), own=1, mode=0o755)

    assert prefix.stat().st_uid == OTHER_UID


def test_a_dry_walk_makes_and_sets_nothing(tmp_path):
    prefix = tmp_path / "site" / "arch-guard"
    walk = trust.Walk(str(prefix), dry_run=True)

    assert walk.open(str(prefix), own=1, mode=0o755) is None
    assert walk.changed == [f"made {tmp_path / 'site'}"]
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("another user's", f"belongs to uid {OTHER_UID}; refusing to run it as root"),
        ("group-writable", "is writable by group or others (mode 0775); refusing to run it as root"),
        ("a symlink", "is a symbolic link; refusing to run it"),
        ("a fifo", "is a fifo; refusing to run it as root"),
    ],
)
def test_a_file_root_would_run_is_checked_on_its_descriptor(tmp_path, kind, why):
    (tmp_path / "real").write_text("#!/bin/sh\n")
    entry = tmp_path / "launcher"
    if kind == "a symlink":
        entry.symlink_to(tmp_path / "real")
    elif kind == "a fifo":
        os.mkfifo(entry)
    else:
        entry.write_text("#!/bin/sh\n")
        entry.chmod(0o775)
        if kind == "another user's":
            os.chown(entry, OTHER_UID, OTHER_UID)
            entry.chmod(0o755)

    with trust.dirfd.Directory.open(tmp_path) as held, pytest.raises(trust.Untrusted) as refused:
        trust.open_entry_checked(held, "launcher")

    assert str(refused.value) == f"arch_guard: {entry} {why}"


def test_an_interpreter_is_started_only_where_nobody_else_could_have_written_it(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "python3").symlink_to("/usr/bin/python3")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "python3").symlink_to("/usr/bin/python3")

    assert trust.distrust_executable("/usr/bin/python3") is None
    assert trust.distrust_executable(str(mine / "python3")) is None
    assert trust.distrust_executable(str(shared / "python3")) == (
        f"is in {shared}, which is writable by group or others (mode 0777)"
    )
