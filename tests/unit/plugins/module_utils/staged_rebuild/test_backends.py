"""The backends: which one a run gets, and where each makes EasyBuild write.

The probes run for real: bubblewrap and user namespaces work on the test machine (as root and
as the test user). A probe is made to fail for real too: a ``PATH`` without ``bwrap``, and a
child in a user namespace whose ``user.max_user_namespaces`` is 0, where neither bubblewrap nor
the userns sandbox can make a namespace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import backends, paths

CHILD_TIMEOUT = 120
# EasyBuild's defaults, given explicitly by every backend: a configuration file's value loses to them.
NEUTRAL = ("--suffix-modules-path=all", "--disable-remove-ghost-install-dirs")
# As root: fork a child into a new user namespace, map uids/gids 0-65535 from outside (only
# the parent, outside, may write a map that wide), set its user.max_user_namespaces to 0,
# drop to argv[1]'s uid/gid and run backends.select(argv[2]) with PATH argv[3].
WITHOUT_USER_NAMESPACES = r"""
import ctypes, json, os, sys
from hpcstack_ops.staged_rebuild import backends
from hpcstack_ops.common import errors

uid, gid = (int(part) for part in sys.argv[1].split(":"))
requested, search_path = sys.argv[2], sys.argv[3]
ready_read, ready_write = os.pipe()
mapped_read, mapped_write = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        os.write(ready_write, b"x")
        os.read(mapped_read, 1)
        with open("/proc/sys/user/max_user_namespaces", "w") as handle:
            handle.write("0")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        os.environ["PATH"] = search_path
        try:
            result = {"backend": backends.select(requested)}
        except errors.UsageError as err:
            result = {"refused": str(err)}
        print(json.dumps(result), flush=True)
    finally:
        os._exit(0)
os.read(ready_read, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as handle:
        handle.write("0 0 65536\n")
os.write(mapped_write, b"x")
_pid, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
PROBES_AS_USER = r"""
import json
from hpcstack_ops.staged_rebuild import backends
print(json.dumps({"bwrap": backends.probe_bwrap(), "userns": backends.probe_userns()}))
"""


@pytest.fixture
def path_without_bwrap(tmp_path):
    """A PATH directory with ``true`` (the userns probe runs it) and no ``bwrap``."""
    directory = tmp_path / "bin-without-bwrap"
    directory.mkdir()
    (directory / "true").symlink_to(shutil.which("true"))
    return str(directory)


def _without_user_namespaces(package_dir, user, requested, search_path="/usr/bin:/bin"):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_USER_NAMESPACES, f"{user.uid}:{user.gid}", requested, search_path],
        env=dict(os.environ, PYTHONPATH=str(package_dir)),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _build(backend, tmp_path, modules=(("Tiny", "1.0"),), installpath=None):
    trees = paths.Trees.from_installpath(str(installpath or tmp_path / "apps"))
    return backends.Build(
        backend, trees, trees.generation("run1"), [(*module, "/".join(module)) for module in modules]
    )


# auto_choice


@pytest.mark.parametrize(
    ("bwrap_works", "userns_works", "chosen"),
    [(True, True, "bwrap"), (True, False, "bwrap"), (False, True, "userns"), (False, False, "installpath")],
)
def test_auto_takes_the_first_backend_whose_probe_works(bwrap_works, userns_works, chosen):
    assert backends.auto_choice(bwrap_works, userns_works) == chosen


# select, with the probes working


def test_select_auto_takes_bwrap_where_bubblewrap_runs():
    assert backends.select("auto") == "bwrap"


def test_select_bwrap_takes_bwrap_where_bubblewrap_runs():
    assert backends.select("bwrap") == "bwrap"


def test_select_userns_takes_userns_where_a_namespace_can_be_made():
    assert backends.select("userns") == "userns"


def test_select_installpath_takes_installpath_without_probing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither probe could run

    assert backends.select("installpath") == "installpath"


def test_select_auto_takes_userns_when_bubblewrap_is_missing(monkeypatch, path_without_bwrap):
    monkeypatch.setenv("PATH", path_without_bwrap)

    assert backends.select("auto") == "userns"


def test_both_probes_work_for_the_unprivileged_user(package_dir, unprivileged_user):
    done = unprivileged_user.run(
        [sys.executable, "-c", PROBES_AS_USER], env=dict(unprivileged_user.env(), PYTHONPATH=str(package_dir))
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"bwrap": True, "userns": True}


