"""A hand-edited journal cannot make a command act outside the trees its run used.

Every path a journal names is checked as the journal is loaded, against where this state
root's own runs put it: the stable path and the hidden sibling under the run's software
root, the module file under its module root, the live record, prepared module and backup
in the run's directory, module classes as plain names, no symlinked component below a
tree; a retire keeps its module file at one place only,
``<state-root>/retired/<stamp>/<path>``. When the command is given its trees
(``--installpath``, or EasyBuild's variables), a journal of other trees is refused too. A
journal that points elsewhere is refused whole, in one line, exit 2, by every command that
would act on it, and neither the files it names nor the trees change.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.support.staged import StagedSite, snapshot

APP = "TinyApp/1.0"
PREFIX = "eb-staged-rebuild: "


def _journal_of(site, run_id):
    return site.state_root / "runs" / run_id / "journal.json"


def _edit(journal, change):
    data = json.loads(journal.read_text())
    change(data)
    journal.write_text(json.dumps(data))


def _refused(done, journal, why):
    """One line naming the journal and ``why``; exit 2; no traceback, nothing on stdout."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{PREFIX}journal {journal}: "), line
    assert why in line, line
    assert done.stdout == ""


# --- publish runs --------------------------------------------------------------------------


def _published(site):
    site.install(APP)
    done = site.rebuild(APP)
    assert done.returncode == 0, done.stderr
    (run_id,) = os.listdir(site.state_root / "runs")
    return run_id


def _entry(data):
    return data["modules"][0]


def _victim_tree(victim, run_id):
    """A tree elsewhere that looks like a live one: what an edited journal would hand over."""
    for path in (victim / "TinyApp" / "1.0", victim / "TinyApp" / f".1.0.{run_id}"):
        path.mkdir(parents=True)
        (path / "PAYLOAD").write_text("precious\n")
    module = victim / "all" / "TinyApp" / "1.0.lua"
    module.parent.mkdir(parents=True)
    module.write_text('local root = "/victim"\n')


def _point(field, at):
    def change(data, site, victim, run_id):
        _entry(data)[field] = at(site, victim, run_id)

    return change


def _stable_elsewhere(site, victim, run_id):
    return str(victim / "TinyApp" / "1.0")


def _sibling_elsewhere(site, victim, run_id):
    return str(victim / "TinyApp" / f".1.0.{run_id}")


def _module_elsewhere(site, victim, run_id):
    return str(victim / "all" / "TinyApp" / "1.0.lua")


def _run_file_elsewhere(site, victim, run_id):
    return str(victim / "all" / "TinyApp" / "1.0.lua")


def _other_run_dir(kind):
    # The same file name in another run's directory: still not where this run keeps it.
    def at(site, victim, run_id):
        return str(site.state_root / "runs" / "other-run" / kind / "TinyApp" / "1.0.lua")

    return at


def _class_link(name):
    def change(data, site, victim, run_id):
        _entry(data)["class_links"] = [name]

    return change


def _class_previous(name):
    def change(data, site, victim, run_id):
        _entry(data)["class_link_previous"] = {name: "../all/TinyApp/1.0.lua"}

    return change


def _dotted(field, rewrite):
    def change(data, site, victim, run_id):
        _entry(data)[field] = rewrite(_entry(data)[field])

    return change


def _victim_trees(data, site, victim, run_id):
    """Trees, request and every entry moved to the victim tree, consistent with each other."""
    software, modules = str(victim), str(victim / "modules")
    data["trees"] = {"software": software, "modules": modules}
    data["request"]["software"], data["request"]["modules"] = software, modules
    entry = _entry(data)
    entry["stable_path"] = str(victim / "TinyApp" / "1.0")
    entry["retired_path"] = str(victim / "TinyApp" / f".1.0.{run_id}")
    # prepared_module and module_backup name only the module file's base name: unchanged.
    entry["module_file"] = str(victim / "modules" / "all" / "TinyApp" / "1.0.lua")


