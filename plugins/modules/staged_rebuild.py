#!/usr/bin/python
# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_rebuild
short_description: Rebuild EasyBuild installs beside the live tree and swap them in atomically
version_added: 0.1.0
description:
  - Runs a staged rebuild of C(eb-staged-rebuild) on the target host. EasyBuild builds a complete
    replacement of each module beside its live install; the replacement is then swapped into the
    live path in one atomic exchange per module, and the module files are updated. The tree that
    was live is kept beside it, so that M(hpcstack.ops.staged_rollback) can put it back.
  - With O(rebuild=changed) (the default), nothing is built when every module is live from a
    byte-identical copy of one of the O(easyconfigs) and was built by the EasyBuild that O(eb)
    runs now, as the live install's C(easybuild/) directory records.
  - A run interrupted by a crash must be finished first with M(hpcstack.ops.staged_resume);
    until then every rebuild is refused.
  - With O(with_dependants=true), the run is a stack rebuild of the one module in O(modules) and
    every installed package built on it, directly or through others, at run or build time (as
    each install's own easyconfig copy and the live module files say). Each dependant is
    rebuilt from its own install's easyconfig copy, against the new builds before it, and all
    of them are published in one transaction. Check mode returns the plan in RV(plan).
  - With O(job=true), the rebuild runs as Slurm batch jobs submitted from the target host, which
    needs Slurm's client commands; one job per target of O(targets) in the site file
    O(targets_file), each on a node of its target (the target's constraint or partition), which
    checks with archdetect that the node is of that target before it builds; without O(targets),
    one job for the trees given. The module waits up to O(wait_timeout) seconds for the jobs and
    returns one entry per target in RV(targets). With O(publish=together) a last job publishes
    every target after all of them built, or none when one failed or was cancelled. Check mode
    lists the jobs it would submit in RV(jobs) and submits nothing. See C(docs/slurm-targets.md).
author:
  - hpcstack.ops maintainers (@hpcstack)
extends_documentation_fragment:
  - hpcstack.ops.staged_rebuild
  - hpcstack.ops.staged_rebuild.attributes
attributes:
  check_mode:
    support: full
    details: Check mode compares the live installs and checks the request, and builds nothing.
  diff_mode:
    support: full
    details: The diff shows each live directory's inode and the module files, before and after.
  idempotent:
    description: When run twice with the same arguments, the second run reports no change.
    support: partial
    details: With O(rebuild=changed), a second run with the same easyconfigs and EasyBuild reports
      no change; with O(rebuild=always) every run rebuilds.
options:
  modules:
    description:
      - The modules to rebuild, each as C(NAME/VERSION); each must be installed live already.
    type: list
    elements: str
    required: true
  easyconfigs:
    description:
      - Easyconfig files to build from; they come first among EasyBuild's arguments.
      - O(rebuild=changed) compares the live installs with these files.
    type: list
    elements: path
    default: []
  eb_args:
    description:
      - Further arguments for EasyBuild, after O(easyconfigs) (for example V(--robot)).
      - Options that would send the build elsewhere (the install paths among them) are removed.
    type: list
    elements: str
    default: []
  installpath:
    description:
      - The live tree, with C(software/) and C(modules/) in it.
      - When neither this nor O(installpath_software) is given, the target host's
        E(EASYBUILD_INSTALLPATH_SOFTWARE) and E(EASYBUILD_INSTALLPATH_MODULES), else
        E(EASYBUILD_INSTALLPATH), as EasyBuild reads them.
    type: path
  installpath_software:
    description:
      - The live software tree, for a site whose software and modules are not under one directory.
    type: path
  installpath_modules:
    description:
      - The live module tree, with O(installpath_software).
    type: path
  backend:
    description:
      - How EasyBuild is run. V(bwrap) and V(userns) build in a sandbox in which the live paths
        are where the build writes; V(installpath) builds unsandboxed into a separate directory
        and rewrites the paths afterwards; V(auto) takes the first of them that works on the host.
      - When not given, the target host's E(EB_STAGED_REBUILD_BACKEND) (the build_host role sets
        it in the installed command), else V(auto).
    type: str
    choices: [auto, bwrap, userns, installpath]
  eb:
    description:
      - The EasyBuild command.
      - When not given, the target host's E(EB_STAGED_REBUILD_EB), else C(eb) found on E(PATH).
    type: str
  run_id:
    description:
      - The name of the run (a plain name); by default one made of the time and a random suffix.
      - An empty string is refused (it is not a plain name), not replaced by a generated one.
    type: str
  skip_live_check:
    description:
      - Skip the check that the live installs did not change while EasyBuild built; by default a
        live file that changed during the build refuses the swap.
    type: bool
    default: false
  allow_unrelocated:
    description:
      - With O(backend=installpath), publish binaries that still name the build path, with a
        warning, instead of refusing the swap.
    type: bool
    default: false
  ledger_config:
    description:
      - A JSON file with the keys C(path) (the ledger, a JSON Lines file) and C(site) (a label);
        each module the run publishes is then appended to the ledger as one line, within the
        publish transaction.
    type: path
  with_dependants:
    description:
      - Rebuild, with the one module in O(modules), every installed package of the live tree
        that depends on it, directly or through other packages, at run or build time; all of
        them are built in one EasyBuild run, dependencies first, and published in one
        transaction.
      - O(easyconfigs) are the named module's; each dependant is rebuilt from the easyconfig
        copy its own install holds (C(<install>/easybuild/<name>-<version>.eb)).
      - Needs a backend that shows each new build at its live path (V(bwrap) or V(userns));
        with V(installpath) (given, or picked by V(auto)) the task fails before building.
      - A dependant whose easyconfig copy is missing or unreadable, or whose dependency
        resolves to no live install or to more than one, fails the task before any build.
    type: bool
    default: false
  exclude:
    description:
      - With O(with_dependants=true), dependants to leave out, each as C(NAME/VERSION); a
        member left out takes with it every member that depends on the module only through
        it. Each is reported in the C(excluded) list of RV(plan) and warned about, as it keeps
        linking the old build.
      - A value that is not a member of the plan fails the task.
    type: list
    elements: str
    default: []
  rebuild:
    description:
      - V(changed) rebuilds only when a module's live install differs from the requested
        easyconfigs or was built by another EasyBuild version; V(always) rebuilds every time.
    type: str
    choices: [changed, always]
    default: changed
  job:
    description:
      - Submit the rebuild as Slurm batch jobs (C(sbatch)) instead of building on the target host;
        the journals are written on the target host first, so the trees and state roots must be
        on a filesystem the compute nodes share.
      - The jobs run the command E(EB_STAGED_REBUILD_COMMAND) of the target host's environment
        names, else C(/usr/local/bin/eb-staged-rebuild) (where the build_host role installs it),
        with the environment the task runs with (Slurm's C(--export=ALL)); E(SBATCH_*) variables
        reach C(sbatch) as they are.
      - With O(rebuild=changed), a target whose live installs match the requested easyconfigs
        and EasyBuild (the version O(eb) reports on the target host) gets no job; when none needs
        one, nothing is submitted.
    type: bool
    default: false
  job_cores:
    description:
      - With O(job=true), the cores of each build job (C(sbatch --cpus-per-task)); given without
        O(job=true), as are O(job_max_walltime) and O(targets), the task fails.
    type: int
  job_max_walltime:
    description:
      - With O(job=true), the hours each build job may run (C(sbatch --time)).
    type: float
  targets_file:
    description:
      - The site file of CPU targets (an INI file, see C(docs/slurm-targets.md)), which names per
        target its trees and state root, archdetect's answer on its nodes and the constraint or partition
        that reaches them.
      - When not given, the target host's E(EB_STAGED_REBUILD_TARGETS).
    type: path
  targets:
    description:
      - With O(job=true), the targets of O(targets_file) to rebuild, one job each; V(all) is every
        target of the file. The site file names their trees, so O(installpath) and O(state_root)
        go without it.
    type: list
    elements: str
    default: []
  publish:
    description:
      - With O(job=true), V(each) publishes every target when its own build is done; V(together)
        stops each target's run once built and checked (state C(staged)) and publishes all of them
        in a last job, or none of them when a target's job failed or was cancelled.
      - When not given, V(each); given without O(job=true), the task fails.
    type: str
    choices: [each, together]
  wait_timeout:
    description:
      - With O(job=true), seconds to wait for the jobs; the task fails with C(error=wait_timeout)
        when they have not ended by then (they go on in Slurm). V(0) returns once they are
        submitted, with RV(targets) as submitted.
    type: float
    default: 3600
notes:
  - EasyBuild's output is not shown while it runs; its step lines come back in RV(progress), and the
    whole log stays in the run's directory under O(state_root).
seealso:
  - module: hpcstack.ops.staged_resume
  - module: hpcstack.ops.staged_rollback
  - module: hpcstack.ops.staged_info
"""

EXAMPLES = r"""
- name: Rebuild TinyApp when its easyconfig or EasyBuild changed
  hpcstack.ops.staged_rebuild:
    state_root: /apps/.eb-staged-rebuild
    installpath: /apps
    modules:
      - TinyApp/1.0
    easyconfigs:
      - /srv/easyconfigs/TinyApp-1.0.eb
    eb_args:
      - --robot
  register: rebuilt

- name: Rebuild two modules every time, in a user-namespace sandbox
  hpcstack.ops.staged_rebuild:
    state_root: /apps/.eb-staged-rebuild
    installpath_software: /apps/software
    installpath_modules: /apps/modules
    modules:
      - TinyLib/1.0
      - TinyApp/1.0
    easyconfigs:
      - /srv/easyconfigs/TinyLib-1.0.eb
      - /srv/easyconfigs/TinyApp-1.0.eb
    backend: userns
    rebuild: always

- name: Rebuild zlib and every installed package built on it, except one left for later
  hpcstack.ops.staged_rebuild:
    state_root: /apps/.eb-staged-rebuild
    installpath: /apps
    modules:
      - zlib/1.3.1-GCCcore-13.3.0
    easyconfigs:
      - /srv/easyconfigs/zlib-1.3.1-GCCcore-13.3.0.eb
    with_dependants: true
    exclude:
      - Perl/5.38.2-GCCcore-13.3.0
    rebuild: always
  register: stack

- name: Show the plan a stack rebuild would follow, changing nothing
  hpcstack.ops.staged_rebuild:
    state_root: /apps/.eb-staged-rebuild
    installpath: /apps
    modules:
      - zlib/1.3.1-GCCcore-13.3.0
    easyconfigs:
      - /srv/easyconfigs/zlib-1.3.1-GCCcore-13.3.0.eb
    with_dependants: true
    rebuild: always
  check_mode: true
  register: stack_plan

- name: Rebuild TinyLib on a node of each CPU target, publishing all targets together
  hpcstack.ops.staged_rebuild:
    modules:
      - TinyLib/1.0
    easyconfigs:
      - /srv/easyconfigs/TinyLib-1.0.eb
    rebuild: always
    job: true
    job_cores: 4
    job_max_walltime: 2
    targets_file: /apps/targets.ini
    targets:
      - all
    publish: together
    wait_timeout: 7200
  register: per_target
"""

RETURN = r"""
run_id:
  description: The run, as M(hpcstack.ops.staged_rollback) and M(hpcstack.ops.staged_info) name it.
    With O(job=true), every target's run has this id in its own state root.
  returned: when a rebuild ran, or in check mode when one would run
  type: str
  sample: 20261201T053043Z-89e721
state:
  description: V(published) after a rebuild; V(up_to_date) when nothing needed one.
  returned: success, except in check mode when a rebuild would run
  type: str
  sample: published
backend:
  description: The backend the build ran in (or would run in).
  returned: when a rebuild ran, or in check mode when one would run
  type: str
  sample: userns
sandboxed:
  description: Whether the build ran in a sandbox.
  returned: when a rebuild ran, or in check mode when one would run
  type: bool
  sample: true
modules:
  description:
    - After a rebuild, one entry per module in publish order, with C(module), C(stable_path) (the
      live directory) and C(retired_path) (where the tree that was live is kept).
    - In check mode, the modules that would be rebuilt, as C(NAME/VERSION).
  returned: when a rebuild ran, or in check mode when one would run
  type: list
  elements: raw
  sample:
    - module: TinyApp/1.0
      stable_path: /apps/software/TinyApp/1.0
      retired_path: /apps/software/TinyApp/.1.0.20261201T053043Z-89e721
up_to_date:
  description:
    - With O(rebuild=changed), each module with C(up_to_date) and C(why) (the reason it is or is not).
  returned: when O(rebuild=changed)
  type: list
  elements: dict
  sample:
    - module: TinyApp/1.0
      up_to_date: false
      why: built by EasyBuild 5.4.1, not by 5.4.2
journal:
  description: The run's journal file.
  returned: when a rebuild ran
  type: str
  sample: /apps/.eb-staged-rebuild/runs/20261201T053043Z-89e721/journal.json
progress:
  description: EasyBuild's step lines and the tool's notices, in order.
  returned: success
  type: list
  elements: str
  sample:
    - "== building and installing TinyApp/1.0..."
    - "== COMPLETED: Installation ended successfully"
plan:
  description:
    - With O(with_dependants=true), the stack rebuild's plan; C(target) the named module,
      C(members) each module of the run in build order (the named one first) with C(module),
      C(install) (C(Name/version) under the software tree), C(easyconfig) (what it is rebuilt
      from), C(reason) (the dependency path from it to the target) and C(kind) (V(runtime) or
      V(build)), and C(excluded) (the members O(exclude) left out).
  returned: when O(with_dependants=true) and a rebuild ran, or in check mode when one would run
  type: dict
  sample:
    target: zlib/1.3.1-GCCcore-13.3.0
    members:
      - module: zlib/1.3.1-GCCcore-13.3.0
        install: zlib/1.3.1-GCCcore-13.3.0
        easyconfig: /srv/easyconfigs/zlib-1.3.1-GCCcore-13.3.0.eb
        reason: [zlib/1.3.1-GCCcore-13.3.0]
        kind: runtime
      - module: libpng/1.6.43-GCCcore-13.3.0
        install: libpng/1.6.43-GCCcore-13.3.0
        easyconfig: /apps/software/libpng/1.6.43-GCCcore-13.3.0/easybuild/libpng-1.6.43-GCCcore-13.3.0.eb
        reason: [libpng/1.6.43-GCCcore-13.3.0, zlib/1.3.1-GCCcore-13.3.0]
        kind: runtime
    excluded: []
command:
  description: The command the build would run.
  returned: in check mode when a rebuild would run
  type: list
  elements: str
probes:
  description: What the sandbox probes found on the host (C(bwrap), C(userns), C(auto_backend), ...).
  returned: in check mode when a rebuild would run
  type: dict
easybuild_configuration:
  description:
    - C(text), EasyBuild's configuration for the build (C(eb --show-config) of the command), or
      C(error), why it could not be shown.
  returned: in check mode when a rebuild would run
  type: dict
easybuild_reason:
  description:
    - EasyBuild's own reason for a failed build (its last C(ERROR:) line, else its C(== FAILED:) line);
      null when it said neither. The failure's C(msg) names it too.
  returned: when EasyBuild ran and failed
  type: str
  sample: "Installation of toy-0.0.eb failed: Sanity check failed: no file found at 'bin/toy'"
targets:
  description:
    - With O(job=true), one entry per target (or one for the trees given) in submission order
      with C(target), C(state_root), C(job_id), C(node) (where the job ran, as its journal
      records it), C(job_state) (Slurm's, such as V(COMPLETED), V(FAILED) or V(CANCELLED)),
      C(state) (the run's state, V(published), V(staged), V(failed), V(queued)...), C(published),
      C(cancelled) and C(reason) (why the run failed, EasyBuild's own reason for a failed
      build; null otherwise).
    - With O(wait_timeout=0), as submitted, with C(target), C(job_id) and C(state_root).
  returned: when O(job=true) and jobs were submitted
  type: list
  elements: dict
  sample:
    - target: zen3
      state_root: /apps/zen3/.eb-staged-rebuild
      job_id: "4711"
      node: node017
      job_state: COMPLETED
      state: staged
      published: false
      cancelled: false
      reason: null
lines:
  description: With O(job=true), one line per target of RV(targets), for a report.
  returned: when O(job=true) and the module waited for the jobs
  type: list
  elements: str
  sample:
    - "zen3: staged, job 4711 on node017 COMPLETED, not published"
    - "icelake: failed, job 4712 on node101 FAILED, not published: Installation of TinyLib-1.0.eb failed: ..."
publish_job:
  description: With O(publish=together), the job id of the last job, which publishes every target.
  returned: when O(job=true) and jobs were submitted
  type: str
publish_job_state:
  description: Slurm's state of the publish job (V(CANCELLED) when a target's job failed).
  returned: when O(publish=together) and the module waited for the jobs
  type: str
next:
  description:
    - The commands that finish runs left C(staged) (a target's job failed or was cancelled);
      C(eb-staged-rebuild publish RUN ...) publishes them, C(eb-staged-rebuild discard RUN ...)
      removes their builds; empty when none is staged.
  returned: when O(job=true) and the module waited for the jobs
  type: list
  elements: str
jobs:
  description:
    - In check mode with O(job=true), the jobs it would submit, in order, each with C(target),
      C(state_root), C(publish) (the last job of O(publish=together)), C(sbatch) (the command)
      and C(script) (the batch script sbatch is given).
  returned: in check mode with O(job=true)
  type: list
  elements: dict
build_log:
  description: EasyBuild's whole output of the failed build.
  returned: when EasyBuild ran and failed
  type: str
  sample: /apps/.eb-staged-rebuild/runs/20261201T053043Z-89e721/build.log
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    cli,
    commands,
    jobwait,
    module_support,
    settings,
    submission,
    uptodate,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import request as request_module

COMMANDS = {"changed": commands.rebuild_if_changed, "always": commands.run_rebuild}


def argument_spec():
    return dict(
        **module_support.common_arguments(),
        **settings.argument_spec(request_module.RebuildRequest),
        modules={"type": "list", "elements": "str", "required": True},
        easyconfigs={"type": "list", "elements": "path", "default": []},
        eb_args={"type": "list", "elements": "str", "default": []},
        installpath={"type": "path"},
        installpath_software={"type": "path"},
        installpath_modules={"type": "path"},
        eb={"type": "str"},
        rebuild={"type": "str", "choices": ["changed", "always"], "default": "changed"},
        job={"type": "bool", "default": False},
        job_cores={"type": "int"},
        job_max_walltime={"type": "float"},
        targets_file={"type": "path"},
        targets={"type": "list", "elements": "str", "default": []},
        # No default: a value given without job is refused (the command line's --publish too).
        publish={"type": "str", "choices": [submission.EACH, submission.TOGETHER]},
        wait_timeout={"type": "float", "default": 3600.0},
    )


def request(params, environ):
    """The core's request from the options; the install paths fall back as EasyBuild's do."""
    return request_module.resolve(params, environ, params["easyconfigs"] + params["eb_args"])


def job_values(params):
    """The module's options as the submission reads them (its ``target`` is ``targets``)."""
    return dict(params, target=params["targets"])


def option_name(name):
    """A setting as this module's messages name it: the submission's ``target`` is ``targets``."""
    return "targets" if name == "target" else module_support.option_name(name)


def refuse_job_options(module):
    """The job options without O(job=true) fail the task, as the command line refuses them."""
    try:
        submission.resolve(job_values(module.params), os.environ)
    except commands.FAILURES as err:
        module.fail_json(
            msg=commands.failure_message(err, name_of=option_name), error=commands.failure_kind(err)
        )


def submit_jobs(params, environ, dry_run):
    """``rebuild --job``: the jobs planned, then (not in check mode) submitted and waited for."""
    jobs = submission.resolve(job_values(params), environ)
    if jobs.target and (params["state_root"] or any(params[name] for name in request_module.TREE_OPTIONS)):
        raise errors.UsageError(
            "state_root and installpath go without targets: the site file names each target's trees"
        )
    state_root = None if jobs.target else module_support.state_root(params, environ)
    eb_args = params["easyconfigs"] + params["eb_args"]
    prepared = submission.prepare(job_values(params), environ, eb_args, jobs, state_root)
    if params["rebuild"] == "changed":
        prepared = _outdated(prepared)
        if not prepared.placements:
            nothing = {"changed": False, "state": "up_to_date", "run_id": prepared.run_id}
            return dict(nothing, would_change=False) if dry_run else nothing
    tool = submission.tool_command(environ, [])
    targets_file = jobs.targets_file if jobs.target else None
    planned = submission.plan_jobs(
        prepared.run_id,
        prepared.placements,
        jobs.job_options,
        tool,
        together=jobs.together,
        targets_file=targets_file,
        lock_timeout=params["lock_timeout"],
    )
    if dry_run:
        return {
            "would_change": True,
            "dry_run": True,
            "run_id": prepared.run_id,
            "jobs": [job.as_dict() for job in planned],
        }
    submitted = submission.submit_rebuild(prepared, planned, dict(environ))
    if params["wait_timeout"] <= 0:
        return dict(submitted, targets=submitted["jobs"])
    states = jobwait.wait(submitted, environ, params["wait_timeout"])
    return dict(jobwait.report(submitted, states, tool[0], targets_file), changed=True)


def _outdated(prepared):
    """``prepared`` without the targets whose live installs are up to date."""
    kept = [
        (placement, wanted)
        for placement, wanted in zip(prepared.placements, prepared.requests)
        if not all(entry["up_to_date"] for entry in uptodate.compare(wanted))
    ]
    return submission.Prepared(prepared.run_id, [pair[0] for pair in kept], [pair[1] for pair in kept])


def run_jobs(module):
    """The module with O(job=true): fails, with the per-target report, unless every target
    was published (or, with wait_timeout 0, submitted)."""
    result, failure = module_support.run(
        lambda dry_run: submit_jobs(module.params, os.environ, dry_run), module.check_mode
    )
    if failure is not None:
        module.fail_json(**failure)
    why = (
        None
        if module.check_mode or "lines" not in result
        else jobwait.failed(result, module.params["publish"] == submission.TOGETHER)
    )
    if why is not None:
        module.fail_json(msg=why, error="publish_failed", **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("installpath", "installpath_software"), ("installpath", "installpath_modules")],
        required_together=[("installpath_software", "installpath_modules")],
        supports_check_mode=True,
    )
    if module.params["job"]:
        run_jobs(module)
        return
    refuse_job_options(module)
    rebuild = COMMANDS[module.params["rebuild"]]
    # Never printed: the module's stdout is its JSON result.
    progress = []

    def snapshot():
        wanted = request(module.params, os.environ)
        return module_support.live_snapshot(wanted.software, wanted.modules, wanted.modules_requested)

    result, failure = module_support.run(
        lambda dry_run: rebuild(
            request(module.params, os.environ),
            module_support.state_root(module.params, os.environ),
            progress.append,
            dict(os.environ),
            dry_run,
        ),
        module.check_mode,
        module._diff,
        snapshot=snapshot,
        progress=progress,
    )
    if failure is not None:
        module.fail_json(**failure)
    # The tool's own notices (an unsandboxed build) are warnings, as its --json output shows them.
    for line in result["progress"]:
        if line.startswith(cli.PROG + ":"):
            module.warn(module_support.warning(line))
    for warning in result.pop("warnings", []):
        module.warn(module_support.warning(warning))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
