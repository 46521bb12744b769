"""tools/bootstrap.sh: a prepared machine is left alone; a missing package is named."""

from __future__ import annotations

import os
import shutil
import subprocess

import checkout

BOOTSTRAP = checkout.REPO / "tools" / "bootstrap.sh"


def test_a_second_bootstrap_changes_nothing_and_says_nothing():
    # make test has just run the bootstrap, so the machine is prepared.
    stamp = checkout.REPO / ".venv" / ".bootstrap-stamp"
    before = stamp.stat().st_mtime_ns

    done = subprocess.run(
        ["bash", str(BOOTSTRAP), "test"], capture_output=True, text=True, timeout=120, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert stamp.stat().st_mtime_ns == before


def test_without_root_a_missing_package_stops_the_bootstrap_and_is_named(unprivileged_user, user_tmp_path):
    # Removing a real package would break the tests running beside this one, so a dpkg-query
    # shim reports slurmd as absent; everything else the script does is real.
    repo = user_tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(BOOTSTRAP, repo / "tools" / "bootstrap.sh")
    shutil.copytree(checkout.REPO / "requirements", repo / "requirements")
    shim = user_tmp_path / "bin"
    shim.mkdir()
    (shim / "dpkg-query").write_text(
        '#!/bin/sh\nfor last; do :; done\n[ "$last" = slurmd ] && { echo not-installed; exit 0; }\n'
        'exec /usr/bin/dpkg-query "$@"\n'
    )
    (shim / "dpkg-query").chmod(0o755)
    for path in (repo, *repo.rglob("*"), shim, *shim.iterdir()):
        os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    env = dict(unprivileged_user.env(), PATH=f"{shim}:/usr/bin:/bin", HPCSTACK_PYTHON="/usr/bin/python3")

    done = unprivileged_user.run(["bash", str(repo / "tools" / "bootstrap.sh"), "test"], env=env, timeout=120)

    assert done.returncode == 1
    named = done.stderr.split("missing Debian packages: ")[1].split(" (")[0].split()
    assert "slurmd" in named
    assert "slurmd runs the test cluster's jobs and TaskProlog" in done.stderr
    assert f"sudo apt-get install {' '.join(named)}" in done.stderr
    assert not (repo / ".venv").exists()


def test_an_unknown_profile_is_refused():
    done = subprocess.run(["bash", str(BOOTSTRAP), "everything"], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "unknown profile 'everything'" in done.stderr