def _trees_only(data, site, victim, run_id):
    data["trees"]["software"] = str(victim)


# (what is edited, the edit, what the one line names)
EDITS = [
    pytest.param(_point("stable_path", _stable_elsewhere), "modules[0].stable_path", id="stable-path"),
    pytest.param(_point("retired_path", _sibling_elsewhere), "modules[0].retired_path", id="retired-path"),
    pytest.param(_point("module_file", _module_elsewhere), "modules[0].module_file", id="module-file"),
    pytest.param(
        _point("module_backup", _run_file_elsewhere), "modules[0].module_backup", id="module-backup"
    ),
    pytest.param(
        _point("prepared_module", _run_file_elsewhere), "modules[0].prepared_module", id="prepared-module"
    ),
    pytest.param(_point("live_record", _run_file_elsewhere), "modules[0].live_record", id="live-record"),
    pytest.param(
        _point("module_backup", _other_run_dir("backup")), "modules[0].module_backup", id="backup-other-run"
    ),
    pytest.param(_class_link("../x"), "modules[0].class_links[0]", id="class-link-dot-dot"),
    pytest.param(_class_link("all"), "modules[0].class_links[0]", id="class-link-all"),
    pytest.param(_class_previous("../x"), "modules[0].class_link_previous", id="class-previous-dot-dot"),
    pytest.param(
        _dotted("stable_path", lambda path: path.replace("/TinyApp/", "/TinyApp/./")),
        "modules[0].stable_path",
        id="stable-path-with-dot",
    ),
    pytest.param(
        _dotted("retired_path", lambda path: path.replace("/TinyApp/", "//TinyApp/")),
        "modules[0].retired_path",
        id="retired-path-with-double-slash",
    ),
    pytest.param(_trees_only, "trees (", id="trees-not-the-request-s"),
]

# The commands that act on a publish run, and status (which reads it).
COMMANDS = [
    ("rollback", "{run_id}"),
    ("resume", "{run_id}"),
    ("gc", "--grace-hours", "0"),
    ("status", "{run_id}"),
]


def _assert_each_command_refuses(site, run_id, why, roots):
    journal = _journal_of(site, run_id)
    before = snapshot(*roots)
    for command in COMMANDS:
        done = site.run(*(arg.format(run_id=run_id) for arg in command))
        _refused(done, journal, why)
        assert snapshot(*roots) == before, command


@pytest.fixture(scope="module")
def _published_once(tmp_path_factory, package_root):
    """One published run per test process: every edit is refused, so none changes the site,
    and each test gets the run's own journal back (``published``)."""
    root = tmp_path_factory.mktemp("published")
    site = StagedSite(installpath=root / "apps", state_root=root / "state", package_root=package_root)
    run_id = _published(site)
    return site, run_id, _journal_of(site, run_id).read_bytes()


@pytest.fixture
def published(_published_once):
    site, run_id, original = _published_once
    journal = _journal_of(site, run_id)
    journal.write_bytes(original)
    yield site, run_id
    journal.write_bytes(original)


@pytest.mark.parametrize(("edit", "why"), EDITS)
def test_a_publish_journal_pointing_outside_its_run_is_refused_by_every_command(
    published, tmp_path, edit, why
):
    site, run_id = published
    victim = tmp_path / "victim"
    _victim_tree(victim, run_id)
    _edit(_journal_of(site, run_id), lambda data: edit(data, site, victim, run_id))

    _assert_each_command_refuses(site, run_id, why, (site.software, site.modules, site.state_root, victim))

    assert (victim / "TinyApp" / f".1.0.{run_id}" / "PAYLOAD").read_text() == "precious\n"


