# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``rebuild``: build a complete replacement beside the live install, then swap it in.

Order: the request was resolved and checked (``request.resolve``: nothing on disk changes
for a refused request); take the state-root lock; create the journal; take the live-change
record; build into the run's generation directory; plan; publish. The lock is held from the
journal's creation to the end, so build, plan and publish are one transaction for every
other run on this state root.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..common import errors
from ..common.errors import setting
from . import (
    backends,
    buildrun,
    dependants,
    easybuild,
    ebquery,
    fsutil,
    locking,
    naming,
    operations,
    paths,
    planner,
    probe,
    publish,
    relocate,
    wouldbuild,
)
from . import journal as journals
from . import syntax as module_syntax
from .faults import Faults
from .journal import JobRecord, Journal, ModuleEntry, RunKind, RunState, StepKind
from .request import UNSANDBOXED_CHAIN, RebuildRequest

_SHOWN_BINARIES = 10
# Why the installpath backend cannot publish most compiled packages, and what the host needs.
UNRELOCATED_WHY = (
    "EasyBuild writes the install path into binaries (RPATH, on by default since EasyBuild 5), and "
    "the installpath backend builds elsewhere; the bwrap and userns backends build at the live path: "
    "they need a working bubblewrap ('bwrap --dev-bind / / true') or user namespaces "
    "(sysctl user.max_user_namespaces above 0)"
)
Progress = Callable[[str], None]


def _build(backend: str, request: RebuildRequest, run_id: str) -> backends.Build:
    entries = request.module_paths(run_id)
    names = [(entry.name, entry.version, entry.module) for entry in entries]
    return backends.Build(
        backend,
        request.trees,
        request.trees.generation(run_id),
        names,
        request.module_syntax(run_id),
        request.build_order(run_id),
    )


def eb_args(request: RebuildRequest, easyconfigs: Optional[List[str]] = None) -> List[str]:
    """EasyBuild's arguments of the run: the user's, and for a chain its dependants'
    easyconfigs in build order, right after the named module's (EasyBuild builds the
    easyconfigs given in the order given). ``easyconfigs`` are the copies the run took
    (``dependants.take_copies``); by default the live copies, for the checks that only read them."""
    if request.chain is None:
        return list(request.eb_args)
    if easyconfigs is None:
        easyconfigs = [member.easyconfig for member in request.chain.members[1:]]
    args = list(request.eb_args)
    named = request.chain.members[0].easyconfig
    place = args.index(named) + 1 if named in args else 0
    return [*args[:place], *easyconfigs, *args[place:]]


def refuse_unsandboxed_chain(request: RebuildRequest, backend: str) -> None:
    """A chain needs each staged build at its live path: the installpath backend, also when
    ``auto`` picks it, is refused before anything is built."""
    if request.chain is not None and backend not in backends.SANDBOXED:
        raise errors.UsageError(
            f"{UNSANDBOXED_CHAIN}, and neither works here ({setting('backend')} {request.backend} "
            "picked installpath; eb-staged-rebuild probe --path DIR tells why)"
        )


def describe(
    request: RebuildRequest, backend: str, easyconfigs: Optional[List[str]] = None
) -> Dict[str, Any]:
    """What a run of ``request`` would build with, and what it removes from EasyBuild's input."""
    build = _build(backend, request, request.run_id or "")
    _kept, removed = easybuild.filter_args(request.eb_args)
    return {
        "run_id": request.run_id,
        "backend": backend,
        "sandboxed": backend in backends.SANDBOXED,
        "generation": build.generation,
        "command": build.command(request.eb, eb_args(request, easyconfigs)),
        "removed_options": removed,
        "removed_environment": sorted(set(os.environ) - set(easybuild.filter_env(os.environ))),
    }


