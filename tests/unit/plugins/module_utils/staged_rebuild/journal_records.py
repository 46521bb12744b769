"""Journals made directly for the unit tests, with the records the core writes.

``publish_journal`` is a rebuild's journal as ``rebuild.rebuild`` creates it before the
build (its request, its trees and one entry per module); ``retire_journal`` is a retire's as
``retire.retire`` writes it. A test then changes what it needs (``journal.run.state``,
``entry.retired_path``, ...) and saves: the typed loader reads every such journal back.
"""

from __future__ import annotations

import hashlib
import os

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import paths
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.journal import (
    STATE_INVARIANTS,
    JobRecord,
    Journal,
    ModuleEntry,
    RunKind,
    RunState,
    now,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.records import AbsPath
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.request import RebuildRequest

APP = "TinyApp/1.0"
# Never run: a journal records the EasyBuild command, these tests do not build.
EB = "/opt/easybuild/bin/eb"


def trees_of(installpath) -> paths.Trees:
    return paths.Trees.from_installpath(str(installpath))


def rebuild_request(trees, modules=(APP,), run_id="run1", **fields) -> RebuildRequest:
    """A request as ``request.resolve`` makes it (without its checks of the disk)."""
    values = {"backend": "installpath", "run_id": run_id, **fields}
    return RebuildRequest(
        software=AbsPath(trees.software),
        modules=AbsPath(trees.modules),
        modules_requested=list(modules),
        eb=EB,
        eb_args=[module.replace("/", "-") + ".eb" for module in modules],
        **values,
    )


def publish_journal(runs_dir, run_id, trees, modules=(APP,), state=RunState.BUILDING, **request_fields):
    """A publish run's journal in ``runs_dir`` (created if need be), one entry per module,
    each with what a run in ``state`` always has (``journal.STATE_INVARIANTS``): its
    live-change record, and once planned, the files and hashes planning writes and the
    inodes of its stable and retired paths (0 for a path that does not exist)."""
    os.makedirs(runs_dir, exist_ok=True)
    request = rebuild_request(trees, modules, run_id, **request_fields)
    journal = Journal.create(
        str(runs_dir),
        run_id,
        kind=RunKind.PUBLISH,
        state=state,
        trees=trees,
        request=request,
        backend=request.backend,
        # A queued run always has its job's record (and a job id once submitted).
        job=JobRecord(submitted=now(), job_id="4242") if state is RunState.QUEUED else None,
    )
    journal.run.modules = [ModuleEntry.of(entry) for entry in request.module_paths(run_id)]
    has = STATE_INVARIANTS[(RunKind.PUBLISH, state)].entry_fields
    for entry in journal.modules:
        if "live_record" in has and not request.skip_live_check:
            entry.live_record = journal.write_file(entry.live_record_name(), b"{}\n")
        if "prepared_module" in has:
            plan(journal, entry)
    journal.save()
    return journal


def plan(journal, entry, module_text=None):
    """What planning writes into ``entry`` (``planner.plan``): the prepared module file, the
    backup of the module file live before (``module_text``: by default one whose root is the
    stable path) with both hashes, and the inodes of the stable and the retired path."""
    prepared = os.fsencode(f'local root = "{entry.stable_path}"\n')
    entry.prepared_module = journal.write_file(entry.prepared_module_name(), prepared)
    entry.new_module_sha256 = hashlib.sha256(prepared).hexdigest()
    old = prepared if module_text is None else os.fsencode(module_text)
    entry.module_backup = journal.write_file(entry.module_backup_name(), old)
    entry.old_module_sha256 = hashlib.sha256(old).hexdigest()
    entry.stage_ino, entry.live_ino = (
        os.lstat(path).st_ino if os.path.lexists(path) else 0
        for path in (entry.stable_path, entry.retired_path)
    )


def retire_journal(
    runs_dir,
    run_id,
    *,
    module_file,
    software_dir,
    retired_to=None,
    reason="on CVMFS",
    state=RunState.RETIRED,
    retired_at=None,
):
    """A retire run's journal in ``runs_dir`` (created if need be); its file kept where
    ``retire.retire`` keeps it unless ``retired_to`` says otherwise."""
    os.makedirs(runs_dir, exist_ok=True)
    if retired_to is None:
        retired_to = paths.retired_module_path(os.path.dirname(str(runs_dir)), run_id, str(module_file))
    return Journal.create(
        str(runs_dir),
        run_id,
        kind=RunKind.RETIRE,
        state=state,
        module_file=AbsPath(str(module_file)),
        retired_to=AbsPath(str(retired_to)),
        module_sha256="00" * 32,
        software_dir=AbsPath(str(software_dir)),
        reason=reason,
        retired_at=retired_at or now(),
    )
