# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``eb-staged-rebuild`` command.

    eb-staged-rebuild [--state-root DIR] [--lock-timeout S] [--json] [--debug] COMMAND ...

Every command returns a plain result dict: ``--json`` prints it as one JSON document (what
the Ansible modules return), and otherwise ``text`` words it for people. Expected errors
print one line, ``eb-staged-rebuild: <message>``, and exit 2; a traceback only with
``--debug``. Exit 1 means done, with warnings, each on stderr as
``eb-staged-rebuild: warning: <what>``.

What reaches the terminal goes through ``common.printable`` (the text's values, every
stderr line); what ``--json`` prints is valid Unicode (``unicode_result``): nothing a value
holds can drive the terminal, and nothing can fail the final write once the work is done.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from ..common import errors
from ..common.printable import printable, unicode_result
from ..common.version import VERSION
from . import commands, probe, settings, slurmjob, submission, targets, text
from . import request as request_module

PROG = "eb-staged-rebuild"


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one error line (exit 2), like every other refusal."""

    def error(self, message):
        raise errors.UsageError(f"{message} (see '{self.prog} --help')")


# Each subcommand's examples, shown at the end of its --help (and in docs/staged-rebuild.md or
# docs/reference/eb-staged-rebuild.md).
EXAMPLES = {
    "rebuild": (
        "eb-staged-rebuild rebuild --dry-run --installpath /apps --module GROMACS/2024.1-foss-2023b \\",
        "    -- GROMACS-2024.1-foss-2023b.eb --robot",
        "eb-staged-rebuild rebuild --dry-run --installpath /apps --module zlib/1.3.1-GCCcore-13.2.0 \\",
        "    --with-dependants -- zlib-1.3.1-GCCcore-13.2.0.eb",
        "eb-staged-rebuild rebuild --job --targets-file /apps/targets.ini --target all --publish together \\",
        "    --job-cores 16 --job-max-walltime 4 --module hello/1.0 -- hello-1.0.eb",
    ),
    "job-start": (
        "eb-staged-rebuild job-start fix-4711 --state-root /apps/.staged   # a job's script runs this",
        "eb-staged-rebuild job-start fix-4711 --state-root /apps/zen3/.eb-staged-rebuild \\",
        "    --targets-file /apps/targets.ini",
    ),
    "publish": (
        "eb-staged-rebuild publish fix-4711 --targets-file /apps/targets.ini --target all",
        "eb-staged-rebuild --state-root /apps/.staged publish fix-4711",
    ),
    "discard": (
        "eb-staged-rebuild discard fix-4711 --targets-file /apps/targets.ini --target all",
        "eb-staged-rebuild --state-root /apps/.staged discard fix-4711",
    ),
    "resume": (
        "eb-staged-rebuild resume            # every interrupted run",
        "eb-staged-rebuild resume fix-4711   # only this one",
    ),
    "rollback": (
        "eb-staged-rebuild rollback fix-4711",
        "eb-staged-rebuild rollback retire-20261202T101500123456Z   # put a retired module file back",
    ),
    "retire": (
        "eb-staged-rebuild retire /apps/modules/all/zlib/1.2.13.lua --reason 'CVE-2023-45853'",
        "eb-staged-rebuild --lock-timeout 60 retire /apps/modules/all/Foo/1.0.lua --reason 'replaced'",
    ),
    "gc": (
        "eb-staged-rebuild gc --dry-run         # what would go, and why the rest stays",
        "eb-staged-rebuild gc --grace-hours 48  # the site's longest walltime plus a margin",
        "eb-staged-rebuild gc --no-squeue       # on a host without Slurm: the grace period alone",
    ),
    "status": (
        "eb-staged-rebuild status fix-4711",
        "eb-staged-rebuild status --targets-file /apps/targets.ini --target all   # with the jobs' states",
        "eb-staged-rebuild --json status | jq -r '.runs[] | select(.state != \"published\") | .run_id'",
    ),
    "probe": (
        "eb-staged-rebuild probe --path /apps/software",
        "eb-staged-rebuild probe --path /scratch/apps --eb /opt/easybuild/bin/eb",
    ),
}


def build_parser():
    parser = _Parser(
        prog=PROG, description="Rebuild EasyBuild installs beside the live tree and swap them in atomically."
    )
    parser.add_argument(
        "--state-root", help=f"journals, locks and backups (default: ${settings.STATE_ROOT_VARIABLE})"
    )
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=0.0,
        help="seconds to wait for the state-root lock (default 0: refuse at once)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    # --json may also follow the command ("probe --path DIR --json"), as the README shows it.
    after = _Parser(add_help=False)
    after.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    # So may --state-root ("job-start RUN --state-root DIR", as a job's script runs it).
    after.add_argument("--state-root", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    build = commands.add_parser(
        "rebuild",
        **_help("rebuild", after),
        help="build a replacement beside the live install and swap it in",
    )
    _tree_arguments(build)
    build.add_argument("--module", action="append", default=[], metavar="NAME/VERSION", dest="modules")
    build.add_argument(
        "--eb", help=f"the EasyBuild command (default: ${settings.EB_VARIABLE}, else eb on PATH)"
    )
    settings.add_arguments(build, request_module.RebuildRequest)
    settings.add_arguments(build, submission.JobRequest)
    build.add_argument("--dry-run", action="store_true", help="with --job: the sbatch commands it would run")
    build.add_argument("eb_args", nargs=argparse.REMAINDER, help="-- then EasyBuild's arguments")
    build.set_defaults(func=cmd_rebuild, words=text.rebuild)

    again = commands.add_parser("resume", **_help("resume", after), help="finish or reverse interrupted runs")
    again.add_argument("run_id", nargs="?")
    _tree_arguments(again, _CHECKED)
    again.set_defaults(func=cmd_resume, words=text.resume)

    back = commands.add_parser(
        "rollback", **_help("rollback", after), help="put the previous tree (or a retired module file) back"
    )
    back.add_argument("run_id")
    _tree_arguments(back, _CHECKED)
    back.set_defaults(func=cmd_rollback, words=text.rollback)

    ret = commands.add_parser(
        "retire", **_help("retire", after), help="move a module file out of MODULEPATH's way"
    )
    ret.add_argument("module_file")
    ret.add_argument("--reason", required=True)
    ret.set_defaults(func=cmd_retire, words=text.retire)

    collect = commands.add_parser(
        "gc", **_help("gc", after), help="remove retired trees after the grace period"
    )
    collect.add_argument(
        "--grace-hours",
        type=float,
        help=f"hours a replaced tree is kept (default: ${settings.GRACE_HOURS_VARIABLE}, else 144)",
    )
    collect.add_argument("--dry-run", action="store_true")
    collect.add_argument(
        "--no-squeue",
        action="store_true",
        help="do not ask squeue which jobs run: keep every tree for the grace period",
    )
    _tree_arguments(collect, _CHECKED)
    collect.set_defaults(func=cmd_gc, words=text.collected)

    show = commands.add_parser("status", **_help("status", after), help="list runs, or show one")
    show.add_argument("run_id", nargs="?")
    _target_arguments(show)
    show.set_defaults(func=cmd_status, words=text.status)

    _job_commands(commands, after)

    look = commands.add_parser(
        "probe", **_help("probe", after), help="what the filesystem at --path and this host can do"
    )
    look.add_argument("--path", required=True)
    look.add_argument("--eb", help="the EasyBuild whose version is checked")
    look.set_defaults(func=cmd_probe, words=text.probed)
    return parser


def _job_commands(commands, after):
    """The commands of runs submitted as Slurm jobs: the job's own, and what follows staged runs."""
    start = commands.add_parser(
        "job-start",
        **_help("job-start", after),
        help="run a queued run in its Slurm job (what a --job's batch script runs)",
    )
    start.add_argument("run_id")
    start.add_argument("--targets-file", help="the site file the run's target is checked with")
    start.set_defaults(func=cmd_job_start, words=text.job_started)

    publish = commands.add_parser(
        "publish", **_help("publish", after), help="publish staged runs (--publish together), all or none"
    )
    publish.add_argument("run_id")
    _target_arguments(publish)
    publish.set_defaults(func=cmd_publish, words=text.published_staged)

    discard = commands.add_parser(
        "discard", **_help("discard", after), help="remove the staged builds of a run, publishing nothing"
    )
    discard.add_argument("run_id")
    _target_arguments(discard)
    discard.set_defaults(func=cmd_discard, words=text.discarded)


