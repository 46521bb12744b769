"""A failure injected before every recorded operation of a publish, and of a rollback.

The engine calls ``Faults.before(operation)`` before each operation it records; a counting
run on a throw-away site (at collection time) lists them, and every index becomes a case:
``Faults(fail_at=n)`` makes the n-th operation fail with an injected OSError, as a real
I/O error would. After a failed publish every live directory has its original inode and
bytes, every module file its original bytes, owner, mode and ACL, every class link its
target, the journal says ``failed``, and nothing of the run is left in the live trees.
After a failed rollback the published tree stays live and the run stays ``published``.
The ``chain`` variant is a stack rebuild of three (``--module TinyLib/1.0
--with-dependants``, ``staged_matrix``), and so is the rollback matrix's run.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import faults
from tests.integration.harness import staged_matrix as matrix

PUBLISH_OPERATIONS = {variant: matrix.count_publish_operations(variant) for variant in matrix.VARIANTS}
# On bindfs the swap takes the three-rename fallback, whose renames are operations of their own.
FUSE_OPERATIONS = matrix.with_fallback(PUBLISH_OPERATIONS["one"], journal_points=True)
ROLLBACK_OPERATIONS = matrix.count_rollback_operations(matrix.CHAIN)

PUBLISH_CASES = [
    pytest.param(variant, index, name, id=f"{variant}-" + matrix.case_id(index, name))
    for variant, operations in PUBLISH_OPERATIONS.items()
    for index, name in enumerate(operations, start=1)
]
FUSE_CASES = [
    pytest.param(index, name, id=matrix.case_id(index, name))
    for index, name in enumerate(FUSE_OPERATIONS, start=1)
]
ROLLBACK_CASES = [
    pytest.param(index, name, id=matrix.case_id(index, name))
    for index, name in enumerate(ROLLBACK_OPERATIONS, start=1)
]


def _causes(err):
    while err is not None:
        yield err
        err = err.__cause__


def _assert_injected_failure_raised(raised, name):
    """The error is the engine's one-line error (or the OSError itself) caused by our injection."""
    injected = [err for err in _causes(raised.value) if isinstance(err, faults.InjectedFailure)]
    assert [err.step for err in injected] == [name], repr(raised.value)
    assert isinstance(raised.value, (errors.HpcstackError, OSError))
    assert "\n" not in str(raised.value)


def _restricted_site(staged_site, modules, ledger):
    matrix.prepare_old_site(staged_site, modules, ledger)
    matrix.restrict_module_files(staged_site, modules)
    return staged_site


def _replaced_entries(site, modules):
    """Module files and class links: restoring one writes a new inode with the old content."""
    return [site.module_file(module) for module in modules] + [
        matrix.class_link(site, module) for module in modules
    ]


def _state(site, modules):
    """Everything a failed transaction must leave as it found it."""
    return {
        "snapshot": matrix.site_snapshot(site),
        "module_files": {module: matrix.module_file_state(site.module_file(module)) for module in modules},
        "class_links": {module: os.readlink(matrix.class_link(site, module)) for module in modules},
    }


def _left_behind(site, after, before):
    """New entries in the live trees (only the topmost of each new subtree), relative paths."""
    new = set(after["snapshot"]) - set(before["snapshot"])
    return sorted(os.path.relpath(path, site.installpath) for path in new if os.path.dirname(path) not in new)


def _assert_same_trees(site, modules, after, before):
    """Same live directories (inode and bytes), module files, class links, and nothing more."""
    for module in modules:
        live = site.live(module)
        assert matrix.subtree(after["snapshot"], live) == matrix.subtree(before["snapshot"], live), module
    assert after["module_files"] == before["module_files"]
    assert after["class_links"] == before["class_links"]
    left_behind = _left_behind(site, after, before)
    assert not left_behind, f"left behind in the live trees: {left_behind}"
    replaced = _replaced_entries(site, modules)
    assert matrix.without_inodes_of(after["snapshot"], replaced) == matrix.without_inodes_of(
        before["snapshot"], replaced
    )


@pytest.mark.parametrize("variant", list(matrix.VARIANTS))
def test_the_cases_cover_every_operation_of_a_publish(staged_site, variant):
    modules, ledger = matrix.VARIANTS[variant]
    site = _restricted_site(staged_site, modules, ledger)
    expected = PUBLISH_OPERATIONS[variant]
    beyond_the_last = faults.Faults(fail_at=len(expected) + 1)

    result = matrix.rebuild_in_process(site, modules, beyond_the_last, ledger)

    assert result["state"] == "published"
    assert [entry["module"] for entry in result["modules"]] == list(modules)
    assert beyond_the_last.operations == expected
    for module in modules:
        assert [name for name in expected if name.endswith(" " + module)] == [
            f"marker {module}",
            f"journal marker {module}",
            f"prepare-module {module}",
            f"journal prepare-module {module}",
            f"backup {module}",
            f"journal backup {module}",
            f"stage-move {module}",
            f"journal stage-move {module}",
            f"swap {module}",
            f"journal swap {module}",
            f"module {module}",
            f"journal module {module}",
            f"class-link tools {module}",
            f"journal class-link tools {module}",
        ]
    assert expected[:4] == ["build", "journal build", "relocate", "journal relocate"]
    assert expected[-1] == "state published"
    assert ("ledger" in expected) is ledger


