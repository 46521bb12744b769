"""The staged_rebuild module in-process: ``main()`` with its arguments patched in, its JSON read back.

The builds use the test builder ``tests/builders/fake_eb.py`` behind a small ``eb`` made per
test, which also answers ``eb --version`` with a chosen EasyBuild version and records that
version in each install's log, as EasyBuild does: that is what ``rebuild: changed`` compares.
``FAKE_EB_ARGS_LOG`` records every build, which is how "no build ran" is shown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import backends, rebuild
from ansible_collections.hpcstack.ops.plugins.modules import staged_rebuild
from tests.support.module_runner import APP, assert_failed_with, run_module, warnings_of
from tests.support.staged import FAKE_EB, StagedSite, snapshot

EB_VERSION = "5.4.2"

# The test builder, plus what it lacks: `eb --version`, the version in each install's log, and
# (with TEST_EB_BINARY) a binary that names its install path.
EB_SCRIPT = """#!{python}
import os
import sys

sys.path.insert(0, {builders!r})
import fake_eb

BANNER = "This is EasyBuild {version} (framework: {version}, easyblocks: {version}) on host test"


def record(software, easyconfig):
    name, version = os.path.basename(easyconfig)[: -len(".eb")].split("-", 1)
    install = os.path.join(software, name, version)
    with open(os.path.join(install, "easybuild", "easybuild-" + name + "-20260101.000000.log"), "w") as log:
        log.write("== 2026-01-01 00:00:00,000 main.py:100 INFO " + BANNER + "\\n")
    if os.environ.get("TEST_EB_BINARY"):
        os.makedirs(os.path.join(install, "bin"), exist_ok=True)
        with open(os.path.join(install, "bin", "tinyapp"), "wb") as binary:
            binary.write(b"\\x7fELF\\0" + install.encode() + b"\\0")


def main(argv):
    if "--version" in argv:
        print(BANNER)
        return 0
    code = fake_eb.main(argv)
    if code == 0:
        options, easyconfigs = fake_eb.parse(argv)
        software = options.get("--installpath-software") or os.path.join(options["--installpath"], "software")
        for easyconfig in easyconfigs:
            record(software, easyconfig)
    return code


sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Live:
    """A live tree with APP in it, the ``eb`` that built it, and an easyconfig to ask for."""

    site: StagedSite
    eb: Path
    easyconfig: Path
    calls_log: Path

    def args(self, **options) -> dict:
        base = {
            "state_root": str(self.site.state_root),
            "installpath": str(self.site.installpath),
            "modules": [APP],
            "easyconfigs": [str(self.easyconfig)],
            "eb": str(self.eb),
            "backend": "installpath",  # the test builder knows no sandbox
        }
        base.update(options)
        return base

    def builds(self) -> list:
        log = self.calls_log
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def trees(self) -> dict:
        return snapshot(self.site.software, self.site.modules)


def make_eb(directory: Path, version: str) -> Path:
    eb = directory / f"eb-{version}"
    eb.write_text(EB_SCRIPT.format(python=sys.executable, builders=str(FAKE_EB.parent), version=version))
    eb.chmod(0o755)
    return eb