def easybuild_configuration(request: RebuildRequest, backend: str, env: Mapping[str, str]) -> Dict[str, Any]:
    """``eb --show-config`` of the staged command in the staged environment: the configuration
    EasyBuild would build with (``text``; each line says where the value came from: C for an
    option, E for a variable, F for a configuration file, D for a default), or ``error``.
    EasyBuild only reads its configuration for this and exits, building nothing
    (``ebquery.ask``); the line of its scratch ``tmpdir`` is left out of the text."""
    build = _build(backend, request, request.run_id or "")
    try:
        done = ebquery.ask(
            request.eb,
            build.command(request.eb, eb_args(request)),
            build.environment(dict(env), request.eb),
            lambda _scratch: ["--show-config"],
            "eb --show-config",
        )
    except ebquery.Unanswered as err:
        return {"text": None, "error": str(err)}
    text = done.stdout.decode("utf-8", "replace")
    shown = [line for line in text.splitlines(keepends=True) if not line.startswith("tmpdir ")]
    return {"text": "".join(shown), "error": None}


def refuse_configured_scheme(request: RebuildRequest, configuration: Mapping[str, Any]) -> None:
    """Refuse a naming scheme that only EasyBuild's configuration names (a configuration file,
    which the request's own check cannot see), as ``naming.check_scheme`` does the others.
    A configuration EasyBuild could not show refuses nothing: the build then fails saying why."""
    if configuration.get("text") is not None:
        scheme, given_as = easybuild.configured_scheme(configuration["text"])
        naming.check_scheme(scheme, given_as, list(request.modules_requested))


def _check_configured_scheme(request: RebuildRequest, backend: str, env: Mapping[str, str]) -> None:
    """Before the build: the scheme of EasyBuild's configuration files, when neither the run's
    arguments nor the environment name one (those the request checked) and a configuration
    file may; one ``--show-config`` then (EasyBuild's start costs a second of CPU). Without
    one, the scheme is EasyBuild's default."""
    if easybuild.naming_scheme(request.eb_args, env)[0] is not None:
        return
    if easybuild.configuration_files(request.eb_args, env):
        refuse_configured_scheme(request, easybuild_configuration(request, backend, env))
    else:
        naming.check_scheme(None, None, list(request.modules_requested))


def _check_would_build(request: RebuildRequest, backend: str, env: Mapping[str, str], run_id: str) -> None:
    """A hierarchical run: EasyBuild's dry run must place the live modules (``wouldbuild``)."""
    build = _build(backend, request, run_id)
    child_env = build.environment(dict(env), request.eb)
    child_env["MODULEPATH"] = build.module_path(child_env.get("MODULEPATH", ""))
    argv = wouldbuild.command(
        request.eb, eb_args(request), module_syntax.placement(build.syntax), build.order
    )
    wouldbuild.check(request.eb, argv, child_env, request.module_paths(run_id))


def dry_run(
    request: RebuildRequest, env: Optional[Mapping[str, str]] = None, state_root: Optional[str] = None
) -> Dict[str, Any]:
    """What a rebuild would do; writes nothing and takes no lock. It runs the sandbox probes
    and, with ``env`` (EasyBuild's environment), ``eb --show-config`` of the staged command.
    A chain's command names the copies its run would take under ``state_root``."""
    # Every probe once: the report shows them all, and the backend is chosen from them.
    probes = probe.sandbox_probes()
    backend = backends.select(request.backend, probes)
    refuse_unsandboxed_chain(request, backend)
    copies = None
    if request.chain is not None and state_root is not None:
        run_dir = os.path.join(os.path.abspath(state_root), "runs", request.run_id or "")
        copies = dependants.copy_paths(request.chain, run_dir)
    result = describe(request, backend, copies)
    result.update(
        {"dry_run": True, "changed": False, "modules": list(request.modules_requested), "probes": probes}
    )
    if request.chain is not None:
        result["plan"] = request.chain.to_result()
        result["warnings"] = list(request.chain.warnings)
    if env is not None:
        result["easybuild_configuration"] = easybuild_configuration(request, backend, env)
        refuse_configured_scheme(request, result["easybuild_configuration"])
    return result


def refuse_while_interrupted(state_root: str) -> None:
    """A run that a crash interrupted is finished first: its trees may be half swapped."""
    interrupted = [journal.run_id for journal in journals.interrupted(state_root)]
    if interrupted:
        raise errors.UsageError(
            f"run {', '.join(interrupted)} was interrupted; 'eb-staged-rebuild resume' finishes it first"
        )