# select, with a probe failing


def test_select_refuses_explicit_bwrap_when_bubblewrap_is_missing(monkeypatch, path_without_bwrap):
    monkeypatch.setenv("PATH", path_without_bwrap)

    with pytest.raises(errors.UsageError) as caught:
        backends.select("bwrap")

    message = str(caught.value)
    assert message.startswith("--backend bwrap: 'bwrap --dev-bind / / true' fails for this user")
    assert "\n" not in message


def test_probe_bwrap_fails_when_bubblewrap_is_missing(monkeypatch, path_without_bwrap):
    monkeypatch.setenv("PATH", path_without_bwrap)

    assert backends.probe_bwrap() is False


def test_select_refuses_explicit_userns_where_no_user_namespace_can_be_made(
    package_dir,
    unprivileged_user,
):
    result = _without_user_namespaces(package_dir, unprivileged_user, "userns")

    assert set(result) == {"refused"}
    assert result["refused"].startswith("--backend userns: this user cannot make a user and mount namespace")
    assert "\n" not in result["refused"]


def test_select_refuses_explicit_bwrap_where_no_user_namespace_can_be_made(
    package_dir,
    unprivileged_user,
):
    result = _without_user_namespaces(package_dir, unprivileged_user, "bwrap")

    assert result["refused"].startswith("--backend bwrap: 'bwrap --dev-bind / / true' fails for this user")


def test_select_auto_falls_back_to_installpath_where_no_user_namespace_can_be_made(
    package_dir,
    unprivileged_user,
):
    assert _without_user_namespaces(package_dir, unprivileged_user, "auto") == {"backend": "installpath"}


def test_probe_userns_leaves_no_scratch_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    assert backends.probe_userns() is True
    assert list(tmp_path.iterdir()) == []


# placement_args


def test_installpath_places_software_and_modules_in_the_generation(tmp_path):
    build = _build("installpath", tmp_path)
    generation = tmp_path / "apps" / "software" / ".eb-staged-rebuild" / "run1"

    assert build.placement_args() == [
        "--module-syntax=Lua",
        f"--installpath-data={generation}/data",
        *NEUTRAL,
        "--disable-bwrap",
        f"--installpath-software={generation}/software",
        f"--installpath-modules={generation}/modules",
    ]


def test_userns_places_software_at_the_live_path_and_modules_and_locks_in_the_generation(tmp_path):
    build = _build("userns", tmp_path)
    generation = tmp_path / "apps" / "software" / ".eb-staged-rebuild" / "run1"

    assert build.placement_args() == [
        "--module-syntax=Lua",
        f"--installpath-data={generation}/data",
        *NEUTRAL,
        "--disable-bwrap",
        f"--installpath-software={tmp_path}/apps/software",
        f"--installpath-modules={generation}/modules",
        f"--locks-dir={generation}/software/.locks",
    ]


def _live_entries(tmp_path, entries):
    """The live ``Tiny`` directory with ``entries`` (directories, ``name=`` a file, ``name->`` a link)."""
    live = tmp_path / "apps" / "software" / "Tiny"
    live.mkdir(parents=True)
    for entry in entries:
        if entry.endswith("="):
            (live / entry[:-1]).write_text("x")
        elif entry.endswith("->"):
            (live / entry[:-2]).symlink_to("1.0")
        else:
            (live / entry).mkdir()
    return live


def test_bwrap_uses_easybuild_s_bubblewrap_mode_with_the_live_trees_read_only(tmp_path):
    _live_entries(tmp_path, ["1.0", "0.9", "NOTES=", "default->"])
    build = _build("bwrap", tmp_path)
    software, modules = f"{tmp_path}/apps/software", f"{tmp_path}/apps/modules"
    generation = f"{software}/.eb-staged-rebuild/run1"

    assert build.placement_args() == [
        "--module-syntax=Lua",
        f"--installpath-data={generation}/data",
        *NEUTRAL,
        f"--installpath-modules={modules}",
        f"--locks-dir={generation}/software/.locks",
        "--experimental",
        "--bwrap",
        f"--bwrap-installpath={generation}",
        f"--bwrap-options=--ro-bind,{software},{software},--ro-bind,{modules},{modules},"
        f"--bind,{generation},{generation},"
        # The view over the live Name, its other version and file read-only (the link is copied).
        f"--bind,{generation}/software/Tiny,{software}/Tiny,"
        f"--ro-bind,{software}/Tiny/0.9,{software}/Tiny/0.9,--ro-bind,{software}/Tiny/NOTES,{software}/Tiny/NOTES,"
        f"--setenv,EASYBUILD_INSTALLPATH_SOFTWARE,{software},--die-with-parent",
    ]