def _help(name, after):
    """A subcommand's parser settings: ``after`` (its own ``--json``), and its examples at the
    end, as ``eb --help`` and ``spack help`` end theirs."""
    return {
        "parents": [after],
        "epilog": "examples:\n" + "\n".join("  " + line for line in EXAMPLES[name]),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def _tree_arguments(parser, checked=""):
    parser.add_argument("--installpath", help=f"the live tree{checked} (default: $EASYBUILD_INSTALLPATH)")
    parser.add_argument("--installpath-software", help="the live software tree (with --installpath-modules)")
    parser.add_argument("--installpath-modules", help="the live module tree (with --installpath-software)")


def _target_arguments(parser):
    parser.add_argument(
        "--targets-file", help=f"the site file of CPU targets (default: ${targets.TARGETS_VARIABLE})"
    )
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME",
        help="the state root of this target of the site file (instead of --state-root); "
        "repeatable; all: every target",
    )


# resume, rollback and gc refuse a journal of other trees than these, when any is given.
_CHECKED = ", which the journals must name"


def _trees(args):
    return request_module.configured_trees(vars(args), os.environ)


def _request(args):
    eb_args = args.eb_args[1:] if args.eb_args[:1] == ["--"] else args.eb_args
    return request_module.resolve(vars(args), os.environ, eb_args)