def _check_before_build(request: RebuildRequest, env: Mapping[str, str], run_id: str) -> str:
    """The checks that pick the backend and ask EasyBuild (the last before a build, on the
    host that builds); returns the backend."""
    # Last of the checks: the probes run programs, and a request refused for a plain reason
    # (in request.resolve) did not wait for them.
    backend = backends.select(request.backend)
    refuse_unsandboxed_chain(request, backend)
    _check_configured_scheme(request, backend, env)
    _check_would_build(request, backend, env, run_id)
    return backend


def _record_modules(journal: Journal) -> None:
    """The run's module entries with their live-change records, saved in one write before the
    build; a failure ends the run ``failed``."""
    request = journal.request
    try:
        journal.run.modules = [ModuleEntry.of(entry) for entry in request.module_paths(journal.run_id)]
        for entry in journal.modules:
            planner.record_live(journal, entry, request.skip_live_check)
        journal.save()
    except BaseException as err:
        end_failed(journal, request.trees.generation(journal.run_id), err)
        raise


def rebuild(
    request: RebuildRequest,
    state_root: str,
    progress: Progress,
    env: Mapping[str, str],
    faults: Optional[Faults] = None,
) -> Dict[str, Any]:
    """Build, plan and publish ``request`` under the state-root lock; ``faults`` is for tests."""
    run_id = request.run_id or ""
    backend = _check_before_build(request, env, run_id)
    state_root = paths.prepare_state_root(state_root)
    # Read first: a journal that does not load refuses before the lock file is written. Whether
    # a run is interrupted is asked only under the lock: another run may be in progress.
    journals.check_all(state_root)
    with locking.StateLock(state_root, request.lock_timeout):
        refuse_while_interrupted(state_root)
        journal = Journal.create(
            os.path.join(state_root, "runs"),
            run_id,
            kind=RunKind.PUBLISH,
            state=RunState.BUILDING,
            trees=request.trees,
            request=request,
            backend=backend,
        )
        if faults is not None:
            journal.faults = faults
        _record_modules(journal)
        return build_and_publish(journal, progress, env)


def queue(request: RebuildRequest, state_root: str, *, target: Optional[str] = None) -> Journal:
    """The run of ``request`` for a batch job: the journal in state ``queued``, made under the
    state lock, with the job's record (``submitted``; ``target``, the site's name of the CPU
    target it builds for). Every check of ``request.resolve`` was made; the backend, and the
    checks that ask EasyBuild, are the job's (``start_queued``): its node picks them. A
    backend named (not ``auto``) that cannot build a chain is refused here already.
    Raises UsageError (nothing written) or JournalError."""
    if target is not None and not paths.is_plain_name(target):
        raise errors.UsageError(f"target {target!r} is not a plain name")
    if request.backend != "auto":
        refuse_unsandboxed_chain(request, request.backend)
    run_id = request.run_id or ""
    state_root = paths.prepare_state_root(state_root)
    journals.check_all(state_root)
    with locking.StateLock(state_root, request.lock_timeout):
        return Journal.create(
            os.path.join(state_root, "runs"),
            run_id,
            kind=RunKind.PUBLISH,
            state=RunState.QUEUED,
            trees=request.trees,
            request=request,
            job=JobRecord(submitted=journals.now(), target=target),
        )


def record_job(journal: Journal, job_id: str) -> None:
    """Save the scheduler's id of ``journal``'s job (digits; refused otherwise, unsaved)."""
    job = journal.run.job
    if job is None:
        raise errors.JournalError(f"journal {journal.path}: run {journal.run_id} was not queued for a job")
    if not journals.JOB_ID.match(job_id):
        raise errors.UsageError(f"job id {job_id!r} is not a job id (digits)")
    job.job_id = job_id
    journal.save()