def test_bwrap_gives_easybuild_s_first_pass_a_software_path_in_the_generation(tmp_path):
    # The first pass creates Name/version there (outside any sandbox) and binds the stage onto
    # it; the sandbox's --setenv gives the second pass the live tree again.
    _live_entries(tmp_path, ["1.0"])
    build = _build("bwrap", tmp_path)

    env = build.environment({"PATH": "/usr/bin:/bin"}, "/opt/eb/bin/eb")

    assert env["EASYBUILD_INSTALLPATH_SOFTWARE"] == (
        f"{tmp_path}/apps/software/.eb-staged-rebuild/run1/first-pass/software"
    )
    assert not any(arg.startswith("--installpath-software") for arg in build.placement_args())


@pytest.mark.parametrize("backend", ["installpath", "userns"])
def test_only_bwrap_sets_the_software_path_in_the_environment(tmp_path, backend):
    env = _build(backend, tmp_path).environment({"PATH": "/usr/bin:/bin"}, "/opt/eb/bin/eb")

    assert "EASYBUILD_INSTALLPATH_SOFTWARE" not in env


def test_bwrap_placement_of_a_missing_live_name_directory_raises(tmp_path):
    # The planner requires the live Name/version before a Build is made; nothing to guess here.
    with pytest.raises(FileNotFoundError):
        _build("bwrap", tmp_path).placement_args()


@pytest.mark.parametrize("tree", ["software", "modules"])
def test_bwrap_refuses_a_tree_path_with_a_comma(tmp_path, tree):
    trees = paths.Trees(str(tmp_path / "apps" / "software"), str(tmp_path / "apps" / "modules"))
    trees = dataclasses.replace(trees, **{tree: str(tmp_path / "apps,2" / tree)})
    build = backends.Build("bwrap", trees, trees.generation("run1"), [("Tiny", "1.0", "Tiny/1.0")])

    with pytest.raises(errors.UsageError) as caught:
        build.placement_args()

    assert str(caught.value) == (
        f"--backend bwrap: {tmp_path / 'apps,2' / tree} contains a comma, "
        "which EasyBuild's --bwrap-options cannot carry"
    )


@pytest.mark.parametrize("backend", ["installpath", "userns"])
def test_a_comma_in_the_install_path_is_no_problem_for_the_other_backends(tmp_path, backend):
    build = _build(backend, tmp_path, installpath=tmp_path / "apps,2")

    (software,) = [arg for arg in build.placement_args() if arg.startswith("--installpath-software=")]
    assert software.startswith(f"--installpath-software={tmp_path}/apps,2/software")


def test_the_command_puts_the_placement_after_the_user_s_safe_arguments(tmp_path):
    build = _build("installpath", tmp_path)

    command = build.command("/opt/eb/bin/eb", ["Tiny-1.0.eb", "--installpath=/apps", "--robot"])

    assert command == ["/opt/eb/bin/eb", "Tiny-1.0.eb", "--robot", "--rebuild", *build.placement_args()]


# environment