def _state_root(args):
    return settings.state_root(vars(args), os.environ)


def _progress(args):
    def show(line):
        if not args.json or line.startswith(PROG + ":"):
            sys.stderr.write(printable(line) + "\n")
            sys.stderr.flush()

    return show


def cmd_rebuild(args, now):
    jobs = submission.resolve(vars(args), os.environ)
    if jobs.job:
        return _submit(args, jobs)
    return commands.run_rebuild(
        _request(args), _state_root(args), _progress(args), dict(os.environ), dry_run=args.dry_run
    )


def _submit(args, jobs):
    """``rebuild --job``: the runs queued and their jobs submitted; with ``--dry-run`` the
    sbatch commands that would be."""
    eb_args = args.eb_args[1:] if args.eb_args[:1] == ["--"] else args.eb_args
    if jobs.target and (args.state_root or any(getattr(args, name) for name in request_module.TREE_OPTIONS)):
        raise errors.UsageError(
            "--state-root and --installpath go without --target: the site file names each target's trees"
        )
    state_root = None if jobs.target else _state_root(args)
    prepared = submission.prepare(vars(args), os.environ, eb_args, jobs, state_root)
    planned = submission.plan_jobs(
        prepared.run_id,
        prepared.placements,
        jobs.job_options,
        submission.tool_command(os.environ, _running_command()),
        together=jobs.together,
        targets_file=jobs.targets_file if jobs.target else None,
        lock_timeout=settings.lock_timeout(vars(args)),
    )
    if args.dry_run:
        return {
            "changed": False,
            "dry_run": True,
            "would_change": True,
            "run_id": prepared.run_id,
            "jobs": [job.as_dict() for job in planned],
        }
    return submission.submit_rebuild(prepared, planned, dict(os.environ))


