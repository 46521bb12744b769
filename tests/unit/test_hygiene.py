"""Every test asserts something: a test without an assertion cannot fail on wrong behaviour."""

from __future__ import annotations

import ast

import checkout

# Calls that assert on their own: they raise unless the expected behaviour happened.
ASSERTING_CALLS = {"raises", "fail", "warns"}


def _asserts(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            # pytest's own (raises, fail) and the suite's helpers named assert_*/_assert_*.
            if name in ASSERTING_CALLS or name.lstrip("_").startswith("assert"):
                return True
    return False


def _test_functions():
    for path in sorted((checkout.REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                yield path.relative_to(checkout.REPO), node


def test_the_suite_has_tests():
    assert len(list(_test_functions())) > 10


def test_every_test_function_asserts():
    silent = [f"{path}:{node.lineno} {node.name}" for path, node in _test_functions() if not _asserts(node)]
    assert silent == []


def test_the_checker_flags_a_test_without_an_assertion():
    tree = ast.parse(
        "def test_nothing():\n    x = 1\n\ndef test_raises():\n    with pytest.raises(E):\n        f()\n"
        "\ndef test_helper():\n    _assert_state(x)\n\ndef test_call():\n    check(x)\n"
    )
    nothing, raises, helper, call = tree.body
    assert not _asserts(nothing)
    assert _asserts(raises)
    assert _asserts(helper)
    assert not _asserts(call)
