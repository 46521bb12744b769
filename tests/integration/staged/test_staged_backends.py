"""Each build backend of ``eb-staged-rebuild``, driven with the real EasyBuild and Lmod.

For every backend (bwrap, userns, installpath) and for both kinds of build user (root, and
the unprivileged ``hpcstack-test``), a live tree built by plain ``eb`` from the first
generation of the tiny packages is rebuilt through the tool from a second generation (a
different greeting, so a different source checksum). The result must be live at the stable
path, runnable through ``module load``, carry only final live paths, keep the old tree at the
retired path, and belong to the build user. The one-package tree (TinyLib alone) and the
dependency chain (TinyLib, then TinyApp which prints TinyLib's greeting) are separate cases.

The installpath backend's relocation (text rewritten, binaries refused unless
``--allow-unrelocated``) and the build progress on stderr are here too.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat

import pytest

import tinypkgs
from tests.integration.harness.ebsite import APP, LIB, OWNERS, grep_bytes, result_json

BACKENDS = ("bwrap", "userns", "installpath")
NEW_GREETING = "hello from TinyLib 1.0, second generation"
SHAPES = {
    # shape: (modules installed live and rebuilt, what `module load` runs, what it prints)
    "one-package": (
        (LIB,),
        f'module load {LIB} && cat "$EBROOTTINYLIB/share/tinylib/greeting.txt"',
    ),
    "chain": ((LIB, APP), f"module load {APP} && tinyapp"),
}
BIN = f"{tinypkgs.BIN}/{tinypkgs.VERSION}"


def _live_site(eb_site_factory, owner, *names):
    """A site whose live tree holds ``names`` built by plain eb from the first generation."""
    site = eb_site_factory(owner)
    old = site.write_packages("gen1")
    site.install(old, *names)
    return site


def _published_roots(site, modules):
    return [site.live(module) for module in modules] + [site.modules]


def _stage_paths(site, run_id, modules):
    """Every path a build of ``run_id`` used that must not survive into the published files."""
    stages = [site.generation(run_id)]
    for module in modules:
        name, version = module.split("/")
        stages.append(site.software / name / f".{version}.{run_id}")
    return stages


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_rebuild_publishes_the_new_build_live_with_live_paths_class_links_and_owner(
    eb_site_factory, backend, owner, shape
):
    """The rebuilt tree is live, runnable, relocated, linked, and the build user's.

    New inode at the stable path, the old one at the retired path; ``module load`` runs the
    new build; no published file names the generation or the stage; the class links name
    the live module files; the build user owns every published file.
    """
    modules, script = SHAPES[shape]
    names = [module.split("/")[0] for module in modules]
    site = _live_site(eb_site_factory, owner, *names)
    old_inodes = {module: site.live(module).stat().st_ino for module in modules}
    assert site.module_shell(script).stdout.strip() == tinypkgs.GREETING
    new = site.write_packages("gen2", greeting=NEW_GREETING)

    done = site.rebuild(modules, new, backend=backend, eb_args=("--robot",))
    result = result_json(done)

    # --json: EasyBuild's step lines stay out of stderr.
    assert [line for line in done.stderr.splitlines() if line.startswith("==")] == []
    assert result["backend"] == backend
    assert result["sandboxed"] is (backend != "installpath")
    assert (result["state"], result["changed"]) == ("published", True)
    run_id = result["run_id"]
    assert [entry["module"] for entry in result["modules"]] == list(modules)
    for entry in result["modules"]:
        name, version = entry["module"].split("/")
        assert entry["stable_path"] == str(site.live(entry["module"]))
        assert entry["retired_path"] == str(site.software / name / f".{version}.{run_id}")
        # The old tree, the very directory that was live, is kept at the retired path.
        assert os.lstat(entry["retired_path"]).st_ino == old_inodes[entry["module"]]
        assert site.live(entry["module"]).stat().st_ino != old_inodes[entry["module"]]

    loaded = site.module_shell(script)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == NEW_GREETING

    for stage in _stage_paths(site, run_id, modules):
        assert grep_bytes(os.fsencode(stage), *_published_roots(site, modules)) == [], stage
    assert not site.generation(run_id).exists()
    # The devel file is a module file whose Lmod table (MODULEPATH included) is base64, where
    # grep cannot see the build path.
    for module in modules:
        name, version = module.split("/")
        table = _lmod_module_table(site.live(module) / "easybuild" / f"{name}-{version}-easybuild-devel")
        assert str(site.modules_all) in table
        assert [str(stage) for stage in _stage_paths(site, run_id, modules) if str(stage) in table] == []

    for module in modules:
        link = site.class_link(module)
        assert link.is_symlink(), link
        assert os.readlink(link) == str(site.module_file(module))
        published = [site.live(module), *site.live(module).rglob("*"), site.module_file(module)]
        assert [str(path) for path in published if os.lstat(path).st_uid != site.uid] == []


def _lmod_module_table(devel_file):
    """The Lmod module table a devel file sets, decoded (Lmod stores it base64 in ``_ModuleTableNNN_``)."""
    text = devel_file.read_text()
    # As Lmod reads it: chunks 1.._ModuleTable_Sz_; a chunk past that is a leftover it ignores.
    chunks = dict(re.findall(r'setenv\("_ModuleTable(\d+)_", "([^"]*)"\)', text))
    size = re.search(r'setenv\("_ModuleTable_Sz_", "(\d+)"\)', text)
    size = int(size.group(1)) if size else len(chunks)
    return base64.b64decode("".join(chunks[f"{number:03d}"] for number in range(1, size + 1))).decode()


def test_auto_picks_bwrap_on_this_machine_and_reports_it(eb_site_factory):
    site = _live_site(eb_site_factory, "user", tinypkgs.LIB)
    new = site.write_packages("gen2", greeting=NEW_GREETING)

    result = result_json(site.rebuild((LIB,), new))

    assert (result["backend"], result["sandboxed"]) == ("bwrap", True)


# --- installpath backend: relocation ------------------------------------------------------


def _with_warnings(done):
    """The ``--json`` result of a run that published with warnings (exit 1: done, with warnings)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def _binary_site(eb_site_factory, owner):
    site = eb_site_factory(owner)
    packages = site.write_binary_package("bin")
    site.install(packages, tinypkgs.BIN)
    return site, packages