def test_a_journal_moved_whole_to_another_tree_is_refused_when_the_tree_is_given(published, tmp_path):
    """Trees, request and entries all name the victim tree: consistent in themselves, so
    only the trees given to the command tell them apart (the option, then the variable)."""
    site, run_id = published
    victim = tmp_path / "victim"
    for path in (victim / "TinyApp" / "1.0", victim / "TinyApp" / f".1.0.{run_id}"):
        path.mkdir(parents=True)
        (path / "PAYLOAD").write_text("precious\n")
    _edit(_journal_of(site, run_id), lambda data: _victim_trees(data, site, victim, run_id))
    roots = (site.software, site.modules, site.state_root, victim)
    before = snapshot(*roots)
    journal = _journal_of(site, run_id)

    for extra, env in (
        ((f"--installpath={site.installpath}",), None),
        ((), {"EASYBUILD_INSTALLPATH": site.installpath}),
    ):
        for command in (("rollback", run_id), ("resume", run_id), ("gc", "--grace-hours", "0")):
            done = site.run(*command, *extra, env=env)
            _refused(done, journal, f"trees.software {victim} and trees.modules {victim / 'modules'} are not")
            assert snapshot(*roots) == before, (command, extra, env)

    assert (victim / "TinyApp" / f".1.0.{run_id}" / "PAYLOAD").read_text() == "precious\n"


def test_a_journal_moved_whole_to_another_tree_acts_on_nothing_there_when_no_tree_is_given(
    published, tmp_path
):
    """No tree given: the journal's own trees count, and the disk tells them apart. gc
    removes only the directory the run left (its recorded inode), rollback exchanges only
    the tree the run made live."""
    site, run_id = published
    victim = tmp_path / "victim"
    for path in (victim / "TinyApp" / "1.0", victim / "TinyApp" / f".1.0.{run_id}"):
        path.mkdir(parents=True)
        (path / "PAYLOAD").write_text("precious\n")
    _edit(_journal_of(site, run_id), lambda data: _victim_trees(data, site, victim, run_id))
    roots = (site.software, site.modules, site.state_root, victim)
    before = snapshot(*roots)
    sibling = victim / "TinyApp" / f".1.0.{run_id}"

    for command, why in (
        (("gc", "--grace-hours", "0"), f"records {sibling}, which is not the tree the run left there"),
        (("rollback", run_id), f"is no longer live at {victim / 'TinyApp' / '1.0'}"),
    ):
        done = site.run(*command)
        assert done.returncode == 2, (command, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith(PREFIX), line
        assert why in line, line
        assert snapshot(*roots) == before, command


def test_an_intact_journal_passes_the_tree_check_when_its_tree_is_given(staged_site):
    site = staged_site
    run_id = _published(site)

    for command in (("resume", run_id), ("gc", "--grace-hours", "0", "--dry-run"), ("rollback", run_id)):
        done = site.run(*command, f"--installpath={site.installpath}")
        assert done.returncode == 0, (command, done.stderr)

    assert site.payload(APP) == "old"


def _link_name_dir(site, tmp_path, tree):
    """``<tree>/TinyApp`` moved to a victim directory and replaced by a link to it."""
    victim = tmp_path / "victim"
    os.rename(tree / "TinyApp", victim)
    (tree / "TinyApp").symlink_to(victim)
    return victim


@pytest.mark.parametrize(
    ("tree", "why"),
    [
        pytest.param("software", "modules[0].stable_path: ", id="software-name-dir"),
        pytest.param("modules_all", "modules[0].module_file: ", id="module-name-dir"),
    ],
)
def test_a_journal_whose_path_leads_through_a_symlinked_directory_is_refused(published, tmp_path, tree, why):
    site, run_id = published
    name_dir = getattr(site, tree) / "TinyApp"
    victim = _link_name_dir(site, tmp_path, getattr(site, tree))
    try:
        roots = (site.software, site.modules, site.state_root, victim)
        _assert_each_command_refuses(site, run_id, why + f"{name_dir} is a symbolic link", roots)
    finally:
        name_dir.unlink()
        os.rename(victim, name_dir)


# --- retire runs ---------------------------------------------------------------------------


def _retire(site):
    site.install(APP)
    done = site.run("--json", "retire", str(site.module_file(APP)), "--reason", "on /cvmfs")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    journal = site.state_root / "runs" / result["run_id"] / "journal.json"
    return result, journal


def _edit_fields(journal, **fields):
    _edit(journal, lambda data: data.update(fields))


@pytest.mark.parametrize("edited", ["retired_to", "module_file", "both"])
def test_rollback_of_a_retire_whose_journal_points_elsewhere_is_refused(staged_site, tmp_path, edited):
    site = staged_site
    result, journal = _retire(site)
    victim = tmp_path / "victim" / "secret.txt"
    victim.parent.mkdir()
    victim.write_text("not a module file\n")
    target = tmp_path / "elsewhere" / "planted.lua"
    fields = {
        "retired_to": {"retired_to": str(victim)},
        "module_file": {"module_file": str(target)},
        "both": {"retired_to": str(victim), "module_file": str(target)},
    }[edited]
    _edit_fields(journal, **fields)
    before = site.snapshot()

    done = site.run("rollback", result["run_id"])

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"eb-staged-rebuild: journal {journal}: retired_to ")
    assert "Traceback" not in done.stderr
    assert victim.read_text() == "not a module file\n"
    assert not target.exists()
    assert site.snapshot() == before


