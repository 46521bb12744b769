"""Would a rebuild change anything: each module against the easyconfig and EasyBuild version
its live install records, as EasyBuild writes them (``easybuild/<Name>-<version>.eb`` and
the first line of ``easybuild/easybuild-<Name>-<version>-<date>.<time>.log``).

The installs are made here in EasyBuild's layout; ``eb`` is a script that answers
``--version`` as EasyBuild 5.4.1 does. A real build's record is compared in
tests/integration (the staged_rebuild module run twice).
"""

from __future__ import annotations

import bz2
import gzip
import os
import socket
import threading

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import uptodate
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.request import RebuildRequest

APP, LIB = "TinyApp/1.0", "TinyLib/1.0"
EASYCONFIG = b"name = 'TinyApp'\nversion = '1.0'\n"
LOG_LINE = (
    "== 2026-12-01 05:30:22,416 easyblock.py:392 INFO This is EasyBuild {} (framework: {}) on host vm.\n"
)


@pytest.fixture
def eb(tmp_path):
    script = tmp_path / "eb"
    script.write_text(
        "#!/bin/sh\necho 'This is EasyBuild 5.4.1 (framework: 5.4.1, easyblocks: 5.4.1) on host vm.'\n"
    )
    script.chmod(0o755)
    return script


def _install(software, module, *, easyconfig=EASYCONFIG, versions=("5.4.1",), opener=open, suffix=""):
    """A live install of ``module`` as EasyBuild leaves it: the easyconfig copy and its logs."""
    name, version = module.split("/")
    records = software / name / version / "easybuild"
    records.mkdir(parents=True)
    if easyconfig is not None:
        (records / f"{name}-{version}.eb").write_bytes(easyconfig)
    for index, eb_version in enumerate(versions):
        log = records / f"easybuild-{name}-{version}-20261201.05302{index}.log{suffix}"
        with opener(log, "wt") as handle:
            handle.write(LOG_LINE.format(eb_version, eb_version) + "== more lines\n")
    # EasyBuild's test report sorts after the logs; it must not be read as one.
    (records / f"easybuild-{name}-{version}-20261201.053029_test_report.md").write_text("* report\n")
    return records


def _request(tmp_path, eb, *, modules=(APP,), easyconfig=EASYCONFIG, eb_args=None, more_eb_args=()):
    requested = tmp_path / "TinyApp-1.0.eb"
    requested.write_bytes(easyconfig)
    return RebuildRequest(
        software=str(tmp_path / "software"),
        modules=str(tmp_path / "modules"),
        modules_requested=list(modules),
        eb=str(eb),
        eb_args=[*([str(requested), "--robot"] if eb_args is None else eb_args), *more_eb_args],
    )


def _why(results):
    return {entry["module"]: (entry["up_to_date"], entry["why"]) for entry in results}


def test_a_module_built_from_the_same_easyconfig_by_the_same_easybuild_is_up_to_date(tmp_path, eb):
    _install(tmp_path / "software", APP)

    assert _why(uptodate.compare(_request(tmp_path, eb))) == {APP: (True, "same easyconfig and EasyBuild")}


def test_another_easyconfig_is_stale_and_names_the_recorded_copy(tmp_path, eb):
    records = _install(tmp_path / "software", APP)

    results = uptodate.compare(_request(tmp_path, eb, easyconfig=EASYCONFIG + b"versionsuffix = '-x'\n"))

    assert _why(results) == {APP: (False, f"{records}/TinyApp-1.0.eb differs from the requested easyconfig")}


def test_an_install_without_an_easyconfig_record_is_stale(tmp_path, eb):
    records = _install(tmp_path / "software", APP, easyconfig=None)

    results = uptodate.compare(_request(tmp_path, eb))

    assert _why(results) == {
        APP: (False, f"the live install records no easyconfig ({records}/TinyApp-1.0.eb)")
    }


@pytest.mark.parametrize(
    ("versions", "built_by"),
    [(("5.4.0",), "5.4.0"), (("5.4.1", "5.3.0"), "5.3.0"), (("5.4.1", "garbled"), "an unknown version")],
    ids=["older", "newest-log-counts", "unreadable-version"],
)
def test_another_easybuild_version_is_stale(tmp_path, eb, versions, built_by):
    _install(tmp_path / "software", APP, versions=versions)

    results = uptodate.compare(_request(tmp_path, eb))

    assert _why(results) == {APP: (False, f"built by EasyBuild {built_by}, not by 5.4.1")}


@pytest.mark.parametrize(("opener", "suffix"), [(gzip.open, ".gz"), (bz2.open, ".bz2")], ids=["gz", "bz2"])
def test_a_compressed_log_is_read(tmp_path, eb, opener, suffix):
    _install(tmp_path / "software", APP, opener=opener, suffix=suffix)

    assert _why(uptodate.compare(_request(tmp_path, eb)))[APP][0] is True