def install(site: StagedSite, eb: Path) -> None:
    """Build APP straight into the live tree, as EasyBuild of ``eb``'s version would."""
    done = subprocess.run(
        [str(eb), f"--installpath={site.installpath}", "TinyApp-1.0.eb"],
        env=dict(os.environ, FAKE_EB_PAYLOAD="old"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def live(empty_site, tmp_path, monkeypatch) -> Live:
    site = empty_site
    eb = make_eb(tmp_path, EB_VERSION)
    install(site, eb)
    # The easyconfig the live install was built from, byte for byte, outside the live tree.
    easyconfig = tmp_path / "easyconfigs" / "TinyApp-1.0.eb"
    easyconfig.parent.mkdir()
    easyconfig.write_bytes((site.live(APP) / "easybuild" / "TinyApp-1.0.eb").read_bytes())
    calls_log = tmp_path / "eb-calls.jsonl"
    monkeypatch.setenv("FAKE_EB_ARGS_LOG", str(calls_log))
    monkeypatch.delenv("EB_STAGED_REBUILD_BACKEND", raising=False)
    return Live(site=site, eb=eb, easyconfig=easyconfig, calls_log=calls_log)


def run_staged_rebuild(capsys, args, *, check_mode=False, diff=False) -> dict:
    return run_module(capsys, staged_rebuild, args, check_mode=check_mode, diff=diff)


# rebuild: changed


def test_an_up_to_date_live_install_reports_no_change_and_builds_nothing(live, capsys):
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args())

    assert result["changed"] is False
    assert result["state"] == "up_to_date"
    assert result["up_to_date"] == [
        {"module": APP, "up_to_date": True, "why": "same easyconfig and EasyBuild"}
    ]
    assert live.builds() == []
    assert live.trees() == before
    assert not live.site.state_root.exists()


def test_a_different_easyconfig_rebuilds_and_publishes(live, capsys):
    live.easyconfig.write_text(live.easyconfig.read_text() + "versionsuffix = '-new'\n")
    old_inode = live.site.live(APP).stat().st_ino

    result = run_staged_rebuild(capsys, live.args())

    assert (result["changed"], result["state"]) == (True, "published")
    (verdict,) = result["up_to_date"]
    assert verdict["up_to_date"] is False
    assert verdict["why"].endswith("differs from the requested easyconfig")
    assert len(live.builds()) == 1
    assert str(live.easyconfig) in live.builds()[0]
    assert live.site.live(APP).stat().st_ino != old_inode
    assert live.site.payload(APP) == "new build"
    (module,) = result["modules"]
    assert module["stable_path"] == str(live.site.live(APP))
    assert os.lstat(module["retired_path"]).st_ino == old_inode


def test_a_different_recorded_easybuild_version_rebuilds(live, capsys, tmp_path):
    newer_eb = make_eb(tmp_path, "5.4.3")

    result = run_staged_rebuild(capsys, live.args(eb=str(newer_eb)))

    assert (result["changed"], result["state"]) == (True, "published")
    assert result["up_to_date"][0]["why"] == "built by EasyBuild 5.4.2, not by 5.4.3"
    assert len(live.builds()) == 1
    assert live.site.payload(APP) == "new build"


def test_after_a_rebuild_the_second_run_reports_no_change(live, capsys, tmp_path):
    newer_eb = make_eb(tmp_path, "5.4.3")
    first = run_staged_rebuild(capsys, live.args(eb=str(newer_eb)))
    after_first = live.trees()

    second = run_staged_rebuild(capsys, live.args(eb=str(newer_eb)))

    assert first["changed"] is True
    assert (second["changed"], second["state"]) == (False, "up_to_date")
    assert len(live.builds()) == 1
    assert live.trees() == after_first


def test_an_easyconfig_named_without_a_path_is_never_up_to_date(live, capsys):
    result = run_staged_rebuild(capsys, live.args(easyconfigs=[], eb_args=["TinyApp-1.0.eb"]))

    assert result["changed"] is True
    assert result["up_to_date"][0]["why"] == "easyconfig TinyApp-1.0.eb is not a file that can be read here"


# rebuild: always


def test_rebuild_always_rebuilds_an_up_to_date_install_every_time(live, capsys):
    inodes = [live.site.live(APP).stat().st_ino]

    runs = []
    for attempt in ("first", "second"):
        runs.append(run_staged_rebuild(capsys, live.args(rebuild="always", run_id=attempt)))
        inodes.append(live.site.live(APP).stat().st_ino)

    assert [(run["changed"], run["state"]) for run in runs] == [(True, "published")] * 2
    assert "up_to_date" not in runs[0]
    assert [run["run_id"] for run in runs] == ["first", "second"]
    assert len(live.builds()) == 2
    assert len(set(inodes)) == 3


def test_easyconfigs_come_first_among_easybuild_s_arguments(live, capsys):
    run_staged_rebuild(capsys, live.args(rebuild="always", eb_args=["--robot", "--debug"]))

    (argv,) = live.builds()
    assert argv[:3] == [str(live.easyconfig), "--robot", "--debug"]


# Check mode and diff mode


@pytest.mark.parametrize("rebuild", ["changed", "always"])
def test_check_mode_predicts_a_rebuild_and_changes_nothing(live, capsys, tmp_path, rebuild):
    newer_eb = make_eb(tmp_path, "5.4.3")
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(eb=str(newer_eb), rebuild=rebuild), check_mode=True)

    assert result["changed"] is True
    assert result["dry_run"] is True
    assert result["modules"] == [APP]
    assert result["backend"] == "installpath"
    assert live.builds() == []
    assert live.trees() == before
    assert not live.site.state_root.exists()


