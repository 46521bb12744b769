"""The sites and the bookkeeping of the failure-injection and crash matrices of eb-staged-rebuild.

A matrix case needs a live tree whose old state differs from what a rebuild publishes in
every respect the engine touches, so that "entirely old" and "entirely new" can be told
apart: the live module file carries one extra line (the rebuilt one does not) and the
module-class link is relative (the publish makes it absolute, as EasyBuild does), next to
the payload ``old`` and the directory inodes.

The list of operations (or journaled steps) a matrix covers is found by running the
engine once on a throw-away site, at collection time, so that an operation added to the
engine becomes a case of its own without anyone editing the tests.

The ``chain`` variant is a stack rebuild: TinyLib, TinyApp built on it and TinyTop built on
TinyApp, rebuilt as ``--module TinyLib/1.0 --with-dependants -- TinyLib-1.0.eb``, the run
finding the two dependants in the live tree (their easyconfig copies and module files) and
building them from their own easyconfig copies. A chain needs a backend that shows each new
build at its live path; the test builder runs in the userns sandbox as it runs anywhere.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pwd
import re
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    faults,
    paths,
    rebuild,
    rollback,
    swap,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import journal as journals
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import request as request_module
from tests.support.staged import FAKE_EB, StagedSite, snapshot

ONE = ("TinyApp/1.0",)
# The chain's members in build order: the named package, then its dependants.
TARGET = "TinyLib/1.0"
CHAIN = (TARGET, "TinyApp/1.0", "TinyTop/1.0")
DEPENDS = "TinyTop/1.0:TinyApp/1.0,TinyApp/1.0:TinyLib/1.0"
CHAIN_BACKEND = "userns"
OLD_MODULE_LINE = b"-- installed before the staged rebuild\n"
ACL_XATTR = "system.posix_acl_access"
EARLIER_LEDGER = b'{"record": "from an earlier run"}\n'
KILL_AT = "STAGED_TEST_KILL_AT_OPERATION"

# Variants of a publish: the modules, and whether the run appends to a ledger.
VARIANTS = {
    "one": (ONE, False),
    "chain": (CHAIN, False),
    "ledger": (ONE, True),
}


def easyconfig(module: str) -> str:
    return module.replace("/", "-") + ".eb"


def is_chain(modules) -> bool:
    return tuple(modules) == CHAIN


def rebuild_args(site: StagedSite, modules, extra=()) -> list:
    """The command line of a rebuild of ``modules``: for the chain, its named package with
    ``--with-dependants``; else each module given (``StagedSite.rebuild_args``)."""
    if not is_chain(modules):
        return site.rebuild_args(*modules, extra=extra)
    return [
        "rebuild",
        f"--installpath={site.installpath}",
        f"--backend={CHAIN_BACKEND}",
        "--module",
        TARGET,
        "--with-dependants",
        *extra,
        "--",
        easyconfig(TARGET),
    ]


def depends_for(modules) -> str:
    return DEPENDS if len(modules) > 1 else ""


def class_link(site: StagedSite, module: str) -> Path:
    return site.modules / "tools" / (module + ".lua")


def builder_env(modules, **extra) -> dict:
    """The test builder's switches; it runs on this interpreter (a pyenv shim costs 0.2 s a call)."""
    return {"FAKE_EB_PYTHON": sys.executable, "FAKE_EB_DEPENDS": depends_for(modules), **extra}


