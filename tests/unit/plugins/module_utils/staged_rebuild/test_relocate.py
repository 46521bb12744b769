"""Relocation: a staged tree built under the generation gets the final live paths.

The layout is the contract's: the generation ``<installpath>/software/.eb-staged-rebuild/<run_id>``
holds ``software/Name/version`` and ``modules/all/Name``. Files are real; the build user's
cases run ``relocate`` in a child process under ``setpriv`` as the unprivileged test user,
because root ignores the permission bits that a sealed install (``--read-only-installdir``)
relies on.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import relocate
from tests.support.deep import nest

RUN_ID = "run1"
OLD_TIME_NS = 1_000_000_000 * 1_000_000_000  # 2001-09-09, far from "now"
# relocate() as the test user: argv is (roots as JSON, generation, software, modules).
AS_USER = r"""
import json, sys
from hpcstack_ops.staged_rebuild import relocate
roots, generation, software, modules = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rewritten, binaries = relocate.relocate(roots, relocate.mapping(generation, software, modules))
print(json.dumps({"rewritten": rewritten, "binaries": binaries}))
"""


class Site:
    """A live install path and one run's generation with Tiny/1.0 staged in it."""

    def __init__(self, installpath):
        self.installpath = installpath
        self.software = installpath / "software"
        self.modules = installpath / "modules"
        self.generation = self.software / ".eb-staged-rebuild" / RUN_ID
        self.stage = self.generation / "software" / "Tiny" / "1.0"
        self.stage_modules = self.generation / "modules" / "all" / "Tiny"
        self.stage.mkdir(parents=True)
        self.stage_modules.mkdir(parents=True)

    def rewrites(self):
        return relocate.mapping(str(self.generation), str(self.software), str(self.modules))

    def relocate(self, *roots):
        rewritten, binaries = relocate.relocate(
            [str(root) for root in roots or self.roots()], self.rewrites()
        )
        return sorted(rewritten), sorted(binaries)

    def roots(self):
        return [self.stage, self.stage_modules]

    def staged_text(self):
        """Text naming each of the three generation paths."""
        return (
            f'local root = "{self.generation}/software/Tiny/1.0"\n'
            f'prepend_path("MODULEPATH", "{self.generation}/modules/all")\n'
            f"eb --bwrap-installpath={self.generation}\n"
        )

    def live_text(self):
        return (
            f'local root = "{self.software}/Tiny/1.0"\n'
            f'prepend_path("MODULEPATH", "{self.modules}/all")\n'
            f"eb --bwrap-installpath={self.installpath}\n"
        )


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path / "apps")


@pytest.fixture
def user_site(unprivileged_user):
    """A Site in a directory the test user owns; each test chowns what it makes, then seals it."""
    base = Path(tempfile.mkdtemp(prefix="hpcstack-relocate-"))
    os.chown(base, unprivileged_user.uid, unprivileged_user.gid)
    yield Site(base / "apps")
    shutil.rmtree(base)


def _chown_tree(root, user):
    for directory, dirs, files in os.walk(root):
        os.chown(directory, user.uid, user.gid)
        for name in dirs + files:
            os.chown(os.path.join(directory, name), user.uid, user.gid, follow_symlinks=False)