@pytest.mark.parametrize(("variant", "index", "name"), PUBLISH_CASES)
def test_a_failure_before_each_publish_operation_leaves_every_live_tree_as_it_was(
    staged_site, variant, index, name
):
    modules, ledger = matrix.VARIANTS[variant]
    site = _restricted_site(staged_site, modules, ledger)
    before = _state(site, modules)
    injecting = faults.Faults(fail_at=index)

    with pytest.raises((errors.HpcstackError, OSError)) as raised:
        matrix.rebuild_in_process(site, modules, injecting, ledger)

    assert injecting.operations == PUBLISH_OPERATIONS[variant][:index]
    _assert_injected_failure_raised(raised, name)
    assert matrix.the_journal(site).state.value == "failed"
    if ledger:
        assert matrix.ledger_file(site).read_bytes() == matrix.EARLIER_LEDGER
    _assert_same_trees(site, modules, _state(site, modules), before)


@pytest.fixture
def fuse_site(fuse_dir, tmp_path, package_root):
    return matrix.on_fuse(fuse_dir, tmp_path, package_root)


def test_the_cases_cover_every_operation_of_a_publish_on_fuse(fuse_site):
    site = _restricted_site(fuse_site, matrix.ONE, ledger=False)
    beyond_the_last = faults.Faults(fail_at=len(FUSE_OPERATIONS) + 1)

    result = matrix.rebuild_in_process(site, matrix.ONE, beyond_the_last)

    assert result["state"] == "published"
    assert beyond_the_last.operations == FUSE_OPERATIONS
    assert [name.split(" ")[0] for name in FUSE_OPERATIONS if name.startswith("fallback-")] == [
        "fallback-1-live-to-hold",
        "fallback-2-staged-to-live",
        "fallback-3-hold-to-staged",
    ]
    assert site.payload(matrix.ONE[0]) == "new build"


@pytest.mark.parametrize(("index", "name"), FUSE_CASES)
def test_a_failure_before_each_publish_operation_on_fuse_leaves_every_live_tree_as_it_was(
    fuse_site, index, name
):
    site = _restricted_site(fuse_site, matrix.ONE, ledger=False)
    before = _state(site, matrix.ONE)
    injecting = faults.Faults(fail_at=index)

    with pytest.raises((errors.HpcstackError, OSError)) as raised:
        matrix.rebuild_in_process(site, matrix.ONE, injecting)

    assert injecting.operations == FUSE_OPERATIONS[:index]
    _assert_injected_failure_raised(raised, name)
    assert matrix.the_journal(site).state.value == "failed"
    assert matrix.leftover_holds(site) == []
    _assert_same_trees(site, matrix.ONE, _state(site, matrix.ONE), before)


def _publish(site):
    matrix.rebuild_in_process(site, matrix.CHAIN, faults.Faults())
    return site


def test_the_cases_cover_every_operation_of_a_rollback(staged_site):
    site = _publish(_restricted_site(staged_site, matrix.CHAIN, ledger=False))
    beyond_the_last = faults.Faults(fail_at=len(ROLLBACK_OPERATIONS) + 1)

    result = matrix.rollback_in_process(site, beyond_the_last)

    assert result["state"] == "rolled_back"
    assert beyond_the_last.operations == ROLLBACK_OPERATIONS
    for module in matrix.CHAIN:
        assert [name for name in ROLLBACK_OPERATIONS if name.endswith(" " + module)] == [
            f"rollback class-link tools {module}",
            f"journal rollback class-link tools {module}",
            f"rollback module {module}",
            f"journal rollback module {module}",
            f"rollback swap {module}",
            f"journal rollback swap {module}",
        ]
    assert ROLLBACK_OPERATIONS[-1] == "state rolled_back"


@pytest.mark.parametrize(("index", "name"), ROLLBACK_CASES)
def test_a_failure_before_each_rollback_operation_keeps_the_published_tree_live_and_rollback_possible(
    staged_site, index, name
):
    old = _state(_restricted_site(staged_site, matrix.CHAIN, ledger=False), matrix.CHAIN)
    site = _publish(staged_site)
    published = _state(site, matrix.CHAIN)
    injecting = faults.Faults(fail_at=index)

    with pytest.raises((errors.HpcstackError, OSError)) as raised:
        matrix.rollback_in_process(site, injecting)

    assert injecting.operations == ROLLBACK_OPERATIONS[:index]
    _assert_injected_failure_raised(raised, name)
    assert matrix.the_journal(site).state.value == "published"
    assert all(site.payload(module) == "new build" for module in matrix.CHAIN)
    _assert_same_trees(site, matrix.CHAIN, _state(site, matrix.CHAIN), published)
    # The journal the reversal left behind still describes the run: a rollback now succeeds.
    assert matrix.rollback_in_process(site, faults.Faults())["state"] == "rolled_back"
    after = _state(site, matrix.CHAIN)
    for module in matrix.CHAIN:
        live = site.live(module)
        assert matrix.subtree(after["snapshot"], live) == matrix.subtree(old["snapshot"], live), module
    assert after["module_files"] == old["module_files"]
    assert after["class_links"] == old["class_links"]
