"""lean_os gives what ``os`` gives, for the names and bytes a job's environment can hold."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import lean_os

TEXTS = ["", "plain", "x86_64/amd/zen3", "é ü 漢", "undecodable \udcff\udcfe byte", "a=b\tc d"]


@pytest.mark.parametrize("text", TEXTS)
def test_fsencode_and_fsdecode_agree_with_os(text):
    encoded = lean_os.fsencode(text)

    assert encoded == os.fsencode(text)
    assert lean_os.fsdecode(encoded) == os.fsdecode(encoded) == text


def test_environ_is_the_process_environment_as_os_environ_shows_it(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PLAIN": "value", "UTF8": "é", "EMPTY": ""}
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); "
        "from hpcstack_ops.arch_guard import lean_os; "
        "print(lean_os.environ() == dict(os.environ), repr(lean_os.environ()['RAW']))"
    )
    # A byte that is not UTF-8 reaches the child through the bytes form of its environment.
    child_env = {key.encode(): value.encode() for key, value in env.items()}
    child_env[b"RAW"] = b"\xff\xfe"
    done = subprocess.run(
        [sys.executable, "-IS", "-c", code, str(checkout.link_package(tmp_path))],
        env=child_env,
        capture_output=True,
        text=True,
        check=True,
    )

    assert done.stdout.split() == ["True", repr("\udcff\udcfe")]


def test_environ_returns_a_copy_that_leaves_the_process_environment_alone(monkeypatch):
    monkeypatch.setenv("LEAN_OS_PROBE", "before")
    copy = lean_os.environ()
    copy["LEAN_OS_PROBE"] = "changed"

    assert copy is not lean_os.environ()
    assert os.environ["LEAN_OS_PROBE"] == "before"


def test_isdir_answers_as_os_path_isdir(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link-to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    cases = ["dir", "file", "link-to-dir", "dangling", "missing", "file/below"]

    answers = {name: lean_os.isdir(str(tmp_path / name)) for name in cases}

    assert answers == {name: os.path.isdir(tmp_path / name) for name in cases}
    assert [answers["dir"], answers["link-to-dir"], answers["file"]] == [True, True, False]
    assert lean_os.isdir("bad\0path") is False