def _relocate_as(user, package_dir, site):
    roots = json.dumps([str(root) for root in site.roots()])
    env = dict(user.env(), PYTHONPATH=str(package_dir))
    done = user.run(
        [sys.executable, "-c", AS_USER, roots, str(site.generation), str(site.software), str(site.modules)],
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _state(path):
    """Bytes and the stat fields a rewrite must keep (or, for untouched files, not even touch)."""
    info = os.lstat(path)
    return {
        "bytes": Path(path).read_bytes(),
        "mode": info.st_mode,
        "uid": info.st_uid,
        "gid": info.st_gid,
        "ino": info.st_ino,
        "nlink": info.st_nlink,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
    }


def _age(path):
    os.utime(path, ns=(OLD_TIME_NS, OLD_TIME_NS), follow_symlinks=False)


# mapping


def test_mapping_puts_the_generation_trees_before_the_generation_itself():
    rewrites = relocate.mapping("/apps/software/.g/run1", "/apps/software", "/apps/modules")

    assert rewrites == [
        (b"/apps/software/.g/run1/software", b"/apps/software"),
        (b"/apps/software/.g/run1/modules", b"/apps/modules"),
        (b"/apps/software/.g/run1", b"/apps"),
    ]


def test_mapping_turns_the_bare_generation_into_the_parent_of_the_live_software_tree():
    rewrites = relocate.mapping("/g/run1", "/opt/apps/software", "/opt/lmod/modules")

    assert rewrites[-1] == (b"/g/run1", b"/opt/apps")


# text files


def test_a_text_file_gets_the_live_path_of_each_of_the_three_mappings(site):
    module_file = site.stage_modules / "1.0.lua"
    module_file.write_text(site.staged_text())

    rewritten, binaries = site.relocate()

    assert module_file.read_text() == site.live_text()
    assert rewritten == [str(module_file)]
    assert binaries == []


def test_the_generation_trees_are_rewritten_before_the_generation_itself(tmp_path):
    # With a module tree that is not <installpath>/modules, replacing the bare generation first
    # would turn <generation>/modules into <installpath>/modules, the wrong tree.
    generation = tmp_path / "gen"
    (generation / "modules").mkdir(parents=True)
    text_file = generation / "modules" / "paths.txt"
    text_file.write_text(f"{generation}/modules/all {generation}/software/Tiny {generation}/log\n")
    rewrites = relocate.mapping(str(generation), "/opt/apps/software", "/srv/lmod/modules")

    relocate.relocate([str(generation / "modules")], rewrites)

    assert text_file.read_text() == "/srv/lmod/modules/all /opt/apps/software/Tiny /opt/apps/log\n"


def test_every_occurrence_in_a_file_is_rewritten(site):
    script = site.stage / "bin" / "tiny"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nexec {site.stage}/libexec/tiny -C {site.stage} "$@"\n')

    site.relocate()

    live = site.software / "Tiny" / "1.0"
    assert script.read_text() == f'#!/bin/sh\nexec {live}/libexec/tiny -C {live} "$@"\n'


def test_a_rewritten_file_keeps_its_mode_owner_and_modification_time(site):
    script = site.stage / "tiny.sh"
    script.write_text(site.staged_text())
    script.chmod(0o750)
    os.chown(script, 4242, 4343)
    _age(script)
    before = _state(script)

    site.relocate()

    after = _state(script)
    assert after["bytes"] == site.live_text().encode()
    assert stat.S_IMODE(after["mode"]) == 0o750
    assert (after["uid"], after["gid"]) == (4242, 4343)
    assert after["mtime_ns"] == before["mtime_ns"] == OLD_TIME_NS


def test_a_rewritten_file_keeps_its_inode_and_its_hard_links(site):
    original = site.stage / "share" / "tiny.pc"
    original.parent.mkdir()
    original.write_text(site.staged_text())
    link = site.stage / "tiny-link.pc"
    os.link(original, link)
    inode = original.stat().st_ino

    rewritten, _binaries = site.relocate()

    assert original.stat().st_ino == link.stat().st_ino == inode
    assert original.stat().st_nlink == 2
    assert link.read_text() == site.live_text()
    assert len(rewritten) == 1  # the second name found the inode already rewritten


def test_a_sealed_file_in_a_sealed_directory_is_rewritten_and_stays_sealed(site):
    sealed_dir = site.stage / "lib"
    sealed_dir.mkdir()
    sealed = sealed_dir / "tiny.la"
    sealed.write_text(site.staged_text())
    sealed.chmod(0o444)
    sealed_dir.chmod(0o555)
    _age(sealed)

    site.relocate()

    assert sealed.read_text() == site.live_text()
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o444
    assert stat.S_IMODE(sealed_dir.stat().st_mode) == 0o555
    assert sealed.stat().st_mtime_ns == OLD_TIME_NS


def test_the_build_user_rewrites_a_sealed_file_in_a_sealed_directory_and_it_stays_sealed(
    user_site,
    unprivileged_user,
    package_dir,
):
    sealed_dir = user_site.stage / "lib"
    sealed_dir.mkdir()
    sealed = sealed_dir / "tiny.la"
    sealed.write_text(user_site.staged_text())
    _chown_tree(user_site.installpath.parent, unprivileged_user)
    sealed.chmod(0o444)
    _age(sealed)
    sealed_dir.chmod(0o555)
    user_site.stage.chmod(0o555)

    result = _relocate_as(unprivileged_user, package_dir, user_site)

    assert result == {"rewritten": [str(sealed)], "binaries": []}
    assert sealed.read_text() == user_site.live_text()
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o444
    assert stat.S_IMODE(sealed_dir.stat().st_mode) == 0o555
    assert sealed.stat().st_mtime_ns == OLD_TIME_NS
    assert sealed.stat().st_uid == unprivileged_user.uid


def test_the_build_user_keeps_the_setuid_and_setgid_bits_of_a_rewritten_file(
    user_site,
    unprivileged_user,
    package_dir,
):
    # The kernel clears S_ISUID/S_ISGID when a process without CAP_FSETID writes the file.
    setuid, setgid = user_site.stage / "setuid-tool", user_site.stage / "setgid-tool"
    for path in (setuid, setgid):
        path.write_text(user_site.staged_text())
    _chown_tree(user_site.installpath.parent, unprivileged_user)
    for path, mode in ((setuid, 0o4755), (setgid, 0o2755)):
        os.chmod(path, mode)

    result = _relocate_as(unprivileged_user, package_dir, user_site)

    assert sorted(result["rewritten"]) == [str(setgid), str(setuid)]
    assert setuid.read_text() == user_site.live_text()
    assert oct(stat.S_IMODE(setuid.stat().st_mode)) == oct(0o4755)
    assert oct(stat.S_IMODE(setgid.stat().st_mode)) == oct(0o2755)


def test_an_empty_file_is_left_untouched(site):
    empty = site.stage / "EMPTY"
    empty.touch()
    _age(empty)
    before = _state(empty)

    rewritten, binaries = site.relocate()

    assert _state(empty) == before
    assert (rewritten, binaries) == ([], [])


def test_a_file_that_does_not_name_the_generation_is_left_untouched(site):
    # The ctime proves that not even the mode was touched on the way.
    readme = site.stage / "README"
    readme.write_text(f"installed in {site.software}/Tiny/1.0\n")
    readme.chmod(0o444)
    _age(readme)
    before = _state(readme)

    rewritten, binaries = site.relocate()

    assert _state(readme) == before
    assert (rewritten, binaries) == ([], [])


# binaries


def test_a_binary_that_names_the_generation_is_returned_and_left_unchanged(site):
    binary = site.stage / "bin" / "tiny"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00RPATH=" + os.fsencode(site.stage) + b"/lib\x00")
    binary.chmod(0o755)
    _age(binary)
    before = _state(binary)

    rewritten, binaries = site.relocate()

    assert binaries == [str(binary)]
    assert rewritten == []
    assert _state(binary) == before


def test_a_binary_that_does_not_name_the_generation_is_neither_returned_nor_touched(site):
    binary = site.stage / "lib.so"
    binary.write_bytes(b"\x7fELF\x00" + os.fsencode(site.software) + b"/Tiny/1.0\x00")
    _age(binary)
    before = _state(binary)

    rewritten, binaries = site.relocate()

    assert (rewritten, binaries) == ([], [])
    assert _state(binary) == before


def test_text_files_are_rewritten_while_binaries_beside_them_are_returned(site):
    text_file, binary = site.stage / "tiny.cmake", site.stage / "tiny.bin"
    text_file.write_text(site.staged_text())
    binary.write_bytes(b"\x00" + site.staged_text().encode())

    rewritten, binaries = site.relocate()

    assert rewritten == [str(text_file)]
    assert binaries == [str(binary)]
    assert text_file.read_text() == site.live_text()
    assert binary.read_bytes() == b"\x00" + site.staged_text().encode()


# symlinks


def test_a_symlink_whose_target_names_the_generation_gets_the_live_target(site):
    (site.stage / "lib").mkdir()
    link = site.stage / "lib" / "libtiny.so"
    link.symlink_to(f"{site.stage}/lib/libtiny.so.1")

    rewritten, _binaries = site.relocate()

    assert os.readlink(link) == f"{site.software}/Tiny/1.0/lib/libtiny.so.1"
    assert rewritten == [str(link)]


def test_a_symlink_to_a_directory_naming_the_generation_is_rewritten(site):
    link = site.stage / "current"
    link.symlink_to(f"{site.generation}/software/Tiny/1.0/lib", target_is_directory=True)

    rewritten, _binaries = site.relocate()

    assert os.readlink(link) == f"{site.software}/Tiny/1.0/lib"
    assert rewritten == [str(link)]


def test_a_symlink_in_a_read_only_directory_is_rewritten_and_the_directory_stays_read_only(site):
    sealed_dir = site.stage / "lib"
    sealed_dir.mkdir()
    link = sealed_dir / "libtiny.so"
    link.symlink_to(f"{site.stage}/lib/libtiny.so.1")
    sealed_dir.chmod(0o555)

    site.relocate()

    assert os.readlink(link) == f"{site.software}/Tiny/1.0/lib/libtiny.so.1"
    assert stat.S_IMODE(sealed_dir.stat().st_mode) == 0o555
    assert sorted(os.listdir(sealed_dir)) == ["libtiny.so"]  # no temporary link left behind


def test_the_build_user_rewrites_a_symlink_in_a_sealed_directory(
    user_site,
    unprivileged_user,
    package_dir,
):
    sealed_dir = user_site.stage / "lib"
    sealed_dir.mkdir()
    link = sealed_dir / "libtiny.so"
    link.symlink_to(f"{user_site.stage}/lib/libtiny.so.1")
    _chown_tree(user_site.installpath.parent, unprivileged_user)
    sealed_dir.chmod(0o555)

    result = _relocate_as(unprivileged_user, package_dir, user_site)

    assert result == {"rewritten": [str(link)], "binaries": []}
    assert os.readlink(link) == f"{user_site.software}/Tiny/1.0/lib/libtiny.so.1"
    assert stat.S_IMODE(sealed_dir.stat().st_mode) == 0o555


def test_a_symlink_that_does_not_name_the_generation_is_left_as_it_is(site):
    link = site.stage / "default"
    link.symlink_to("lib/libtiny.so.1")
    inode = os.lstat(link).st_ino

    rewritten, _binaries = site.relocate()

    assert os.readlink(link) == "lib/libtiny.so.1"
    assert os.lstat(link).st_ino == inode
    assert rewritten == []


def test_a_symlink_to_an_outside_file_that_names_the_generation_is_never_followed(site, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(site.staged_text())
    _age(outside)
    before = _state(outside)
    (site.stage / "notes").symlink_to(outside)

    rewritten, binaries = site.relocate()

    assert _state(outside) == before
    assert (rewritten, binaries) == ([], [])


def test_a_symlink_to_an_outside_directory_is_never_descended(site, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.txt").write_text(site.staged_text())
    (outside / "blob").write_bytes(b"\x00" + os.fsencode(site.generation))
    before = {name: _state(outside / name) for name in ("config.txt", "blob")}
    (site.stage / "share").symlink_to(outside, target_is_directory=True)

    rewritten, binaries = site.relocate()

    assert {name: _state(outside / name) for name in ("config.txt", "blob")} == before
    assert (rewritten, binaries) == ([], [])


def test_a_root_that_is_a_symlink_to_an_outside_directory_is_not_descended(site, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.txt").write_text(site.staged_text())
    root = site.stage_modules / "linked"
    root.symlink_to(outside, target_is_directory=True)

    site.relocate(root)

    assert (outside / "config.txt").read_text() == site.staged_text()


# other entries and roots


def test_a_fifo_in_the_stage_is_skipped_without_being_opened(site):
    fifo = site.stage / "control"
    os.mkfifo(fifo)
    # Holding both ends open means an open() by relocate could not block the test forever.
    holder = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        rewritten, binaries = site.relocate()
    finally:
        os.close(holder)

    assert (rewritten, binaries) == ([], [])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_root_that_is_a_single_file_is_rewritten(site):
    module_file = site.stage_modules / "1.0.lua"
    module_file.write_text(site.staged_text())

    rewritten, _binaries = site.relocate(module_file)

    assert rewritten == [str(module_file)]
    assert module_file.read_text() == site.live_text()


def test_a_missing_root_is_skipped(site):
    module_file = site.stage_modules / "1.0.lua"
    module_file.write_text(site.staged_text())

    rewritten, binaries = site.relocate(site.generation / "software" / "Missing" / "2.0", site.stage_modules)

    assert rewritten == [str(module_file)]
    assert binaries == []


def test_only_the_given_roots_are_rewritten(site):
    elsewhere = site.generation / "software" / "Other" / "3.0"
    elsewhere.mkdir(parents=True)
    untouched = elsewhere / "config"
    untouched.write_text(site.staged_text())

    site.relocate()

    assert untouched.read_text() == site.staged_text()


# Lmod's saved module table (EasyBuild's devel file keeps one)


def _module_table_lines(table: bytes, chunk: int) -> bytes:
    encoded = base64.b64encode(table)
    pieces = [encoded[start : start + chunk] for start in range(0, len(encoded), chunk)]
    lines = [
        b'setenv("_ModuleTable%03d_", "%s")\n' % (number, piece) for number, piece in enumerate(pieces, 1)
    ]
    return b"".join(lines) + b'setenv("_ModuleTable_Sz_", "%d")\n' % len(pieces)


def _decoded_table(data: bytes) -> bytes:
    chunks = re.findall(rb'_ModuleTable(\d{3})_", "([A-Za-z0-9+/=]*)"', data)
    return base64.b64decode(b"".join(piece for _number, piece in sorted(chunks)))


def test_the_paths_inside_a_module_table_split_over_chunks_are_rewritten(tmp_path):
    generation = tmp_path / "apps" / "software" / ".eb-staged-rebuild" / "run1"
    table = b'_ModuleTable_ = {\nmpathA = {\n"%s/modules/all", "/apps/modules/all",\n},\n}\n' % (
        os.fsencode(generation)
    )
    devel = tmp_path / "stage" / "TinyLib-1.0-easybuild-devel"
    devel.parent.mkdir()
    # Chunks of 16 bytes, so the path runs across several of them.
    devel.write_bytes(b'setenv("CC", "gcc")\n' + _module_table_lines(table, 16))
    rewrites = relocate.mapping(str(generation), "/apps/software", "/apps/modules")

    rewritten, binaries = relocate.relocate([str(devel.parent)], rewrites)

    data = devel.read_bytes()
    assert (rewritten, binaries) == ([str(devel)], [])
    assert (
        _decoded_table(data)
        == b'_ModuleTable_ = {\nmpathA = {\n"/apps/modules/all", "/apps/modules/all",\n},\n}\n'
    )
    assert data.startswith(b'setenv("CC", "gcc")\n')
    assert b'setenv("_ModuleTable_Sz_", "' in data


def test_only_the_chunks_lmod_reads_are_decoded_and_a_leftover_chunk_is_kept(tmp_path):
    # EasyBuild writes the variables that changed: a chunk of an earlier, longer table can
    # follow a table of one chunk. Lmod reads 1.._ModuleTable_Sz_ only.
    generation = tmp_path / "gen"
    table = b'mpathA = { "%s/modules/all" }' % os.fsencode(generation)
    leftover = b'setenv("_ModuleTable002_", "%s")\n' % base64.b64encode(b"tail of an old table")
    devel = tmp_path / "stage" / "devel"
    devel.parent.mkdir()
    devel.write_bytes(_module_table_lines(table, 512) + leftover)
    rewrites = relocate.mapping(str(generation), "/apps/software", "/apps/modules")

    relocate.relocate([str(devel.parent)], rewrites)

    data = devel.read_bytes()
    first = re.search(rb'_ModuleTable001_", "([A-Za-z0-9+/=]*)"', data).group(1)
    assert base64.b64decode(first) == b'mpathA = { "/apps/modules/all" }'
    assert data.endswith(leftover)


def test_a_module_table_without_the_build_path_is_left_as_it_is(tmp_path):
    devel = tmp_path / "stage" / "devel"
    devel.parent.mkdir()
    original = _module_table_lines(b'_ModuleTable_ = { mpathA = { "/apps/modules/all" } }', 16)
    devel.write_bytes(original)
    mtime = devel.stat().st_mtime_ns
    rewrites = relocate.mapping(str(tmp_path / "gen"), "/apps/software", "/apps/modules")

    assert relocate.relocate([str(devel.parent)], rewrites) == ([], [])
    assert devel.read_bytes() == original
    assert devel.stat().st_mtime_ns == mtime


def test_a_binary_with_a_module_table_mark_but_no_build_path_is_not_listed(tmp_path):
    blob = tmp_path / "stage" / "blob"
    blob.parent.mkdir()
    blob.write_bytes(b"\0_ModuleTable001_ elsewhere\0")
    rewrites = relocate.mapping(str(tmp_path / "gen"), "/apps/software", "/apps/modules")

    assert relocate.relocate([str(blob.parent)], rewrites) == ([], [])


def test_a_module_table_without_its_size_line_is_rewritten_whole(tmp_path):
    # EasyBuild leaves out _ModuleTable_Sz_ when the size did not change: the chunks there
    # are then the whole table.
    generation = tmp_path / "gen"
    table = b'mpathA = { "%s/modules/all", "/apps/modules/all" }' % os.fsencode(generation)
    lines = _module_table_lines(table, 16)
    devel = tmp_path / "stage" / "devel"
    devel.parent.mkdir()
    devel.write_bytes(lines[: lines.index(b'setenv("_ModuleTable_Sz_"')])
    rewrites = relocate.mapping(str(generation), "/apps/software", "/apps/modules")

    relocate.relocate([str(devel.parent)], rewrites)

    assert _decoded_table(devel.read_bytes()) == b'mpathA = { "/apps/modules/all", "/apps/modules/all" }'


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_file_that_is_no_longer_regular_when_opened_is_refused_not_read(tmp_path, kind):
    # What a FIFO swapped in between the walk's lstat and the open would meet: refused by
    # descriptor, at once, with the path named.
    path = tmp_path / "bin" / "tool"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    rewrites = relocate.mapping("/apps/software/.g/run1", "/apps/software", "/apps/modules")

    with pytest.raises(errors.UsageError) as raised:
        relocate._read_if_named(str(path), rewrites)

    assert str(raised.value) == f"{path} in the staged install is no longer a regular file"


# deep stages: the walk keeps its own stack


def test_a_file_1050_directories_down_the_stage_is_rewritten(deep_scratch):
    site = Site(deep_scratch / "apps")
    nest(site.stage, 1_100)  # deeper than Python recurses
    level = site.stage.joinpath(*["d"] * 1_050)  # a path of some 2,200 bytes: one the kernel resolves
    (level / "tiny.pc").write_text(f"prefix={site.generation}/software/Tiny/1.0\n")

    rewritten, binaries = site.relocate()

    assert rewritten == [str(level / "tiny.pc")]
    assert binaries == []
    assert (level / "tiny.pc").read_text() == f"prefix={site.software}/Tiny/1.0\n"


def test_a_stage_nested_past_what_a_path_can_name_is_refused_not_passed_over(deep_scratch):
    site = Site(deep_scratch / "apps")
    nest(site.stage, 20, name="x" * 250)  # past PATH_MAX (4,096 bytes)

    with pytest.raises(errors.UsageError) as raised:
        site.relocate()

    assert str(raised.value).startswith(
        f"{site.stage} holds directories nested too deep for their paths to be named ("
    )
    assert str(raised.value).endswith(" bytes); nothing was swapped")