def test_an_easyconfig_named_without_a_path_never_counts_as_up_to_date(tmp_path, eb):
    _install(tmp_path / "software", APP)

    results = uptodate.compare(_request(tmp_path, eb, eb_args=["TinyApp-1.0-missing.eb", "--robot"]))

    assert _why(results) == {
        APP: (False, "easyconfig TinyApp-1.0-missing.eb is not a file that can be read here")
    }


def test_no_easyconfig_among_the_arguments_is_stale(tmp_path, eb):
    _install(tmp_path / "software", APP)

    results = uptodate.compare(_request(tmp_path, eb, eb_args=["--robot", "--from-pr=1"]))

    assert _why(results) == {APP: (False, "no easyconfig file among EasyBuild's arguments to compare with")}


def test_an_eb_that_does_not_run_makes_every_module_stale(tmp_path):
    _install(tmp_path / "software", APP)

    results = uptodate.compare(_request(tmp_path, tmp_path / "no-such-eb"))

    assert _why(results) == {
        APP: (False, "eb --version did not run, so the EasyBuild version cannot be compared")
    }


def test_each_module_is_compared_on_its_own(tmp_path, eb):
    _install(tmp_path / "software", APP)
    _install(tmp_path / "software", LIB, easyconfig=b"name = 'TinyLib'\n")
    lib_easyconfig = tmp_path / "TinyLib-1.0.eb"
    lib_easyconfig.write_bytes(b"name = 'TinyLib'\nversion = '1.0'\n")
    request = _request(tmp_path, eb, modules=(APP, LIB), more_eb_args=[str(lib_easyconfig)])

    results = _why(uptodate.compare(request))

    assert results[APP] == (True, "same easyconfig and EasyBuild")
    assert results[LIB][0] is False
    assert "differs from the requested easyconfig" in results[LIB][1]


def test_requested_easyconfigs_are_the_positional_eb_files():
    args = ["--robot", "A-1.eb", "--try-toolchain=GCC,13", "/x/B-2.eb", "--hooks=h.py", "notes.txt"]

    assert uptodate.requested_easyconfigs(args) == ["A-1.eb", "/x/B-2.eb"]


def _plant_in_place_of(path, kind):
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        # A link to a log of the right version: followed, it would make the module up to date.
        target = path.parent / "elsewhere.log"
        target.write_text(LOG_LINE.format("5.4.1", "5.4.1"))
        path.symlink_to(target)
    else:
        with socket.socket(socket.AF_UNIX) as server:
            cwd = os.getcwd()
            os.chdir(path.parent)  # a socket's path must fit in 108 bytes
            try:
                server.bind(path.name)
            finally:
                os.chdir(cwd)


def _compare_within(request, seconds=10):
    """``compare(request)`` in a thread that must end within ``seconds`` (a FIFO read blocks)."""
    results = []
    worker = threading.Thread(target=lambda: results.append(uptodate.compare(request)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "compare blocked on the log"
    return results[0]


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "symlink"])
def test_a_newest_log_that_is_not_a_regular_file_is_not_read_and_counts_as_an_unknown_version(
    tmp_path, eb, kind, suffix
):
    opener = gzip.open if suffix else open
    records = _install(tmp_path / "software", APP, versions=("5.4.1",), opener=opener, suffix=suffix)
    (log,) = records.glob("easybuild-*.log*")
    _plant_in_place_of(log, kind)

    results = _compare_within(_request(tmp_path, eb))

    assert _why(results) == {APP: (False, "built by EasyBuild an unknown version, not by 5.4.1")}


def test_a_hierarchical_module_is_compared_with_the_record_in_the_install_its_root_names(tmp_path, eb):
    # Compiler/GCC/6.4.0-2.28/TinyApp/1.0 lives in software/TinyApp/1.0-GCC-6.4.0-2.28, whose
    # record EasyBuild names TinyApp-1.0-GCC-6.4.0-2.28.eb.
    module = "Compiler/GCC/6.4.0-2.28/TinyApp/1.0"
    _install(tmp_path / "software", "TinyApp/1.0-GCC-6.4.0-2.28")
    module_file = tmp_path / "modules" / "all" / (module + ".lua")
    module_file.parent.mkdir(parents=True)
    module_file.write_text(f'local root = "{tmp_path}/software/TinyApp/1.0-GCC-6.4.0-2.28"\n')

    assert _why(uptodate.compare(_request(tmp_path, eb, modules=(module,)))) == {
        module: (True, "same easyconfig and EasyBuild")
    }