def _running_command():
    """How this process was started, as a job runs it again: ``python -m`` of this module,
    or the installed command; empty when neither (a test calling ``main``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.endswith("staged_rebuild.cli"):
        return [sys.executable, "-m", spec.name]
    program = sys.argv[0] if sys.argv else ""
    if os.path.basename(program) == PROG and os.access(program, os.X_OK):
        return [os.path.abspath(program)]
    return []


def _state_roots(args):
    """``(target, state root)`` of each ``--target`` of the site file, else of ``--state-root``."""
    if not args.target:
        return [(None, _state_root(args))]
    site_path = targets.site_file(args.targets_file, os.environ)
    if site_path is None:
        raise errors.UsageError(
            f"--target needs a site file: --targets-file FILE or ${targets.TARGETS_VARIABLE}"
        )
    if args.state_root:
        raise errors.UsageError("--state-root goes without --target: the site file names each target's")
    chosen = targets.select(targets.load(site_path), args.target)
    return [(target.name, target.state_root) for target in chosen]


def cmd_resume(args, now):
    return commands.resume_runs(
        _state_root(args),
        args.run_id,
        lock_timeout=settings.lock_timeout(vars(args)),
        progress=_progress(args),
        env=dict(os.environ),
        trees=_trees(args),
        job_alive=lambda job_id: slurmjob.job_alive(job_id, os.environ),
    )


def cmd_rollback(args, now):
    return commands.roll_back(
        _state_root(args), args.run_id, settings.lock_timeout(vars(args)), trees=_trees(args)
    )


def cmd_retire(args, now):
    return commands.retire_module(
        _state_root(args), args.module_file, args.reason, lock_timeout=settings.lock_timeout(vars(args))
    )


def cmd_gc(args, now):
    return commands.collect_garbage(
        _state_root(args),
        settings.grace_hours(vars(args), os.environ),
        settings.lock_timeout(vars(args)),
        dry_run=args.dry_run,
        trees=_trees(args),
        squeue_environ=None if args.no_squeue else os.environ,
        now=now,
    )


def cmd_status(args, now):
    if not args.target:
        return submission.with_job_states(commands.show_status(_state_root(args), args.run_id), os.environ)
    roots = _state_roots(args)
    return {
        "targets": [
            {
                "target": name,
                "state_root": state_root,
                **submission.with_job_states(commands.show_status(state_root, args.run_id), os.environ),
            }
            for name, state_root in roots
        ]
    }


def cmd_job_start(args, now):
    state_root = _state_root(args)
    env = dict(os.environ)
    return commands.start_job(
        state_root,
        args.run_id,
        _progress(args),
        env,
        node=slurmjob.this_node(env),
        job_id=env.get("SLURM_JOB_ID"),
        check_node=submission.node_check(targets.site_file(args.targets_file, {}), state_root, env),
    )


def _runs_of(args):
    return [(state_root, args.run_id) for _name, state_root in _state_roots(args)]


def cmd_publish(args, now):
    runs = _runs_of(args)
    return commands.publish_runs(runs, settings.lock_timeout(vars(args)), _progress(args))


def cmd_discard(args, now):
    runs = _runs_of(args)
    return commands.discard_runs(runs, settings.lock_timeout(vars(args)))


def cmd_probe(args, now):
    return probe.probe(args.path, settings.eb(vars(args), os.environ))


def _text(args, result, now):
    """The result as text for people (``text``), and its warnings as stderr lines."""
    command = (PROG, "--state-root", args.state_root) if args.state_root else (PROG,)
    context = text.Context(
        # probe needs none: a command that reads journals was given one, or refused before.
        state_root=os.path.abspath(args.state_root or os.environ.get(settings.STATE_ROOT_VARIABLE, "")),
        now=now,
        command=command,
        style=text.Style.for_stream(sys.stdout, os.environ),
    )
    for warning in result.get("warnings") or ():
        sys.stderr.write(f"{PROG}: warning: {printable(warning)}\n")
    try:
        return args.words(result, context)
    except commands.FAILURES as err:
        # The command is done: its result is shown whole rather than lost with the wording.
        said = printable(commands.failure_message(err))
        sys.stderr.write(f"{PROG}: warning: the result is shown as JSON ({said})\n")
        return _json(result)


def _json(result):
    """The result as one JSON document: ASCII, with what is not Unicode escaped (and named)."""
    return json.dumps(unicode_result(result), sort_keys=True) + "\n"


def _write(stream, words):
    """``words`` on ``stream``, whatever its encoding: a character it cannot encode (a name in
    UTF-8 under a Latin-1 locale) is shown as a Python escape instead of failing the write
    after the work is done. Every value was made printable before; this is the last guard."""
    try:
        stream.write(words)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(words.encode(encoding, "backslashreplace").decode(encoding))


def _exit_code(result):
    warned = result.get("warnings") or result.get("interrupted") or result.get("incomplete")
    return errors.EXIT_WARNINGS if warned else errors.EXIT_OK


def main(argv=None, now=None):
    """Run the command; return the exit status (0 ok, 1 warnings, 2 error).

    ``now`` is the moment the command runs (gc's grace period and the times the text shows
    are counted from it); by default the clock's."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        args = build_parser().parse_args(argv)
    except errors.UsageError as err:
        sys.stderr.write(f"{PROG}: {printable(str(err))}\n")
        return err.exit_code
    try:
        with commands.sigterm_raises():
            result = args.func(args, now)
    except errors.HpcstackError as err:
        if args.debug:
            raise
        message = commands.failure_message(err)
        sys.stderr.write(f"{PROG}: {printable(message)}\n")
        if args.json and err.details:
            # A build that ran and failed: what EasyBuild said, as fields (the modules' too).
            failure = {**commands.failure_details(err), "failed": True, "msg": message}
            _write(sys.stdout, _json(dict(failure, error=commands.failure_kind(err))))
        return err.exit_code
    except OSError as err:
        if args.debug:
            raise
        sys.stderr.write(f"{PROG}: {printable(commands.failure_message(err))}\n")
        return errors.EXIT_ERROR
    _write(sys.stdout, _json(result) if args.json else _text(args, result, now))
    return _exit_code(result)


if __name__ == "__main__":
    raise SystemExit(main())