@pytest.mark.parametrize("owner", OWNERS)
def test_installpath_refuses_a_binary_that_names_the_build_path_and_lists_it(eb_site_factory, owner):
    site, packages = _binary_site(eb_site_factory, owner)
    before = site.snapshot()

    done = site.rebuild((BIN,), packages, backend="installpath")

    assert done.returncode == 2, (done.stdout, done.stderr)
    refusals = [line for line in done.stderr.splitlines() if line.startswith("eb-staged-rebuild: ")]
    refusal = [line for line in refusals if "backend installpath" not in line]
    assert len(refusal) == 1, done.stderr
    assert "share/tinybin/prefix.bin" in refusal[0]
    assert "--allow-unrelocated" in refusal[0]
    assert site.snapshot() == before


@pytest.mark.parametrize("owner", OWNERS)
def test_installpath_publishes_an_unrelocated_binary_with_allow_unrelocated(eb_site_factory, owner):
    site, packages = _binary_site(eb_site_factory, owner)
    old_inode = site.live(BIN).stat().st_ino

    result = _with_warnings(
        site.rebuild((BIN,), packages, backend="installpath", extra=("--allow-unrelocated",))
    )

    assert result["state"] == "published"
    assert site.live(BIN).stat().st_ino != old_inode
    binary = (site.live(BIN) / "share" / "tinybin" / "prefix.bin").read_bytes()
    # Left as EasyBuild wrote it: it names the build path, which the run reports.
    assert os.fsencode(site.generation(result["run_id"])) in binary
    assert any("prefix.bin" in warning for warning in result["warnings"]), result


def test_a_warning_in_text_says_warning_and_the_run_still_succeeds_with_exit_1(eb_site_factory):
    site, packages = _binary_site(eb_site_factory, "root")

    done = site.rebuild(
        (BIN,), packages, backend="installpath", extra=("--allow-unrelocated",), json_output=False
    )

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.startswith("Published run ")
    notices = [line for line in done.stderr.splitlines() if line.startswith("eb-staged-rebuild: ")]
    assert len(notices) == 2, done.stderr
    assert all(line.startswith("eb-staged-rebuild: warning: ") for line in notices)
    assert notices[0].startswith("eb-staged-rebuild: warning: backend installpath: EasyBuild runs WITHOUT")
    unrelocated = "eb-staged-rebuild: warning: published with binaries that name the removed build path "
    assert notices[1].startswith(unrelocated)
    assert notices[1].endswith(str(site.live(BIN) / "share" / "tinybin" / "prefix.bin"))