def start_queued(
    state_root: str,
    run_id: str,
    progress: Progress,
    env: Mapping[str, str],
    *,
    node: str,
    job_id: Optional[str] = None,
    check_node: Optional[Callable[[Journal], None]] = None,
    faults: Optional[Faults] = None,
) -> Dict[str, Any]:
    """The job's part of a queued run, under the state lock: record ``node`` and the start (and
    ``job_id``, the job's own, when its submission had not recorded it yet: Slurm may
    start a job before sbatch has answered), ``check_node(journal)`` (it raises, a
    PublishError, to refuse the node), the checks ``rebuild`` makes before building, then
    build, plan, and publish, or stop ``staged`` when the request publishes together. A
    refusal ends the run ``failed`` with its reason before anything is built (no
    generation directory is made)."""
    paths.check_run_id(run_id)
    if not paths.is_plain_name(node):
        raise errors.UsageError(f"node name {node!r} is not a plain name")
    state_root = paths.prepare_state_root(state_root)
    # Read first: a journal that does not load refuses before the lock file is written.
    journals.check_all(state_root)
    lock_timeout = journals.find(state_root, run_id).request.lock_timeout
    with locking.StateLock(state_root, lock_timeout):
        journal = journals.find(state_root, run_id)
        if journal.state is not RunState.QUEUED or journal.run.job is None:
            raise errors.UsageError(
                f"run {run_id} is {journal.state.value}, not queued; only a queued run is started by its job"
            )
        if faults is not None:
            journal.faults = faults
        journal.run.job.node = node
        journal.run.job.started = journals.now()
        if journal.run.job.job_id is None and job_id is not None and journals.JOB_ID.match(job_id):
            journal.run.job.job_id = job_id
        journal.save()
        request = journal.request
        try:
            if check_node is not None:
                check_node(journal)
            refuse_while_interrupted(state_root)
            journal.run.backend = _check_before_build(request, env, run_id)
            journal.set_state(RunState.BUILDING)
        except BaseException as err:
            end_failed(journal, request.trees.generation(run_id), err)
            raise
        _record_modules(journal)
        return build_and_publish(journal, progress, env)


def end_failed(journal: Journal, generation: str, err: BaseException) -> None:
    """A run that fails before it publishes ends ``failed`` (refused) with its stage discarded,
    before ``err`` reaches the user: resume then leaves it alone, and the next rebuild runs.

    The stage is discarded first, as far as the disk lets it (what stays goes with gc). When
    even the journal cannot be written (ENOSPC, EROFS), a ``JournalError`` says so in one line,
    naming ``err`` too, and the run stays as the disk has it: ``building``, without its
    generation directory, which resume then ends ``failed`` without building it.
    """
    # A read-only or full disk may keep some of it: gc removes a finished run's generation.
    with contextlib.suppress(OSError, errors.UsageError):
        operations.discard_stage(journal, generation)
    on_disk = journal.state
    journal.run.refused = True
    journal.run.record_failure(err)
    try:
        journal.set_state(RunState.FAILED)
    except OSError as journal_err:
        journal.run.state = on_disk  # what the journal on disk still says
        cause = err.strerror if isinstance(err, OSError) and err.strerror else errors.marked(err)
        built = os.path.lexists(generation)
        raise errors.JournalError(
            f"run {journal.run_id} failed ({cause}) and its journal {journal.path} could not be marked "
            f"failed: {journal_err.strerror}; it stays {on_disk.value} ('eb-staged-rebuild resume' "
            + ("finishes it" if built else "ends it failed, building nothing,")
            + " once the disk is writable)"
        ) from None


def _relocate(build: backends.Build, journal: Journal, allow_unrelocated: bool) -> List[str]:
    """Rewrite the generation paths in the staged trees; refuse binaries that still name them."""
    roots = []
    for name, version, module in build.modules:
        roots.append(os.path.join(build.stage_software, name, version))
        roots.append(os.path.join(build.stage_modules, "all", os.path.dirname(module)))
    rewrites = relocate.mapping(build.generation, build.trees.software, build.trees.modules)
    rewritten, binaries = relocate.relocate(roots, rewrites)
    journal.run.relocated_files = len(rewritten)
    if not binaries:
        return []
    # Named by where they will be live: the generation is gone when the message is read.
    shown = ", ".join(relocate.live_name(path, rewrites) for path in binaries[:_SHOWN_BINARIES])
    more = f" and {len(binaries) - _SHOWN_BINARIES} more" if len(binaries) > _SHOWN_BINARIES else ""
    if not allow_unrelocated:
        raise errors.PublishError(
            f"binaries still name the build path {build.generation}: {shown}{more}; nothing was swapped. "
            f"{UNRELOCATED_WHY} ({setting('allow_unrelocated')} publishes them as they are, "
            "runnable only where the module environment finds their libraries)"
        )
    return [f"published with binaries that name the removed build path {build.generation}: {shown}{more}"]


