"""``gc`` keeps a retired tree while a process on this node uses it, and names the process.

Each case starts a real process that uses the live tree of ``TinyApp/1.0`` one way (a
mapping, an open file, its working directory, its executable, its environment), then a real
``eb-staged-rebuild rebuild`` swaps that tree out to its hidden sibling, and
``eb-staged-rebuild gc --grace-hours 0`` runs as a node without Ansible runs it: the grace
period has passed, so only the process can keep the tree. The kernel names what the process
holds under the sibling's new name, which is what the scan compares. Once the process has
ended, the same gc removes the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import checkout
from tests.support.staged import StagedSite

APP = "TinyApp/1.0"
RUN_ID = "run1"
READY_TIMEOUT = 30
# Holds a mapping of the file in argv[1] (its descriptor closed: only maps names it).
MAPPER = """
import mmap, sys, time
with open(sys.argv[1], "rb") as handle:
    mapping = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
print("ready", flush=True)
time.sleep(600)
"""
# Holds the file in argv[1] open.
OPENER = """
import sys, time
handle = open(sys.argv[1], "rb")
print("ready", flush=True)
time.sleep(600)
"""
WAITER = """
import time
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def site(staged_site: StagedSite) -> StagedSite:
    staged_site.install(APP, payload="old")
    lib = staged_site.live(APP) / "lib"
    lib.mkdir()
    (lib / "libtinyapp.so").write_bytes(b"\x7fELF" + bytes(4092))
    bin_dir = staged_site.live(APP) / "bin"
    bin_dir.mkdir(exist_ok=True)
    shutil.copy2(shutil.which("sleep"), bin_dir / "tinysleep")
    return staged_site


class Holder:
    """A process started from the live tree that stays until the test ends it."""

    def __init__(self, argv, *, cwd=None, env=None, ready=True) -> None:
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
        if ready:
            line = self.process.stdout.readline()
            if line != "ready\n":
                self.end()
                pytest.fail(f"the holder said {line!r}, not ready")

    @property
    def pid(self) -> int:
        return self.process.pid

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(READY_TIMEOUT)
        self.process.stdout.close()


def _holder(site: StagedSite, way: str) -> Holder:
    live = site.live(APP)
    python = [sys.executable, "-I", "-c"]
    if way == "maps":
        return Holder([*python, MAPPER, str(live / "lib" / "libtinyapp.so")])
    if way == "fd":
        return Holder([*python, OPENER, str(live / "PAYLOAD")])
    if way == "cwd":
        return Holder([*python, WAITER], cwd=live / "lib")
    if way == "exe":
        holder = Holder([str(live / "bin" / "tinysleep"), "600"], ready=False)
        _wait_for_exec(holder.pid, live / "bin" / "tinysleep")
        return holder
    # environ: a value that names the retired tree by its own name (a job that resolved the
    # old tree's path after the swap and exported it); the stable name leads to the new tree.
    sibling = live.parent / f".{live.name}.{RUN_ID}"
    return Holder([*python, WAITER], env=dict(os.environ, TINYAPP_DATA=f"/nowhere:{sibling}/lib"))


def _wait_for_exec(pid: int, program: Path) -> None:
    for _attempt in range(300):
        try:
            if os.readlink(f"/proc/{pid}/exe") == str(program):
                return
        except OSError:
            pass
        subprocess.run(["sleep", "0.01"], check=True)
    pytest.fail(f"{program} never ran as pid {pid}")


def _rebuild(site: StagedSite) -> dict:
    done = site.run(
        "--json", *site.rebuild_args(APP, extra=("--run-id", RUN_ID)), env={"FAKE_EB_PAYLOAD": "new"}
    )
    assert done.returncode == 0, done.stderr
    assert site.payload(APP) == "new"
    return json.loads(done.stdout)


