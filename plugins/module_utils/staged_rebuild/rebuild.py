# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``rebuild``: build a complete replacement beside the live install, then swap it in.

Order: check the request (before the lock: nothing on disk changes for a refused request);
take the state-root lock; create the journal; take the live-change record; build into the
run's generation directory; plan; publish. The lock is held from the journal's creation to
the end, so build, plan and publish are one transaction for every other run on this state
root.
"""

from __future__ import annotations

import binascii
import datetime
import os
import shutil

from ..common import errors, locking
from . import backends, easybuild, ledger, operations, paths, planner, probe, publish
from . import journal as journals

BACKENDS = ("auto", "installpath")


def new_run_id():
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{binascii.hexlify(os.urandom(3)).decode()}"


def check_request(request):
    """Refuse a bad request before anything is written; return the trees and module paths."""
    trees = paths.Trees(request["software"], request["modules"])
    if request.get("backend", "auto") not in BACKENDS:
        raise errors.UsageError(
            "--backend {} is not available; choose one of {}".format(request["backend"], ", ".join(BACKENDS))
        )
    if not request.get("modules_requested"):
        raise errors.UsageError("rebuild needs at least one --module NAME/VERSION")
    run_id = paths.check_run_id(request.get("run_id") or new_run_id())
    seen, module_paths = set(), []
    for value in request["modules_requested"]:
        name, version = paths.parse_module(value)
        if (name, version) in seen:
            raise errors.UsageError(f"--module {value} is given twice")
        seen.add((name, version))
        entry = paths.ModulePaths(trees, name, version, run_id)
        paths.require_live_dir(entry)
        paths.require_module_file_path(entry)
        if os.path.lexists(entry.retired_path):
            raise errors.UsageError(f"{entry.retired_path} exists already; pick another --run-id")
        module_paths.append(entry)
    if request.get("ledger_config"):
        ledger.load_config(request["ledger_config"])
    if not os.path.isfile(request["eb"]) or not os.access(request["eb"], os.X_OK):
        raise errors.UsageError(
            "EasyBuild command {} is not an executable file (--eb, EB_STAGED_REBUILD_EB)".format(
                request["eb"]
            )
        )
    return trees, run_id, module_paths


def describe(request, trees, run_id):
    generation = trees.generation(run_id)
    _kept, removed = easybuild.filter_args(request["eb_args"])
    return {
        "run_id": run_id,
        "backend": "installpath",
        "sandboxed": False,
        "generation": generation,
        "command": backends.command(request["eb"], request["eb_args"], generation),
        "removed_options": removed,
    }


def dry_run(request):
    """What a rebuild would do; writes nothing, takes no lock, runs nothing."""
    trees, run_id, module_paths = check_request(request)
    result = describe(request, trees, run_id)
    result.update(
        {
            "dry_run": True,
            "changed": False,
            "modules": [entry.module for entry in module_paths],
            "probes": probe.sandbox_probes(),
        }
    )
    return result


def rebuild(request, state_root, faults, progress, env):
    trees, run_id, module_paths = check_request(request)
    state_root = paths.prepare_state_root(state_root)
    with locking.StateLock(state_root, request.get("lock_timeout", 0)):
        interrupted = [
            run.run_id for run in journals.run_journals(state_root) if run.state in journals.INTERRUPTED
        ]
        if interrupted:
            raise errors.UsageError(
                f"run {', '.join(interrupted)} was interrupted; 'eb-staged-rebuild resume' finishes it first"
            )
        journal = journals.Journal.create(
            os.path.join(state_root, "runs"),
            run_id,
            kind="publish",
            state="building",
            schema=journals.SCHEMA_SWAP_LEDGER if request.get("ledger_config") else journals.SCHEMA_SWAP,
            trees=trees.as_dict(),
            request=request,
        )
        for entry in module_paths:
            journal.modules.append(
                {
                    "module": entry.module,
                    "name": entry.name,
                    "version": entry.version,
                    "stable_path": entry.stable_path,
                    "retired_path": entry.retired_path,
                    "module_file": entry.module_file(),
                }
            )
        for entry in journal.modules:
            planner.record_live(journal, entry, request.get("skip_live_check"))
        journal.save()
        return build_and_publish(journal, trees, faults, progress, env)


def build_and_publish(journal, trees, faults, progress, env):
    """The build, the plan and the publish of an existing journal (also resume of ``building``)."""
    request = journal.data["request"]
    ledger_config = ledger.load_config(request["ledger_config"]) if request.get("ledger_config") else None
    generation = trees.generation(journal.run_id)
    if os.path.lexists(generation):
        shutil.rmtree(generation)  # a previous attempt's partial build
    os.makedirs(generation, mode=0o755)
    command = backends.command(request["eb"], request["eb_args"], generation)
    progress(backends.UNSANDBOXED)
    step = journal.start("build")
    try:
        backends.run(command, backends.environment(env), journal.run_dir, progress)
        journal.finish(step)
        plan_env = dict(
            env, EB_STAGED_REBUILD_RUN_ID=journal.run_id, EB_STAGED_REBUILD_RUN_DIR=journal.run_dir
        )
        planner.plan(journal, trees, generation, faults, prepare=request.get("prepare"), env=plan_env)
    except BaseException:
        operations.discard_stage(journal, generation)
        journal.data["refused"] = True
        journal.set_state("failed")
        raise
    try:
        publish.publish(journal, trees, faults, ledger_config)
    except BaseException:
        if journal.state == "failed":  # fully reversed: the new tree was never live
            operations.discard_stage(journal, generation)
        raise
    operations.remove_generation(generation)
    return {
        "run_id": journal.run_id,
        "changed": True,
        "state": journal.state,
        "modules": [
            {
                "module": entry["module"],
                "stable_path": entry["stable_path"],
                "retired_path": entry["retired_path"],
            }
            for entry in journal.modules
        ],
        "journal": journal.path,
    }