def test_check_mode_of_an_up_to_date_install_reports_no_change(live, capsys):
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(), check_mode=True)

    assert (result["changed"], result["state"]) == (False, "up_to_date")
    assert live.trees() == before


def test_diff_shows_the_live_inode_before_and_after(live, capsys):
    old_inode = live.site.live(APP).stat().st_ino

    result = run_staged_rebuild(capsys, live.args(rebuild="always"), diff=True)

    new_inode = live.site.live(APP).stat().st_ino
    live_dir = live.site.live(APP)
    assert result["diff"]["before"].startswith(f"# {APP}: {live_dir} inode {old_inode}\n")
    assert result["diff"]["after"].startswith(f"# {APP}: {live_dir} inode {new_inode}\n")
    assert f"# {live.site.module_file(APP)}\n" in result["diff"]["after"]


def test_check_mode_diff_shows_the_live_directory_replaced(live, capsys):
    old_inode = live.site.live(APP).stat().st_ino
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(rebuild="always"), check_mode=True, diff=True)

    live_dir = live.site.live(APP)
    assert result["diff"]["before"].startswith(f"# {APP}: {live_dir} inode {old_inode}\n")
    assert result["diff"]["after"].startswith(f"# {APP}: {live_dir} replaced by a new directory\n")
    assert live.trees() == before


def test_diff_of_an_up_to_date_install_is_the_same_before_and_after(live, capsys):
    result = run_staged_rebuild(capsys, live.args(), diff=True)

    assert result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]


# Defaults from the environment


def test_without_installpath_options_easybuild_s_variables_name_the_live_tree(live, capsys, monkeypatch):
    monkeypatch.setenv("EASYBUILD_INSTALLPATH", str(live.site.installpath))
    args = live.args(rebuild="always")
    del args["installpath"]

    result = run_staged_rebuild(capsys, args)

    assert result["modules"][0]["stable_path"] == str(live.site.live(APP))
    assert live.site.payload(APP) == "new build"


