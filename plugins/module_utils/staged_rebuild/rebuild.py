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

from ..common import errors
from . import (
    backends,
    buildrun,
    easybuild,
    ledger,
    locking,
    operations,
    paths,
    planner,
    probe,
    publish,
    relocate,
)
from . import journal as journals

_SHOWN_BINARIES = 10


def new_run_id():
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{binascii.hexlify(os.urandom(3)).decode()}"


def check_request(request, probed=None):
    """Refuse a bad request before anything is written; return the trees and module paths."""
    trees = paths.Trees(request["software"], request["modules"])
    if request.get("backend", "auto") not in backends.BACKENDS:
        raise errors.UsageError(
            f"--backend {request['backend']} is not one of {', '.join(backends.BACKENDS)}"
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
    # Last: the probes run programs, and a request refused for a plain reason should not wait.
    backend = backends.select(request.get("backend", "auto"), probed)
    return trees, run_id, module_paths, backend


def _build(backend, trees, run_id, modules):
    names = [(module["name"], module["version"]) for module in modules]
    return backends.Build(backend, trees, trees.generation(run_id), names)


def describe(request, trees, run_id, backend, module_paths):
    modules = [{"name": entry.name, "version": entry.version} for entry in module_paths]
    build = _build(backend, trees, run_id, modules)
    _kept, removed = easybuild.filter_args(request["eb_args"])
    return {
        "run_id": run_id,
        "backend": backend,
        "sandboxed": backend in backends.SANDBOXED,
        "generation": build.generation,
        "command": build.command(request["eb"], request["eb_args"]),
        "removed_options": removed,
        "removed_environment": sorted(set(os.environ) - set(easybuild.filter_env(os.environ))),
    }


def dry_run(request):
    """What a rebuild would do; writes nothing, takes no lock, runs nothing."""
    # Every probe once: the report shows them all, and the backend is chosen from them.
    probes = probe.sandbox_probes()
    trees, run_id, module_paths, backend = check_request(request, probes)
    result = describe(request, trees, run_id, backend, module_paths)
    result.update(
        {
            "dry_run": True,
            "changed": False,
            "modules": [entry.module for entry in module_paths],
            "probes": probes,
        }
    )
    return result


def rebuild(request, state_root, faults, progress, env):
    trees, run_id, module_paths, backend = check_request(request)
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
            backend=backend,
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


def _relocate(build, journal, allow_unrelocated):
    """Rewrite the generation paths in the staged trees; refuse binaries that still name them."""
    roots = []
    for name, version in build.modules:
        roots.append(os.path.join(build.stage_software, name, version))
        roots.append(os.path.join(build.stage_modules, "all", name))
    rewrites = relocate.mapping(build.generation, build.trees.software, build.trees.modules)
    rewritten, binaries = relocate.relocate(roots, rewrites)
    journal.data["relocated_files"] = len(rewritten)
    if not binaries:
        return []
    # Named by where they will be live: the generation is gone when the message is read.
    shown = ", ".join(relocate.live_name(path, rewrites) for path in binaries[:_SHOWN_BINARIES])
    more = f" and {len(binaries) - _SHOWN_BINARIES} more" if len(binaries) > _SHOWN_BINARIES else ""
    if not allow_unrelocated:
        raise errors.PublishError(
            f"binaries still name the build path {build.generation}: {shown}{more}; nothing was swapped "
            "(--allow-unrelocated publishes them as they are)"
        )
    return [f"published with binaries that name the removed build path {build.generation}: {shown}{more}"]


def build_and_publish(journal, trees, faults, progress, env):
    """The build, the plan and the publish of an existing journal (also resume of ``building``)."""
    request = journal.data["request"]
    ledger_config = ledger.load_config(request["ledger_config"]) if request.get("ledger_config") else None
    build = _build(journal.data.get("backend", "installpath"), trees, journal.run_id, journal.modules)
    generation = build.generation
    if os.path.lexists(generation):
        operations.remove_tree(generation)  # a previous attempt's partial build
    os.makedirs(generation, mode=0o755)
    if build.backend == "installpath":
        progress(backends.UNSANDBOXED)
    step = journal.start("build")
    try:
        setup = build.prepare()
        buildrun.run(
            build.command(request["eb"], request["eb_args"]),
            build.environment(env, request["eb"]),
            journal.run_dir,
            progress,
            setup,
        )
        build.check()
        journal.finish(step)
        step = journal.start("relocate")
        warnings = _relocate(build, journal, request.get("allow_unrelocated"))
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
        "backend": build.backend,
        "sandboxed": build.backend in backends.SANDBOXED,
        "warnings": warnings,
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
