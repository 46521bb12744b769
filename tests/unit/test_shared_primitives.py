"""Each shared primitive exists once in ``plugins/module_utils``, and its callers use it.

Read from the sources' syntax trees: a second copy (a class, a kill helper, a polling loop,
a temporary file of its own for a replace, a process started beside the child runner) is
what these catch before it drifts from the first.
"""

from __future__ import annotations

import ast

import checkout

MODULE_UTILS = checkout.REPO / "plugins" / "module_utils"


def _trees():
    for path in sorted(MODULE_UTILS.rglob("*.py")):
        yield str(path.relative_to(MODULE_UTILS)), ast.parse(path.read_text(), str(path))


def _definitions(kind, name):
    return [
        path
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, kind) and node.name == name
    ]


def _calls(tree, name):
    """Calls of ``name`` in ``tree``, as ``x.name(...)`` or ``name(...)``."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == name
    ]


def _files_calling(name):
    return sorted(path for path, tree in _trees() if _calls(tree, name))


def test_there_is_one_terminated_class_in_common_errors():
    assert _definitions(ast.ClassDef, "Terminated") == ["common/errors.py"]


def test_there_is_one_kill_group_in_the_child_runner():
    assert _definitions(ast.FunctionDef, "_kill_group") == ["common/proc.py"]


def test_the_only_loop_that_sleeps_until_something_happens_is_the_lock_poll():
    # A while loop that sleeps is a poll; the lock probe's for loop over its rounds paces
    # them on purpose (a turn out of the lock for the other hosts).
    sleeping_loops = sorted(
        path
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.While) and _calls(node, "sleep")
    )

    assert sleeping_loops == ["common/lockwait.py"]


def _files_naming(attribute):
    """Files that name ``x.attribute`` (a call, or the function passed on)."""
    return sorted(
        path
        for path, tree in _trees()
        if any(isinstance(node, ast.Attribute) and node.attr == attribute for node in ast.walk(tree))
    )


def test_non_blocking_lock_tries_are_made_only_by_the_try_lock_helper():
    # flock(LOCK_UN) releases are everyone's; a try (LOCK_NB) and POSIX record locks are lockwait's.
    assert _files_naming("LOCK_NB") == ["common/lockwait.py"]
    assert _files_naming("lockf") == ["common/lockwait.py"]


def test_no_module_makes_its_own_temporary_file_for_a_replace():
    assert _files_calling("mkstemp") == []
    # One sequence, dirfd's (Directory.replace, which durable_replace and atomic_write use,
    # modulefile calls on the directory it read the replaced file's metadata through, and the
    # arch_guard role's writes on a node use).
    assert _files_calling("_create_temp") == ["common/dirfd.py"]
    assert _files_calling("durable_replace") == ["staged_rebuild/fsutil.py"]


def test_processes_are_started_only_by_the_child_runner():
    started = sorted({*_files_calling("Popen"), *_files_calling("check_output")})
    ran = sorted(
        path for path, tree in _trees() for call in _calls(tree, "run") if "subprocess" in ast.dump(call)
    )

    assert started == ["common/proc.py"]
    assert ran == []