@pytest.mark.parametrize("owner", OWNERS)
def test_installpath_rewrites_the_build_path_in_text_files_to_the_live_path(eb_site_factory, owner):
    site, packages = _binary_site(eb_site_factory, owner)

    result = _with_warnings(
        site.rebuild((BIN,), packages, backend="installpath", extra=("--allow-unrelocated",))
    )

    live = site.live(BIN)
    generation = str(site.generation(result["run_id"]))
    script = live / "bin" / "tinybin-prefix"
    devel = live / "easybuild" / f"{tinypkgs.BIN}-{tinypkgs.VERSION}-easybuild-devel"
    module_file = site.module_file(BIN)
    for path in (script, devel, module_file):
        assert generation not in path.read_text(), path
    assert f"echo {live}\n" in script.read_text()
    assert f'local root = "{live}"' in module_file.read_text()
    # The devel file records the build's environment: MODULEPATH named the generation's modules.
    assert f'setenv("MODULEPATH", "{site.modules_all}' in devel.read_text()
    # The script keeps its mode (it is still executable) and prints the live path.
    assert script.stat().st_mode & stat.S_IXUSR
    ran = site.module_shell(f"module load {BIN} && tinybin-prefix")
    assert ran.stdout.strip() == str(live), ran.stderr
    binaries = grep_bytes(os.fsencode(generation), live, site.modules)
    assert binaries == [str(live / "share" / "tinybin" / "prefix.bin")]


@pytest.mark.parametrize("backend", ["bwrap", "userns"])
def test_sandboxed_backends_build_binaries_that_name_the_live_path(eb_site_factory, backend):
    site, packages = _binary_site(eb_site_factory, "user")

    result = result_json(site.rebuild((BIN,), packages, backend=backend))

    binary = (site.live(BIN) / "share" / "tinybin" / "prefix.bin").read_bytes()
    assert binary == b"TinyBin\0" + os.fsencode(site.live(BIN)) + b"\0"
    assert result["warnings"] == []


def test_bwrap_stage_is_an_ordinary_directory_at_the_live_path_and_its_siblings_read_only(eb_site_factory):
    """EasyBuild's --rebuild removes the stage it finds at the live path. A stage bind-mounted
    there is a mount point: the removal fails with EBUSY three times, 2 s apart, and EasyBuild
    empties it instead. In the view it is an ordinary directory that goes at once; the other
    versions of the Name are there, read-only, and stay as they were."""
    site = _live_site(eb_site_factory, "user", tinypkgs.LIB)
    sibling = site.software / "TinyLib" / "0.9"
    sibling.mkdir()
    (sibling / "PAYLOAD").write_text("the other version\n")
    site.give(sibling)
    new = site.write_packages("gen2", greeting=NEW_GREETING)
    tinypkgs.write_sibling_probe(new, tinypkgs.LIB, sibling)
    before = site.snapshot_of(sibling, sibling / "PAYLOAD")

    result = result_json(site.rebuild((LIB,), new, backend="bwrap"))

    live = site.live(LIB)
    (eb_log,) = (live / "easybuild").glob("easybuild-TinyLib-*.log")
    log = eb_log.read_text()
    assert f"Path {live} successfully removed." in log
    assert "successfully emptied" not in log
    assert (live / "sibling-probe").read_text() == "the other version\nRead-only file system\n"
    assert site.snapshot_of(sibling, sibling / "PAYLOAD") == before
    assert result["state"] == "published"


# --- progress -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_json_easybuild_step_lines_go_to_stderr(eb_site_factory, backend):
    site = _live_site(eb_site_factory, "user", tinypkgs.LIB)
    new = site.write_packages("gen2", greeting=NEW_GREETING)

    done = site.rebuild((LIB,), new, backend=backend, json_output=False)

    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stderr.splitlines() if line.startswith("== ")]
    assert "== building..." in steps
    assert "== sanity checking..." in steps
    assert any(line.startswith("== COMPLETED") for line in steps), steps


# bwrap: the publish matrix above checks its stderr with --json.
@pytest.mark.parametrize("backend", ["userns", "installpath"])
def test_with_json_stderr_has_no_easybuild_step_lines(eb_site_factory, backend):
    site = _live_site(eb_site_factory, "user", tinypkgs.LIB)
    new = site.write_packages("gen2", greeting=NEW_GREETING)

    done = site.rebuild((LIB,), new, backend=backend)

    result_json(done)
    assert [line for line in done.stderr.splitlines() if line.startswith("==")] == []
    # The only line allowed: the installpath backend says it is not sandboxed.
    lines = done.stderr.splitlines()
    if backend == "installpath":
        assert len(lines) == 1, lines
        assert lines[0].startswith("eb-staged-rebuild: warning: backend installpath:")
        assert "sandbox" in lines[0]
    else:
        assert lines == []