def install(site: StagedSite, modules) -> None:
    """``StagedSite.install`` (payload ``old``), with the builder on this interpreter."""
    done = subprocess.run(
        [str(FAKE_EB), f"--installpath={site.installpath}", *map(easyconfig, modules)],
        env=dict(os.environ, **builder_env(modules, FAKE_EB_PAYLOAD="old")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def prepare_old_site(site: StagedSite, modules, ledger=False) -> None:
    """Install ``modules`` live, then make their module files and class links unlike a rebuild's."""
    install(site, modules)
    for module in modules:
        module_file = site.module_file(module)
        module_file.write_bytes(module_file.read_bytes() + OLD_MODULE_LINE)
        link = class_link(site, module)
        link.unlink()
        link.symlink_to(os.path.relpath(module_file, link.parent))
    if ledger:
        ledger_file(site).write_bytes(EARLIER_LEDGER)
        ledger_config(site).write_text(json.dumps({"path": str(ledger_file(site)), "site": "matrix"}))


def ledger_file(site: StagedSite) -> Path:
    return site.installpath.parent / "ledger.jsonl"


def ledger_config(site: StagedSite) -> Path:
    return site.installpath.parent / "ledger.json"


def restrict_module_files(site: StagedSite, modules) -> None:
    """Mode 0640, owner ``nobody`` and a real POSIX ACL on each live module file (tests run as root)."""
    nobody = pwd.getpwnam("nobody").pw_uid
    files = [site.module_file(module) for module in modules]
    for module_file in files:
        os.chown(module_file, nobody, -1)
        os.chmod(module_file, 0o640)
    subprocess.run(["setfacl", "-m", "u:nobody:r", *map(str, files)], check=True, capture_output=True)
    for module_file in files:
        # The premise of every comparison after: the file really carries an access ACL.
        assert os.getxattr(module_file, ACL_XATTR, follow_symlinks=False)


def module_file_state(path: Path) -> dict:
    """What a module-file replacement must keep or restore: bytes, owner, mode and the ACL.

    The ACL is the raw ``system.posix_acl_access`` value (what ``getfacl`` decodes), None
    when the file has none.
    """
    info = os.lstat(path)
    try:
        acl = os.getxattr(path, ACL_XATTR, follow_symlinks=False)
    except OSError as err:
        if err.errno != errno.ENODATA:
            raise
        acl = None
    return {
        "bytes": path.read_bytes(),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "mode": stat.S_IMODE(info.st_mode),
        "acl": acl,
    }


def subtree(full_snapshot: dict, root: Path) -> dict:
    """The entries of a ``snapshot()`` at or under ``root``."""
    prefix = str(root) + os.sep
    return {
        path: entry for path, entry in full_snapshot.items() if path == str(root) or path.startswith(prefix)
    }


def without_inodes_of(full_snapshot: dict, files) -> dict:
    """``full_snapshot`` without the inodes of ``files``: restoring a module file or a class
    link writes a new inode with the old content (which the snapshot still compares)."""
    names = {str(path) for path in files}
    return {
        path: entry[:3] + entry[4:] if path in names and entry is not None else entry
        for path, entry in full_snapshot.items()
    }


def request(site: StagedSite, modules, ledger=False) -> request_module.RebuildRequest:
    """The request ``eb-staged-rebuild rebuild ...`` (``rebuild_args``) resolves to."""
    options = {
        "installpath": str(site.installpath),
        "modules": list(modules),
        # Outside a chain, no sandbox: the same transaction at less cost.
        "backend": "installpath",
        "eb": str(FAKE_EB),
        "ledger_config": str(ledger_config(site)) if ledger else None,
    }
    if is_chain(modules):
        options.update(modules=[TARGET], with_dependants=True, backend=CHAIN_BACKEND)
        return request_module.resolve(options, {}, [easyconfig(TARGET)])
    return request_module.resolve(options, {}, list(map(easyconfig, modules)))


def build_env(modules) -> dict:
    return dict(os.environ, **builder_env(modules))


def rebuild_in_process(site: StagedSite, modules, fault_plan, ledger=False) -> dict:
    """``rebuild.rebuild`` with ``fault_plan`` (a ``faults.Faults``); progress lines are dropped."""
    return rebuild.rebuild(
        request(site, modules, ledger),
        str(site.state_root),
        lambda _line: None,
        build_env(modules),
        faults=fault_plan,
    )


def the_journal(site: StagedSite) -> journals.Journal:
    """The one run journal of ``site`` (each case makes exactly one run)."""
    (found,) = journals.run_journals(str(site.state_root))
    return found


def trees(site: StagedSite) -> paths.Trees:
    return paths.Trees(str(site.software), str(site.modules))


def rollback_in_process(site: StagedSite, fault_plan) -> dict:
    journal = the_journal(site)
    journal.faults = fault_plan
    return rollback.rollback(journal, trees(site))


@contextlib.contextmanager
def scratch_site(modules, ledger=False):
    with tempfile.TemporaryDirectory(prefix="staged-matrix-") as tmp:
        site = StagedSite(
            installpath=Path(tmp, "apps"), state_root=Path(tmp, "state"), package_root=Path(tmp)
        )
        prepare_old_site(site, modules, ledger)
        yield site


def count_publish_operations(variant: str) -> list:
    """The recorded operations of a successful publish of ``variant``, in order."""
    modules, ledger = VARIANTS[variant]
    with scratch_site(modules, ledger) as site:
        counting = faults.Faults()
        rebuild_in_process(site, modules, counting, ledger)
        return list(counting.operations)


def count_rollback_operations(modules) -> list:
    """The recorded operations of a successful rollback of a published run of ``modules``."""
    with scratch_site(modules) as site:
        rebuild_in_process(site, modules, faults.Faults())
        counting = faults.Faults()
        rollback_in_process(site, counting)
        return list(counting.operations)


def journaled_steps(modules, ledger=False) -> tuple:
    """The journal's step names of a successful publish of ``modules``, then of its rollback."""
    with scratch_site(modules, ledger) as site:
        rebuild_in_process(site, modules, faults.Faults(), ledger)
        published = the_journal(site).step_names()
        rollback_in_process(site, faults.Faults())
        return published, the_journal(site).step_names()[len(published) :]


def with_fallback(names, journal_points=False) -> list:
    """Steps of a publish where RENAME_EXCHANGE fails: each swap does three renames.

    With ``journal_points``, ``names`` are fault operations, where each rename, as every
    journaled step, is also followed by the point before its journal write.
    """
    expanded = []
    for name in names:
        expanded.append(name)
        if name.startswith("swap "):
            module = name[len("swap ") :]
            for rename in swap.FALLBACK_STEPS:
                expanded.append(f"{rename} {module}")
                if journal_points:
                    expanded.append(f"journal {rename} {module}")
    return expanded


def on_fuse(fuse_dir: Path, tmp_path: Path, package_root: Path) -> StagedSite:
    """A site whose live trees are on bindfs (no RENAME_EXCHANGE), the state root on ext4."""
    return StagedSite(installpath=fuse_dir / "apps", state_root=tmp_path / "state", package_root=package_root)


def case_id(index: int, name: str) -> str:
    return "{:02d}-{}".format(index, re.sub(r"\s+", "_", name))


# --- Real processes ---------------------------------------------------------------------------

# Runs the real command, except that the recorded operation named in $STAGED_TEST_KILL_AT_OPERATION
# kills the process with SIGKILL instead of running: Faults.before is the one place every
# operation passes, and unlike the journal's hook (which fires before an operation) it
# also names the points after an operation and before its journal write.
_KILLING_CLI = f"""
import os, signal, sys
from hpcstack_ops.staged_rebuild import cli, faults
_before = faults.Faults.before
def before(self, operation):
    if operation == os.environ[{KILL_AT!r}]:
        os.kill(os.getpid(), signal.SIGKILL)
    return _before(self, operation)
faults.Faults.before = before
raise SystemExit(cli.main(sys.argv[1:]))
"""


def run_killed_at_operation(
    site: StagedSite, operation: str, *args: str, env=None
) -> subprocess.CompletedProcess:
    """Run ``eb-staged-rebuild ARGS`` so that it dies by SIGKILL at the recorded ``operation``."""
    command = [sys.executable, "-c", _KILLING_CLI, "--state-root", str(site.state_root), *args]
    return subprocess.run(
        command,
        env=site.tool_env(**{KILL_AT: operation}, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


KILLED = -signal.SIGKILL


# --- Old, new or mixed --------------------------------------------------------------------------


def old_state(site: StagedSite, modules) -> dict:
    """Per module, what "entirely old" means: taken from the prepared site before any run."""
    return {
        module: {
            "inode": site.live(module).stat().st_ino,
            "payload": site.payload(module),
            "module_bytes": site.module_file(module).read_bytes(),
            "class_link": os.readlink(class_link(site, module)),
        }
        for module in modules
    }


def _seen(site: StagedSite, module: str) -> dict:
    live, module_file, link = site.live(module), site.module_file(module), class_link(site, module)
    is_dir = live.is_dir() and not live.is_symlink()
    return {
        "inode": live.stat().st_ino if is_dir else None,
        "payload": site.payload(module) if (live / "PAYLOAD").is_file() else None,
        "module_bytes": module_file.read_bytes() if module_file.is_file() else None,
        "class_link": os.readlink(link) if link.is_symlink() else None,
    }


def _new_state(site: StagedSite, module: str, seen: dict, old: dict, run_dir: Path) -> dict:
    """What "entirely new" means for ``module``.

    The new inode is not known in advance, only that it is not the old one: the wanted value
    is the inode seen when that holds, else a placeholder no inode equals.
    """
    name, version = module.split("/")
    prepared = run_dir / "prepared" / name / (version + ".lua")
    module_bytes = prepared.read_bytes() if prepared.is_file() else "<no prepared module file>"
    if isinstance(module_bytes, bytes) and f'local root = "{site.live(module)}"'.encode() not in module_bytes:
        module_bytes = "<the prepared module file does not set root to the live path>"
    return {
        "inode": seen["inode"] if seen["inode"] not in (None, old["inode"]) else "<another inode>",
        "payload": "new build",
        "module_bytes": module_bytes,
        "class_link": str(site.module_file(module)),
    }


def _shown(value, site):
    if isinstance(value, bytes):
        return "sha256:" + hashlib.sha256(value).hexdigest()[:12]
    return repr(value).replace(str(site.installpath), "<apps>")


def _differences(seen: dict, wanted: dict, site: StagedSite) -> list:
    return [
        f"{key} {_shown(seen[key], site)} != {_shown(wanted[key], site)}"
        for key in wanted
        if seen[key] != wanted[key]
    ]


def classify(site: StagedSite, old: dict, run_dir: Path) -> tuple:
    """``("old" | "new" | "mixed", detail)`` for the modules of ``old`` (an ``old_state()``).

    A module is old when its live inode, payload, module-file bytes and class-link target
    are those of ``old``; new when the live directory is another inode with the new payload,
    the module file holds the bytes the run prepared (root = the live path) and the class
    link names the module file. ``detail`` gives each module's verdict, and for a mixed one
    what differs from old and from new.
    """
    verdicts, detail = set(), {}
    for module, was in old.items():
        seen = _seen(site, module)
        not_old = _differences(seen, was, site)
        not_new = _differences(seen, _new_state(site, module, seen, was, run_dir), site)
        verdict = "old" if not not_old else "new" if not not_new else "mixed"
        verdicts.add(verdict)
        detail[module] = verdict if verdict != "mixed" else {"unlike old": not_old, "unlike new": not_new}
    overall = verdicts.pop() if len(verdicts) == 1 else "mixed"
    return overall, detail


def leftover_holds(site: StagedSite) -> list:
    """Names the three-rename fallback holds a live tree under between its renames."""
    return sorted(str(path) for path in site.software.rglob("*.fallback-old"))


def site_snapshot(site: StagedSite) -> dict:
    return snapshot(site.software, site.modules)
