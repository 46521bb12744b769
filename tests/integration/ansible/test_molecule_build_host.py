"""``molecule test -s build_host``: the build_host role converges on this machine, a second
run changes nothing, and the installed ``eb-staged-rebuild`` runs (``verify.yml``). Then a new
release of the collection's core: the next converge installs it again, and the run after that
changes nothing.

Molecule runs from a copy of the collection's files, as an installed collection holds them,
with the role's directories under a temporary root and the state root owned by the
unprivileged test user. The role installs EasyBuild with pip from the package index (pip's
cache serves it when ``make test`` has installed the same release into ``.venv``).
"""

from __future__ import annotations

import re

import checkout
from localplay import molecule_test


def _recaps(done):
    """The recaps' (changed, failed) counts of the host, one per playbook run."""
    found = re.findall(r"^build-host\s*:\s*ok=\d+\s+changed=(\d+).*failed=(\d+)", done.stdout, re.M)
    return [(int(changed), int(failed)) for changed, failed in found]


def _changed(done, task) -> bool:
    """Whether the build_host role's task named ``task`` reported a change in ``done``'s run."""
    section = done.stdout.split(f"TASK [hpcstack.ops.build_host : {task}]", 1)
    assert len(section) == 2, f"task {task!r} did not run:\n{done.stdout[-6000:]}"
    return re.search(r"^changed: \[build-host\]", section[1].split("\nTASK [", 1)[0], re.M) is not None


def test_build_host_converges_is_idempotent_the_command_runs_and_a_new_core_is_installed_on_the_next_run(
    tmp_path, unprivileged_user
):
    collection = checkout.copy_to(tmp_path / "collection")
    (tmp_path / "host" / "apps").mkdir(parents=True)
    scenario_env = {
        "MOLECULE_BUILD_HOST_ROOT": str(tmp_path / "host"),
        "MOLECULE_BUILD_HOST_USER": unprivileged_user.name,
    }

    done = molecule_test("build_host", collection, tmp_path, **scenario_env)

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # prepare, converge (which changed something), idempotence (which found nothing to
    # change), verify (whose assertions passed).
    recaps = _recaps(done)
    assert len(recaps) == 4, output[-6000:]
    changed = [count for count, _failed in recaps]
    assert changed[1] > 0
    assert changed[2] == 0
    assert [count for _changed, count in recaps] == [0, 0, 0, 0]
    assert "The state root belongs to the build account alone" in output
    command = tmp_path / "host" / "bin" / "eb-staged-rebuild"
    assert command.stat().st_mode & 0o777 == 0o755

    # A new release of the core, on the host the scenario left: installed again on the next
    # run, and the run after it changes nothing.
    cli = collection / "plugins" / "module_utils" / "staged_rebuild" / "cli.py"
    cli.write_text(cli.read_text() + "# a later release\n")

    upgrade = molecule_test(
        "build_host", collection, tmp_path / "upgrade", command="converge", **scenario_env
    )
    again = molecule_test("build_host", collection, tmp_path / "again", command="converge", **scenario_env)

    assert upgrade.returncode == 0, (upgrade.stdout + upgrade.stderr)[-6000:]
    # Each converge runs prepare first again (which finds its directory there).
    assert [failed for _changed, failed in _recaps(upgrade)] == [0, 0], upgrade.stdout[-6000:]
    assert _changed(upgrade, "Install the core with pip")
    [installed] = (tmp_path / "host" / "opt" / "eb-staged-rebuild" / "venv").glob(
        "lib/python3*/site-packages/hpcstack_ops/staged_rebuild/cli.py"
    )
    assert installed.read_text().endswith("# a later release\n")
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    assert _recaps(again) == [(0, 0), (0, 0)], again.stdout[-6000:]
