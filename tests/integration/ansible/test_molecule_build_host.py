"""``molecule test -s build_host``: the build_host role converges on this machine, a second
run changes nothing, and the installed ``eb-staged-rebuild`` runs (``verify.yml``).

Molecule runs from a copy of the collection's files, as an installed collection holds them,
with the role's directories under a temporary root and the state root owned by the
unprivileged test user. The role installs EasyBuild with pip from the package index (pip's
cache serves it when ``make test`` has installed the same release into ``.venv``).
"""

from __future__ import annotations

import re

import checkout
from localplay import molecule_test


def test_build_host_converges_is_idempotent_and_the_installed_command_runs(tmp_path, unprivileged_user):
    collection = checkout.copy_to(tmp_path / "collection")
    (tmp_path / "host" / "apps").mkdir(parents=True)

    done = molecule_test(
        "build_host",
        collection,
        tmp_path,
        MOLECULE_BUILD_HOST_ROOT=str(tmp_path / "host"),
        MOLECULE_BUILD_HOST_USER=unprivileged_user.name,
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # prepare, converge (which changed something), idempotence (which found nothing to
    # change), verify (whose assertions passed).
    recaps = re.findall(r"^build-host\s*:\s*ok=\d+\s+changed=(\d+).*failed=(\d+)", done.stdout, re.M)
    assert len(recaps) == 4, output[-6000:]
    changed = [int(count) for count, _failed in recaps]
    assert changed[1] > 0
    assert changed[2] == 0
    assert [int(count) for _changed, count in recaps] == [0, 0, 0, 0]
    assert "The state root belongs to the build account alone" in output
    command = tmp_path / "host" / "bin" / "eb-staged-rebuild"
    assert command.stat().st_mode & 0o777 == 0o755
