"""``rebuild --with-dependants`` through the real command: the dry run's plan as text and as
JSON against the expected words, ``--exclude`` and its warning, a chain built and published in
one run, and each refusal (exit 2, one line, the trees untouched, nothing written).

The live tree is written as EasyBuild leaves one (``tests/support/chains``): libtoy/0.0, two
direct dependants, a dependant of a dependant, a build-only dependant and an unrelated
package. The build is the test builder ``fake-eb`` under the userns backend: what is under test
here is the plan and the run made of it, not EasyBuild (real EasyBuild builds chains in the
acceptance tests).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support.chains import flat_chain, install
from tests.support.staged import snapshot

RUN = "chain1"
NAMED = "libtoy-0.0.eb"


@pytest.fixture
def site(staged_site):
    flat_chain(staged_site.installpath)
    return staged_site


def _args(site, *extra, module=("libtoy/0.0",), backend="userns"):
    args = ["rebuild", f"--installpath={site.installpath}", f"--backend={backend}", f"--run-id={RUN}"]
    for name in module:
        args += ["--module", name]
    return [*args, "--with-dependants", *extra, "--", NAMED]


def _trees(site):
    return snapshot(site.software, site.modules)


def test_the_dry_run_prints_the_plan_and_the_command_with_the_dependants_copies(site):
    before = _trees(site)

    done = site.run(*_args(site, "--dry-run"))

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout.replace(str(site.installpath), "<apps>").replace(str(site.state_root), "<state>")
    copies = "<state>/runs/chain1/easyconfigs"
    assert out.startswith(
        "Dry run: would rebuild libtoy/0.0, toyapp/0.0, toptool/2.0, toybuild/3.0, toylib/1.0 with backend"
    )
    # After the eb command itself: the named easyconfig, then the copies in build order.
    command = out[out.index("EasyBuild's command:\n") :].splitlines()[2:7]
    assert [line.strip(" \\") for line in command] == [
        NAMED,
        f"{copies}/toyapp-0.0.eb",
        f"{copies}/toptool-2.0.eb",
        f"{copies}/toybuild-3.0.eb",
        f"{copies}/toylib-1.0.eb",
    ]
    assert out[out.index("plan:") :] == (
        "plan: 5 modules, in build order\n"
        "  1. libtoy/0.0 (named) from libtoy-0.0.eb\n"
        "  2. toyapp/0.0 (depends on libtoy/0.0) from <apps>/software/toyapp/0.0/easybuild/toyapp-0.0.eb\n"
        "  3. toptool/2.0 (depends on toyapp/0.0 -> libtoy/0.0) from "
        "<apps>/software/toptool/2.0/easybuild/toptool-2.0.eb\n"
        "  4. toybuild/3.0 (depends on libtoy/0.0, to build) from "
        "<apps>/software/toybuild/3.0/easybuild/toybuild-3.0.eb\n"
        "  5. toylib/1.0 (depends on libtoy/0.0) from <apps>/software/toylib/1.0/easybuild/toylib-1.0.eb\n"
    )
    assert _trees(site) == before
    assert not site.state_root.exists()


def test_the_dry_run_s_json_holds_the_plan_and_every_member_in_build_order(site):
    done = site.run("--json", *_args(site, "--dry-run", "--exclude", "toyapp/0.0"))

    assert done.returncode == 1, done.stderr  # done, with a warning
    result = json.loads(done.stdout)
    software = str(site.software)
    assert result["modules"] == ["libtoy/0.0", "toybuild/3.0", "toylib/1.0"]
    assert result["plan"] == {
        "target": "libtoy/0.0",
        "members": [
            {
                "module": "libtoy/0.0",
                "install": "libtoy/0.0",
                "easyconfig": NAMED,
                "reason": ["libtoy/0.0"],
                "kind": "runtime",
            },
            {
                "module": "toybuild/3.0",
                "install": "toybuild/3.0",
                "easyconfig": f"{software}/toybuild/3.0/easybuild/toybuild-3.0.eb",
                "reason": ["toybuild/3.0", "libtoy/0.0"],
                "kind": "build",
            },
            {
                "module": "toylib/1.0",
                "install": "toylib/1.0",
                "easyconfig": f"{software}/toylib/1.0/easybuild/toylib-1.0.eb",
                "reason": ["toylib/1.0", "libtoy/0.0"],
                "kind": "runtime",
            },
        ],
        "excluded": ["toyapp/0.0", "toptool/2.0"],
    }
    assert result["warnings"] == [
        "toyapp/0.0 is left out (--exclude): it keeps linking the old libtoy/0.0",
        "toptool/2.0 is left out: it depends on libtoy/0.0 only through toyapp/0.0, "
        "and keeps linking the old libtoy/0.0",
    ]
    assert done.stderr == ""  # --json: the warnings are the result's


def test_a_chain_is_built_in_one_run_in_plan_order_and_published_together(site, tmp_path):
    unrelated = _trees(site)
    unrelated = {path: entry for path, entry in unrelated.items() if "/other" in path}
    inodes = {
        module: os.stat(site.live(module)).st_ino for module in ("libtoy/0.0", "toyapp/0.0", "toptool/2.0")
    }
    log = tmp_path / "eb-args.jsonl"

    done = site.run(*_args(site), env={"FAKE_EB_ARGS_LOG": log, "FAKE_EB_PAYLOAD": "chain build"})

    assert done.returncode == 0, done.stderr
    builds = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(builds) == 1  # one EasyBuild run for the whole chain
    copies = site.state_root / "runs" / RUN / "easyconfigs"
    easyconfigs = [arg for arg in builds[0] if arg.endswith(".eb")]
    assert easyconfigs == [
        NAMED,
        *(str(copies / f) for f in ("toyapp-0.0.eb", "toptool-2.0.eb", "toybuild-3.0.eb", "toylib-1.0.eb")),
    ]
    assert (copies / "toptool-2.0.eb").read_text().startswith("name = 'toptool'")
    for module in ("libtoy/0.0", "toyapp/0.0", "toptool/2.0", "toybuild/3.0", "toylib/1.0"):
        assert site.payload(module) == "chain build"
    for module, inode in inodes.items():
        assert os.stat(site.live(module)).st_ino != inode
    assert {path: entry for path, entry in _trees(site).items() if "/other" in path} == unrelated
    status = json.loads(site.run("--json", "status", RUN).stdout)["run"]
    assert status["state"] == "published"
    assert sorted(entry["module"] for entry in status["modules"]) == [
        "libtoy/0.0",
        "toptool/2.0",
        "toyapp/0.0",
        "toybuild/3.0",
        "toylib/1.0",
    ]


def _assert_refused(site, args, env=None):
    """Exit 2, one line on stderr, nothing on stdout, the trees as before, no state root."""
    before = _trees(site)

    done = site.run(*args, env=env)

    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert _trees(site) == before
    assert not site.state_root.exists()
    return lines[0]


def test_a_dependant_whose_easyconfig_copy_is_missing_is_refused_before_any_build(site):
    copy = site.software / "toptool/2.0/easybuild/toptool-2.0.eb"
    copy.unlink()

    line = _assert_refused(site, _args(site))

    assert line == (
        "eb-staged-rebuild: dependant toptool/2.0 of libtoy/0.0 cannot be rebuilt: "
        f"its easyconfig copy {copy} is missing; repair it, or leave it out with --exclude toptool/2.0"
    )


def test_excluding_the_dependant_whose_copy_is_missing_lets_the_rest_go(site):
    (site.software / "toptool/2.0/easybuild/toptool-2.0.eb").unlink()

    done = site.run(*_args(site, "--dry-run", "--exclude", "toptool/2.0"))

    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("Dry run: would rebuild libtoy/0.0, toyapp/0.0, toybuild/3.0, toylib/1.0 ")
    assert done.stdout.endswith("  left out: toptool/2.0 (keeps linking the old libtoy/0.0)\n")
    assert done.stderr.splitlines() == [
        "eb-staged-rebuild: warning: toptool/2.0 is left out (--exclude): it keeps linking the old libtoy/0.0"
    ]


def test_a_fifo_planted_as_a_dependant_s_copy_is_refused_without_blocking(site):
    copy = site.software / "toyapp/0.0/easybuild/toyapp-0.0.eb"
    copy.unlink()
    os.mkfifo(copy)

    line = _assert_refused(site, _args(site))

    assert f"easyconfig copy {copy} is not a regular file" in line


def test_a_dependency_that_resolves_to_nothing_is_refused_naming_the_member(site):
    install(site.installpath, "late", "1", dependencies=[("libtoy", "0.0"), ("gone", "2")])

    line = _assert_refused(site, _args(site))

    assert line.startswith(
        "eb-staged-rebuild: dependant late/1 of libtoy/0.0 cannot be rebuilt: its dependency gone 2 "
    )
    assert line.endswith("leave it out with --exclude late/1")


def test_a_dependency_that_resolves_to_two_installs_is_refused_as_ambiguous(site):
    install(site.installpath, "GCC", "13.2.0")
    for version in ("12.3.0", "13.2.0"):
        install(
            site.installpath,
            "zlib",
            "1.3",
            install_dir=f"1.3-GCCcore-{version}",
            toolchain=f"('GCCcore', '{version}')",
        )
    install(
        site.installpath,
        "late",
        "1",
        install_dir="1-GCC-13.2.0",
        toolchain="('GCC', '13.2.0')",
        dependencies=[("libtoy", "0.0", "", ("system", "system")), ("zlib", "1.3")],
    )

    line = _assert_refused(site, _args(site))

    assert (
        "dependant late/1-GCC-13.2.0 of libtoy/0.0 cannot be rebuilt: its dependency zlib 1.3 is ambiguous"
        in line
    )


def test_a_cycle_among_the_dependants_is_refused(site):
    install(site.installpath, "ping", "1", dependencies=[("libtoy", "0.0"), ("pong", "1")])
    install(site.installpath, "pong", "1", dependencies=[("ping", "1")])

    line = _assert_refused(site, _args(site))

    assert "ping/1, pong/1 depend on each other (a cycle)" in line


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"module": ("libtoy/0.0", "other/1.0")},
            "--with-dependants takes exactly one --module (the package whose dependants are rebuilt), not 2",
        ),
        ({"backend": "installpath"}, "--with-dependants needs the bwrap or userns backend"),
        ({"exclude": "other/1.0"}, "--exclude other/1.0 is not a dependant of libtoy/0.0"),
    ],
)
def test_requests_a_chain_cannot_be_made_of_are_refused(site, extra, said):
    exclude = ("--exclude", extra.pop("exclude")) if "exclude" in extra else ()

    line = _assert_refused(site, _args(site, *exclude, **extra))

    assert line.startswith("eb-staged-rebuild: " + said)


def test_a_chain_whose_build_fails_changes_nothing_live(site):
    before = _trees(site)

    done = site.run(*_args(site), env={"FAKE_EB_FAIL": "1"})

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "eb-staged-rebuild: EasyBuild failed (exit 1); nothing was swapped"
    )
    assert _trees(site) == before
    status = json.loads(site.run("--json", "status", RUN).stdout)["run"]
    assert status["state"] == "failed"
