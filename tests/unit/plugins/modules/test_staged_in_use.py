"""hpcstack.ops.staged_in_use: the /proc scan of one host through ``main()``, with a real
process that holds a file of one tree open. Over SSH on several hosts, with the fleet gc
playbook: tests/integration/cluster/test_cluster_rebuild.py."""

from __future__ import annotations

import os
import subprocess
import sys

from ansible_collections.hpcstack.ops.plugins.modules import staged_in_use
from tests.support.module_runner import assert_failed_with, run_module

HOLDER = 'import sys, time; held = open(sys.argv[1], "rb"); print("ready", flush=True); time.sleep(600)'


def test_each_tree_gets_the_processes_that_use_it_and_a_tree_nobody_uses_an_empty_list(capsys, tmp_path):
    used, unused = tmp_path / "used", tmp_path / "unused"
    used.mkdir()
    unused.mkdir()
    (used / "lib.so").write_bytes(bytes(64))
    holder = subprocess.Popen(
        [sys.executable, "-I", "-c", HOLDER, str(used / "lib.so")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        result = run_module(capsys, staged_in_use, {"trees": [str(used), str(unused)]}, check_mode=True)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()

    assert result["changed"] is False
    assert result["in_use"][str(unused)] == []
    (process,) = result["in_use"][str(used)]
    assert (process["pid"], process["uid"], process["uses"]) == (holder.pid, os.getuid(), ["fd"])
    assert result["processes"]["as_uid"] == os.geteuid()
    assert result["processes"]["scanned"] > 0


def test_a_relative_tree_is_refused_with_the_option_named(capsys):
    result = run_module(capsys, staged_in_use, {"trees": ["apps/software"]})

    assert_failed_with(result, "trees: 'apps/software' is not an absolute path")
