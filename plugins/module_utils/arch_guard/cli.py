# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``eessi-arch-guard``: Slurm's TaskProlog (no arguments) or ``--shell`` for a job script.

It never exits non-zero: since Slurm 22.05 a failing TaskProlog kills the task. Whatever
goes wrong becomes one ``eessi-arch-guard: skipped, ...`` line and exit 0.
"""

from __future__ import annotations

import sys

from . import lean_os

PROG = "eessi-arch-guard"


class _UsageProblem(Exception):
    """Bad arguments: reported as a skip, since a usage error must not kill the task."""


class Options:
    """What the command line asks for."""

    __slots__ = ("json", "shell_code")

    def __init__(self, shell_code: bool = False, json: bool = False) -> None:
        self.shell_code = shell_code
        self.json = json


def build_parser():
    import argparse  # noqa: PLC0415 (slow to import; the common command lines do without it)

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise _UsageProblem(message)

    parser = Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Give a Slurm task the EESSI environment of the node it runs on. Without "
        "arguments it writes TaskProlog directives; with --shell, code for eval.",
    )
    parser.add_argument("--shell", action="store_true", help='print shell code: eval "$(%(prog)s --shell)"')
    parser.add_argument(
        "--json", action="store_true", help="print the decision as JSON instead of applying it"
    )
    # main() answers --version itself, on the stream of the mode; listed here for --help.
    parser.add_argument("--version", action="store_true", help="print the name and version, then exit")
    return parser


def parse_args(args) -> Options:
    """The options; Slurm's and a job script's command lines are read without argparse."""
    if not args:
        return Options()
    if args == ["--shell"]:
        return Options(shell_code=True)
    parsed = build_parser().parse_args(args)
    return Options(shell_code=parsed.shell, json=parsed.json)


def main(argv=None, environ=None, stdout=None, stderr=None) -> int:
    """Run the guard; always 0. ``environ``/``stdout``/``stderr`` default to the process's own."""
    args = sys.argv[1:] if argv is None else list(argv)
    # Known before parsing, so that bad arguments are reported on the stream of the mode
    # the caller asked for: in shell mode stdout is code that the job's shell runs.
    shell_mode = any(arg == "--shell" or arg.startswith("--shell=") for arg in args)
    env = lean_os.environ() if environ is None else environ
    out = stdout if stdout is not None else getattr(sys.stdout, "buffer", None)
    err = stderr if stderr is not None else getattr(sys.stderr, "buffer", None)
    try:
        if "-h" in args or "--help" in args:
            # argparse would print to sys.stdout itself, which eval runs in shell mode.
            _write(err if shell_mode else out, build_parser().format_help().encode())
            return 0
        if "--version" in args:
            from ..common.version import VERSION  # noqa: PLC0415 (only --version needs it)

            # Plain text even with --json, as eb-staged-rebuild's --version is.
            _write(err if shell_mode else out, f"{PROG} {VERSION}\n".encode())
            return 0
        _run(parse_args(args), env, out, err)
    except Exception as problem:  # the guard must not fail the task, whatever broke
        if shell_mode:
            _write(err, _skip_line(problem) + b"\n")
        elif _is_first_task(env):
            _write(out, b"print " + _skip_line(problem) + b"\n")
    return 0


def _is_first_task(env) -> bool:
    """Local task 0 (or no Slurm): the one that prints for the node. True when unknown."""
    try:
        return env.get("SLURM_LOCALID") in (None, "0")
    except Exception:  # the environment itself may be what failed
        return True


def _run(options: Options, env, out, err) -> None:
    # Imported here, not at the top: a failure to import becomes a skip line, not a traceback.
    from ..common.deadline import SigtermScope  # noqa: PLC0415

    with SigtermScope():
        _decide_and_write(options, env, out, err)


def _decide_and_write(options: Options, env, out, err) -> None:
    from . import emit, settings  # noqa: PLC0415

    mode = emit.SHELL if options.shell_code else emit.PROLOG
    decision = settings.early_skip(env)
    if decision is None:
        from . import step  # noqa: PLC0415

        decision = step.decision_for(env, mode)
    if env.get("EESSI_ARCH_GUARD_VERBOSE") == "1":
        _write(err, lean_os.fsencode(f"{PROG}: {emit.shown(decision.detail)}\n"))
    if options.json:
        import json  # noqa: PLC0415 (only --json needs it)

        from ..common.printable import unicode_result  # noqa: PLC0415

        shown = unicode_result(dict(decision.as_dict(), mode=mode))
        _write(out, json.dumps(shown, indent=2).encode() + b"\n")
    elif options.shell_code:
        code, message = emit.shell_output(decision)
        _write(out, code)
        _write(err, message)
    else:
        _write(out, emit.prolog_output(decision, env.get("SLURM_LOCALID")))


def _skip_line(problem: Exception) -> bytes:
    text = str(problem) if isinstance(problem, _UsageProblem) else f"{type(problem).__name__}: {problem}"
    what = _shown(" ".join(text.split()))
    return lean_os.fsencode(f"{PROG}: skipped, {what[:1000]}")


def _shown(text: str) -> str:
    """``text`` escaped as every line for people is (``emit.shown``); when even that cannot
    be imported (a broken install, which is what this line reports), each character a
    terminal could act on becomes ``?``."""
    try:
        from .emit import shown  # noqa: PLC0415
    except Exception:  # the guard must not fail the task, whatever broke
        return "".join(char if char.isprintable() else "?" for char in text)
    return shown(text)


def _write(stream, data: bytes) -> None:
    """Write and flush; a failed write is dropped (the reader is gone or the disk is full)."""
    if not data or stream is None:
        return
    try:
        stream.write(data)
        stream.flush()
    except (OSError, ValueError):
        _silence(stream)


def _silence(stream) -> None:
    # Python flushes sys.stdout again at exit and turns a second EPIPE into exit status
    # 120; pointing the descriptor at /dev/null makes that flush succeed.
    import os  # noqa: PLC0415 (a broken pipe is rare; every task's path does without os)

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