def _eb_with_python(tmp_path):
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("eb", "python3"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return str(bin_dir / "eb")


@pytest.mark.parametrize("backend", ["installpath", "userns", "bwrap"])
def test_the_environment_names_the_python_beside_eb(tmp_path, backend):
    eb = _eb_with_python(tmp_path)

    env = _build(backend, tmp_path).environment({"PATH": "/usr/bin:/bin"}, eb)

    assert env["EB_PYTHON"] == os.path.join(os.path.dirname(eb), "python3")


def test_the_environment_keeps_an_eb_python_the_user_set(tmp_path):
    eb = _eb_with_python(tmp_path)

    env = _build("installpath", tmp_path).environment({"EB_PYTHON": "/usr/bin/python3.12"}, eb)

    assert env["EB_PYTHON"] == "/usr/bin/python3.12"


def test_the_environment_has_no_eb_python_when_no_python_is_beside_eb(tmp_path):
    eb = _eb_with_python(tmp_path)
    os.unlink(os.path.join(os.path.dirname(eb), "python3"))

    env = _build("installpath", tmp_path).environment({"PATH": "/usr/bin:/bin"}, eb)

    assert "EB_PYTHON" not in env


def test_bwrap_puts_the_directory_of_eb_first_on_path(tmp_path):
    eb = _eb_with_python(tmp_path)

    env = _build("bwrap", tmp_path).environment({"PATH": "/usr/bin:/bin"}, eb)

    assert env["PATH"] == f"{os.path.dirname(eb)}:/usr/bin:/bin"


@pytest.mark.parametrize("backend", ["installpath", "userns"])
def test_the_other_backends_leave_path_as_it_is(tmp_path, backend):
    eb = _eb_with_python(tmp_path)

    env = _build(backend, tmp_path).environment({"PATH": "/usr/bin:/bin"}, eb)

    assert env["PATH"] == "/usr/bin:/bin"


def test_the_environment_drops_redirecting_easybuild_variables(tmp_path):
    eb = _eb_with_python(tmp_path)
    base = {"PATH": "/bin", "EASYBUILD_INSTALLPATH": "/apps", "EASYBUILD_ROBOT_PATHS": "/site"}

    env = _build("bwrap", tmp_path).environment(base, eb)

    assert "EASYBUILD_INSTALLPATH" not in env
    assert env["EASYBUILD_ROBOT_PATHS"] == "/site"
    assert base == {"PATH": "/bin", "EASYBUILD_INSTALLPATH": "/apps", "EASYBUILD_ROBOT_PATHS": "/site"}


# prepare and check


def _live(tmp_path):
    live = tmp_path / "apps" / "software" / "Tiny"
    (live / "1.0").mkdir(parents=True)
    (live / "2.0").mkdir()
    (tmp_path / "apps" / "modules" / "all").mkdir(parents=True)


def test_prepare_for_userns_makes_the_view_locks_and_module_tree_and_returns_a_setup(tmp_path):
    _live(tmp_path)
    build = _build("userns", tmp_path)

    setup = build.prepare()

    assert callable(setup)
    assert sorted(os.listdir(os.path.join(build.stage_software, "Tiny"))) == ["1.0", "2.0"]
    assert os.path.isdir(build.locks_dir)
    assert os.path.isdir(build.stage_modules)


def test_prepare_for_bwrap_makes_the_view_with_the_stage_as_a_plain_directory(tmp_path):
    # EasyBuild's --rebuild removes the stage: a plain directory goes at once, a mount point
    # would fail with EBUSY and be retried with sleeps. EasyBuild makes the sandbox itself.
    _live(tmp_path)
    build = _build("bwrap", tmp_path)

    assert build.prepare() is None

    view = os.path.join(build.stage_software, "Tiny")
    assert sorted(os.listdir(view)) == ["1.0", "2.0"]
    assert os.listdir(os.path.join(view, "1.0")) == []
    assert os.path.isdir(build.locks_dir)


def test_prepare_for_installpath_makes_nothing(tmp_path):
    _live(tmp_path)
    build = _build("installpath", tmp_path)

    assert build.prepare() is None
    assert not os.path.exists(build.generation)


def test_check_refuses_a_bwrap_build_without_bwrap_info(tmp_path):
    _live(tmp_path)
    build = _build("bwrap", tmp_path)
    os.makedirs(build.generation)

    with pytest.raises(errors.PublishError) as caught:
        build.check()

    assert str(caught.value).startswith(f"cannot read {build.generation}/bwrap_info.json: ")


@pytest.mark.parametrize("backend", ["installpath", "userns"])
def test_check_has_nothing_to_check_for_the_other_backends(tmp_path, backend):
    _live(tmp_path)
    build = _build(backend, tmp_path)

    assert build.check() is None


@pytest.mark.parametrize("backend", ["installpath", "userns", "bwrap"])
def test_every_backend_tells_easybuild_the_live_module_syntax(tmp_path, backend):
    _live_entries(tmp_path, ["1.0"])
    trees = paths.Trees.from_installpath(str(tmp_path / "apps"))
    build = backends.Build(backend, trees, trees.generation("run1"), [("Tiny", "1.0", "Tiny/1.0")], "Tcl")

    assert build.placement_args()[0] == "--module-syntax=Tcl"
    command = build.command("/opt/eb/bin/eb", ["--module-syntax=Lua", "Tiny-1.0.eb"])
    # For an option given twice EasyBuild takes the last one: the live syntax comes after.
    assert command.index("--module-syntax=Tcl") > command.index("--module-syntax=Lua")