def test_installpath_software_and_modules_beat_easybuild_installpath(live, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("EASYBUILD_INSTALLPATH", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_SOFTWARE", str(live.site.software))
    monkeypatch.setenv("EASYBUILD_INSTALLPATH_MODULES", str(live.site.modules))
    args = live.args()
    del args["installpath"]

    result = run_staged_rebuild(capsys, args)

    assert (result["changed"], result["state"]) == (False, "up_to_date")


def test_the_two_installpath_options_name_the_live_tree(live, capsys):
    args = live.args(installpath_software=str(live.site.software), installpath_modules=str(live.site.modules))
    del args["installpath"]

    result = run_staged_rebuild(capsys, args)

    assert (result["changed"], result["state"]) == (False, "up_to_date")


def test_eb_and_the_state_root_default_to_the_host_s_variables(live, capsys, monkeypatch):
    monkeypatch.setenv("EB_STAGED_REBUILD_EB", str(live.eb))
    monkeypatch.setenv("EB_STAGED_REBUILD_STATE_ROOT", str(live.site.state_root))
    args = live.args(rebuild="always")
    del args["eb"], args["state_root"]

    result = run_staged_rebuild(capsys, args)

    assert result["state"] == "published"
    assert Path(result["journal"]).parent.parent == live.site.state_root / "runs"
    assert len(live.builds()) == 1


def test_the_backend_defaults_to_the_host_s_eb_staged_rebuild_backend(live, capsys, monkeypatch):
    monkeypatch.setenv("EB_STAGED_REBUILD_BACKEND", "installpath")
    args = live.args(rebuild="always")
    del args["backend"]

    result = run_staged_rebuild(capsys, args, check_mode=True)

    assert (result["backend"], result["sandboxed"]) == ("installpath", False)


def test_a_bad_eb_staged_rebuild_backend_fails_with_one_line_and_changes_nothing(live, capsys, monkeypatch):
    monkeypatch.setenv("EB_STAGED_REBUILD_BACKEND", "chroot")
    before = live.trees()
    args = live.args(rebuild="always")
    del args["backend"]

    result = run_staged_rebuild(capsys, args)

    assert_failed_with(
        result, "EB_STAGED_REBUILD_BACKEND='chroot' is not one of auto, bwrap, userns, installpath"
    )
    assert (live.builds(), live.trees()) == ([], before)
    assert not live.site.state_root.exists()


def test_eb_defaults_to_eb_on_path(live, capsys, monkeypatch, tmp_path):
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "eb").symlink_to(live.eb)
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    args = live.args()
    del args["eb"]

    result = run_staged_rebuild(capsys, args)

    assert (result["changed"], result["state"]) == (False, "up_to_date")


# Progress and warnings


def test_progress_lines_come_back_in_the_result_and_nothing_is_printed(live, capsys):
    result = run_staged_rebuild(capsys, live.args(rebuild="always"))  # run_module: stdout is only JSON

    assert "== building and installing TinyApp/1.0..." in result["progress"]
    assert "== COMPLETED: Installation ended successfully" in result["progress"]
    assert backends.UNSANDBOXED in result["progress"]


def test_an_unsandboxed_build_is_a_warning(live, capsys):
    result = run_staged_rebuild(capsys, live.args(rebuild="always"))

    assert warnings_of(result) == [backends.UNSANDBOXED]


def test_an_unrelocated_binary_is_refused(live, capsys, monkeypatch):
    monkeypatch.setenv("TEST_EB_BINARY", "1")
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(rebuild="always"))

    assert result["failed"] is True
    assert result["msg"].startswith("binaries still name the build path ")
    # Why (EasyBuild's RPATH) and what the host needs instead, then the way to accept them.
    assert f"; nothing was swapped. {rebuild.UNRELOCATED_WHY} (allow_unrelocated publishes" in result["msg"]
    assert "sysctl user.max_user_namespaces" in result["msg"]
    assert result["msg"].endswith(
        "(allow_unrelocated publishes them as they are, runnable only where the module environment "
        "finds their libraries)"
    )
    assert "\n" not in result["msg"]
    assert live.trees() == before


def test_allow_unrelocated_publishes_with_the_warning(live, capsys, monkeypatch):
    monkeypatch.setenv("TEST_EB_BINARY", "1")

    result = run_staged_rebuild(capsys, live.args(rebuild="always", allow_unrelocated=True))

    assert result["state"] == "published"
    (unrelocated,) = [warning for warning in warnings_of(result) if warning != backends.UNSANDBOXED]
    assert unrelocated.startswith("published with binaries that name the removed build path ")
    assert unrelocated.endswith(str(live.site.live(APP) / "bin" / "tinyapp"))


# Refusals: failed, the one-line message, nothing changed