def _gc(site: StagedSite, *args: str) -> dict:
    done = site.run("--json", "gc", "--grace-hours", "0", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("way", ["maps", "fd", "cwd", "exe", "environ"])
def test_a_process_that_uses_the_old_tree_keeps_it_and_is_named_until_it_ends(site, way):
    holder = _holder(site, way)
    try:
        retired = _rebuild(site)["modules"][0]["retired_path"]

        kept = _gc(site)

        assert kept["removed"] == []
        (entry,) = [entry for entry in kept["kept"] if entry["path"] == retired]
        assert entry["why"].startswith(f"in use by 1 process (pids {holder.pid}; users ")
        (process,) = entry["processes"]
        assert (process["pid"], process["uid"]) == (holder.pid, os.getuid())
        assert way in process["uses"]
        assert Path(retired).is_dir()
        assert kept["processes"]["scanned"] > 0
    finally:
        holder.end()

    removed = _gc(site)

    assert removed["removed"] == [{"path": retired, "run_id": entry["run_id"]}]
    assert not Path(retired).exists()
    assert site.payload(APP) == "new"


def test_a_mapped_library_keeps_the_tree_in_a_dry_run_too_and_the_text_output_names_the_pid(site):
    holder = _holder(site, "maps")
    try:
        retired = _rebuild(site)["modules"][0]["retired_path"]

        dry = _gc(site, "--dry-run")
        text = site.run("gc", "--grace-hours", "0")

        assert dry["removed"] == []
        assert any(entry["path"] == retired for entry in dry["kept"])
        assert text.returncode == 0, text.stderr
        assert f"pids {holder.pid}" in text.stdout
        assert Path(retired).is_dir()
    finally:
        holder.end()


def test_a_process_that_used_only_the_new_tree_keeps_nothing(site):
    retired = _rebuild(site)["modules"][0]["retired_path"]
    holder = Holder([sys.executable, "-I", "-c", OPENER, str(site.live(APP) / "PAYLOAD")])
    try:
        collected = _gc(site)
    finally:
        holder.end()

    assert collected["removed"] == [{"path": retired, "run_id": collected["removed"][0]["run_id"]}]
    assert not Path(retired).exists()


def test_within_the_grace_period_a_process_in_use_is_still_the_reason_given(site):
    holder = _holder(site, "fd")
    try:
        retired = _rebuild(site)["modules"][0]["retired_path"]
        done = site.run("--json", "gc")
    finally:
        holder.end()

    assert done.returncode == 0, done.stderr
    (entry,) = [entry for entry in json.loads(done.stdout)["kept"] if entry["path"] == retired]
    assert entry["why"].startswith("in use by 1 process")


SCAN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from hpcstack_ops.staged_rebuild import inuse
found = inuse.scan([sys.argv[2]])
print(json.dumps({"pids": [process.pid for process in found.users[sys.argv[2]]], **found.summary()}))
"""


def test_as_another_user_the_scan_sees_that_user_s_processes_only_and_says_so(
    user_tmp_path, unprivileged_user
):
    assert unprivileged_user.uid != os.getuid(), "needs root, as on the CI machine"
    tree = user_tmp_path / "tree"
    tree.mkdir()
    (tree / "data").write_bytes(bytes(4096))
    os.chmod(tree / "data", 0o644)
    package_root = checkout.link_package(user_tmp_path / "pkg")  # pytest's own directories are root's
    roots = Holder([sys.executable, "-I", "-c", MAPPER, str(tree / "data")])
    users = Holder(unprivileged_user.command([sys.executable, "-I", "-c", MAPPER, str(tree / "data")]))
    try:
        done = unprivileged_user.run([sys.executable, "-I", "-c", SCAN, str(package_root), str(tree)])
    finally:
        roots.end()
        users.end()

    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["as_uid"] == unprivileged_user.uid
    assert found["seen"] == f"only the processes of uid {unprivileged_user.uid} of this node's pid namespace"
    assert found["unreadable"] >= 1  # root's mapper among them
    assert roots.pid not in found["pids"]
    assert len(found["pids"]) == 1  # the user's own mapper (setpriv execs it in place)
    assert found["pids"] == [users.pid]


def test_a_tree_reached_through_a_symlink_is_found_under_the_name_the_kernel_gives(tmp_path):
    from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import inuse  # noqa: PLC0415

    real = tmp_path / "gpfs" / "apps"
    real.mkdir(parents=True)
    (real / "data").write_bytes(bytes(4096))
    link = tmp_path / "apps"
    link.symlink_to(real)
    holder = Holder([sys.executable, "-I", "-c", OPENER, str(link / "data")])
    try:
        found = inuse.scan([str(link)])
    finally:
        holder.end()

    assert [process.pid for process in found.users[str(link)]] == [holder.pid]
    assert found.users[str(link)][0].uses == ("fd",)


def _wait_for_program(pid: int, name: str) -> None:
    for _attempt in range(300):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return
        except OSError:
            pass
        subprocess.run(["sleep", "0.01"], check=True)
    pytest.fail(f"{name} never ran as pid {pid}")


def test_one_process_of_another_user_whose_environment_names_every_retired_tree_keeps_them_all(
    staged_site, attacker_user
):
    # The choice the threat model records ("Pinning"): a value of an environment that names
    # a tree keeps it, as an open file would, even where its user cannot read the tree. One
    # sleeping process pins every retired tree it names until it ends; gc names it, its
    # user and how it uses them, so that the administrator can end it.
    modules = ("TinyApp/1.0", "TinyLib/1.0")
    staged_site.install(*modules, payload="old")
    done = staged_site.run("--json", *staged_site.rebuild_args(*modules))
    assert done.returncode == 0, done.stderr
    retired = sorted(entry["retired_path"] for entry in json.loads(done.stdout)["modules"])
    for tree in retired:
        os.chmod(tree, 0o700)  # root's alone: the attacker cannot even look inside
    pinner = Holder(
        attacker_user.command(["env", f"PINNED=/nowhere:{':'.join(retired)}", "sleep", "600"]),
        env=attacker_user.env(),
        ready=False,
    )
    try:
        _wait_for_program(pinner.pid, "sleep")
        kept = _gc(staged_site, "--no-squeue")
    finally:
        pinner.end()

    assert kept["removed"] == []
    entries = sorted(
        (entry for entry in kept["kept"] if entry["path"] in retired), key=lambda entry: entry["path"]
    )
    assert [entry["path"] for entry in entries] == retired
    for entry in entries:
        assert entry["why"] == f"in use by 1 process (pids {pinner.pid}; users {attacker_user.name})"
        (process,) = entry["processes"]
        assert (process["pid"], process["uid"]) == (pinner.pid, attacker_user.uid)
        assert process["uses"] == ["environ"]
    assert all(Path(tree).is_dir() for tree in retired)

    removed = _gc(staged_site, "--no-squeue")

    assert sorted(entry["path"] for entry in removed["removed"]) == retired
    assert not any(Path(tree).exists() for tree in retired)