def _naming_the_member(request: RebuildRequest, failed: errors.PublishError) -> errors.PublishError:
    """A chain's failed build, said with the member whose build EasyBuild failed on: its
    reason names only an easyconfig file, a dependant's copy in the run's directory."""
    member = None
    if request.chain is not None:
        member = dependants.failed_member(request.chain, failed.details.get("easybuild_reason"))
    if member is None:
        return failed
    return errors.PublishError(
        f"{member.module} failed to build: {failed}", details=dict(failed.details, member=member.module)
    )


def build_and_publish(journal: Journal, progress: Progress, env: Mapping[str, str]) -> Dict[str, Any]:
    """The build, the plan and the publish of an existing journal (also resume of ``building``)."""
    request = journal.request
    trees = journal.trees
    build = _build(journal.run.backend or "installpath", request, journal.run_id)
    generation = build.generation
    warnings: List[str] = []
    try:
        if os.path.lexists(generation):
            fsutil.remove_tree(generation, root=trees.software)  # a previous attempt's partial build
        fsutil.makedirs(generation, root=trees.software, mode=0o755)
        if build.backend == "installpath":
            progress(backends.UNSANDBOXED)
        copies = None
        if request.chain is not None:
            copies = dependants.take_copies(request.chain, journal.run_dir, trees.software)
        with journal.step(StepKind.BUILD):
            setup = build.prepare()
            try:
                buildrun.run(
                    build.command(request.eb, eb_args(request, copies)),
                    build.environment(dict(env), request.eb),
                    journal.run_dir,
                    progress,
                    setup,
                )
            except errors.PublishError as failed:
                raise _naming_the_member(request, failed) from None
            build.check()
        with journal.step(StepKind.RELOCATE):
            warnings = _relocate(build, journal, request.allow_unrelocated)
        plan_env = dict(
            env, EB_STAGED_REBUILD_RUN_ID=journal.run_id, EB_STAGED_REBUILD_RUN_DIR=journal.run_dir
        )
        planner.plan(journal, trees, generation, prepare=request.prepare, env=plan_env)
        if request.publish_together:
            # Planned, nothing live changed: the stage waits beside the live tree for
            # ``publish`` (with the other targets' runs) or ``discard``.
            journal.set_state(RunState.STAGED)
    except BaseException as err:
        end_failed(journal, generation, err)
        raise
    if journal.state is not RunState.STAGED:
        publish_planned(journal)
    return _result(journal, build.backend, warnings)


def publish_planned(journal: Journal) -> None:
    """Publish a planned run and remove its build area; a publish that failed and was
    reversed discards the stage too (the new tree was never live)."""
    trees, request = journal.trees, journal.request
    generation = trees.generation(journal.run_id)
    try:
        publish.publish(journal, trees, request.ledger_settings())
    except BaseException:
        if journal.state is RunState.FAILED:  # fully reversed: the new tree was never live
            operations.discard_stage(journal, generation)
        raise
    operations.remove_generation(trees, generation)


def _result(journal: Journal, backend: str, warnings: List[str]) -> Dict[str, Any]:
    request = journal.request
    if request.chain is not None:
        warnings = [*request.chain.warnings, *warnings]
    result = {
        "run_id": journal.run_id,
        "backend": backend,
        "sandboxed": backend in backends.SANDBOXED,
        "warnings": warnings,
        "changed": True,
        "state": journal.state.value,
        "modules": [
            {"module": entry.module, "stable_path": entry.stable_path, "retired_path": entry.retired_path}
            for entry in journal.modules
        ],
        "journal": journal.path,
    }
    if request.chain is not None:
        result["plan"] = request.chain.to_result()
    return result