# Each case: the options, the message, and the failure's ``error`` kind (None: Ansible's own).
REFUSALS = {
    "no module": (
        lambda live, tmp_path: {"modules": []},
        "rebuild needs at least one modules NAME/VERSION",
        "usage",
    ),
    "bad NAME/VERSION": (
        lambda live, tmp_path: {"modules": ["TinyApp"]},
        "modules 'TinyApp' is not NAME/VERSION of plain names (no '..', no '/', no leading '.')",
        "usage",
    ),
    "a path as NAME/VERSION": (
        lambda live, tmp_path: {"modules": ["../1.0"]},
        "modules '../1.0' is not NAME/VERSION of plain names (no '..', no '/', no leading '.')",
        "usage",
    ),
    "module given twice": (
        lambda live, tmp_path: {"modules": [APP, APP], "rebuild": "always"},
        "modules TinyApp/1.0 is given twice",
        "usage",
    ),
    "bad run id": (
        lambda live, tmp_path: {"run_id": "../x", "rebuild": "always"},
        "run id '../x' is not a plain name ([A-Za-z0-9._-], at most 128)",
        "usage",
    ),
    "empty run id": (
        lambda live, tmp_path: {"run_id": "", "rebuild": "always"},
        "run id '' is not a plain name ([A-Za-z0-9._-], at most 128)",
        "usage",
    ),
    "bad backend": (
        lambda live, tmp_path: {"backend": "chroot"},
        "value of backend must be one of: auto, bwrap, userns, installpath, got: chroot",
        None,
    ),
    "bad rebuild": (
        lambda live, tmp_path: {"rebuild": "sometimes"},
        "value of rebuild must be one of: changed, always, got: sometimes",
        None,
    ),
    "both installpath forms": (
        lambda live, tmp_path: {"installpath_software": "/s", "installpath_modules": "/m"},
        "parameters are mutually exclusive: installpath|installpath_software, "
        "installpath|installpath_modules",
        None,
    ),
    "installpath_software alone": (
        lambda live, tmp_path: {"installpath": None, "installpath_software": "/s"},  # None: left out
        "parameters are required together: installpath_software, installpath_modules",
        None,
    ),
    "missing eb": (
        lambda live, tmp_path: {"eb": str(tmp_path / "no-such-eb")},
        "EasyBuild command {tmp_path}/no-such-eb is not an executable file (eb, EB_STAGED_REBUILD_EB)",
        "usage",
    ),
    "missing state root": (
        lambda live, tmp_path: {"state_root": None, "rebuild": "always"},  # None: left out
        "no state root: give state_root DIR or set EB_STAGED_REBUILD_STATE_ROOT",
        "usage",
    ),
    "missing ledger config": (
        lambda live, tmp_path: {"ledger_config": str(tmp_path / "no-ledger.json"), "rebuild": "always"},
        "cannot read ledger_config {tmp_path}/no-ledger.json: No such file or directory",
        "usage",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_request_fails_with_one_line_and_changes_nothing(live, capsys, tmp_path, case):
    options, message, error = REFUSALS[case]
    before = live.trees()

    args = live.args(**options(live, tmp_path))

    result = run_staged_rebuild(capsys, {key: value for key, value in args.items() if value is not None})

    assert_failed_with(result, message.format(tmp_path=tmp_path))
    # The core's refusals carry their stable kind; Ansible's own argument checks have none.
    assert result.get("error") == error
    assert live.builds() == []
    assert live.trees() == before
    assert not live.site.state_root.exists()


def test_a_module_that_is_not_installed_is_refused(live, capsys):
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(modules=["Missing/1.0"]))

    missing = live.site.software / "Missing" / "1.0"
    assert_failed_with(
        result,
        f"Missing/1.0 is not installed: {missing} does not exist "
        "(a staged rebuild replaces an existing install)",
    )
    assert live.trees() == before


def test_no_install_path_anywhere_is_refused(live, capsys):
    args = live.args()
    del args["installpath"]

    result = run_staged_rebuild(capsys, args)

    assert_failed_with(
        result, "no install path for software: give installpath DIR (or set EASYBUILD_INSTALLPATH)"
    )


def test_eb_missing_from_path_is_refused(live, capsys, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    args = live.args(rebuild="always")
    del args["eb"]

    result = run_staged_rebuild(capsys, args)

    assert_failed_with(result, "EasyBuild command eb is not an executable file (eb, EB_STAGED_REBUILD_EB)")


def test_a_failed_build_fails_with_one_line_and_changes_nothing_live(live, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_EB_FAIL", "1")
    before = live.trees()

    result = run_staged_rebuild(capsys, live.args(rebuild="always"))

    assert result["failed"] is True
    assert result["msg"].startswith("EasyBuild failed (exit 1)")
    assert "build.log" in result["msg"]
    # The fields of the failure: where the log is, and EasyBuild's reason (the builder gave none).
    assert result["build_log"].endswith("/build.log")
    assert result["build_log"] in result["msg"]
    assert result["easybuild_reason"] is None
    assert "\n" not in result["msg"]
    assert "exception" not in result
    assert live.trees() == before


def test_check_mode_refuses_what_the_run_would_refuse(live, capsys):
    result = run_staged_rebuild(capsys, live.args(modules=["Missing/1.0"]), check_mode=True)

    assert result["failed"] is True
    assert result["msg"].startswith("Missing/1.0 is not installed: ")