def _consistent_retire(site, run_id, module_file):
    """``module_file`` with the ``retired_to`` a retire of it would have had: only the module
    file's own place can be wrong."""
    stamp = run_id[len("retire-") :]
    return {
        "module_file": str(module_file),
        "retired_to": str(site.state_root / "retired" / stamp / str(module_file).lstrip("/")),
        # As retire records it: under the software root beside the module file's tree.
        "software_dir": str(module_file.parents[3] / "software" / "TinyApp" / "1.0"),
    }


@pytest.mark.parametrize(
    ("place", "why", "given"),
    [
        pytest.param(
            "victim/planted.lua", "module_file {path} is not in a module tree", False, id="not-a-module-tree"
        ),
        pytest.param(
            "victim/modules/all/TinyApp/1.0.lua",
            "module_file {path} is not under the module tree given",
            True,
            id="other-module-tree-given",
        ),
    ],
)
def test_rollback_of_a_retire_of_a_file_outside_a_module_tree_is_refused(
    staged_site, tmp_path, place, why, given
):
    site = staged_site
    result, journal = _retire(site)
    target = tmp_path / place
    # The retired copy is where the edited journal says: only the module file's place is wrong.
    source = site.state_root / "retired" / result["run_id"][len("retire-") :] / str(target).lstrip("/")
    source.parent.mkdir(parents=True)
    shutil.copy(result["retired_to"], source)
    _edit_fields(journal, **_consistent_retire(site, result["run_id"], target))
    roots = (site.software, site.modules, site.state_root, tmp_path / "victim")
    before = snapshot(*roots)

    extra = (f"--installpath={site.installpath}",) if given else ()
    for command in (("rollback", result["run_id"]), ("gc", "--grace-hours", "0")):
        done = site.run(*command, *extra)
        _refused(done, journal, why.format(path=target))
        assert snapshot(*roots) == before, command

    assert not target.exists()


def test_a_retire_whose_software_dir_is_outside_its_software_root_is_refused(staged_site, tmp_path):
    site = staged_site
    result, journal = _retire(site)
    victim = tmp_path / "victim" / "TinyApp" / "1.0"
    victim.mkdir(parents=True)
    _edit_fields(journal, software_dir=str(victim))
    roots = (site.software, site.modules, site.state_root, victim.parent)
    before = snapshot(*roots)

    for command in (("gc", "--grace-hours", "0"), ("rollback", result["run_id"]), ("status",)):
        done = site.run(*command)
        _refused(done, journal, f"software_dir {victim} is not under {site.software}")
        assert snapshot(*roots) == before, command
