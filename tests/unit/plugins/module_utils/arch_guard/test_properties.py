"""Properties of the guard's output over random task environments, helper reports and nodes.

The environment a task should end with is computed here from the reference, not with
envdelta: the task's environment, with every change the reload made (before -> after)
except the omitted names, the prompt settings whose new value cannot be carried left as
they were, EESSI_ARCH_GUARD_RELOADED=<was>-><now> set and EESSI_ARCH_GUARD_FAILED gone.
When a change the task needs cannot be carried, the task must instead keep its environment
and get only EESSI_ARCH_GUARD_FAILED=<was>->unsafe-environment. Slurm's side is
tests/support/slurm_taskprolog.py (the 4094-byte reads of old slurmd); the shell side is a real bash.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import cli, decide, emit, restore
from tests.support import slurm_taskprolog
from tests.support.guard_reference import OMITTED_NAMES, OMITTED_PREFIXES, PROMPTS, bash_env_after_eval

LINE_MAX = 4094
FAILED = "EESSI_ARCH_GUARD_FAILED"
RELOADED = "EESSI_ARCH_GUARD_RELOADED"
SUBDIR = "EESSI_SOFTWARE_SUBDIR"
ACCEL = "EESSI_ACCEL_SUBDIR"

VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)
# A non-interactive bash drops these from its environment at start-up (not the guard's doing).
BASH_DROPS = frozenset(("PS1", "PS2"))

TARGETS = ("x86_64/amd/zen3", "x86_64/intel/icelake", "x86_64/intel/haswell", "aarch64/neoverse_v1")
ACCELS = ("accel/nvidia/cc80", "accel/amd/gfx90a", "")

PROPERTY = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BASH_PROPERTY = settings(PROPERTY, max_examples=80)


def omitted(name: str) -> bool:
    return name in OMITTED_NAMES or name.startswith(OMITTED_PREFIXES)


def fits(line: bytes) -> bool:
    return len(line) <= LINE_MAX


def carriable(name: str, value, mode: str) -> bool:
    """Whether the reference lets ``(name, value)`` through in ``mode`` (value None: unset)."""
    if not VALID_NAME.match(name):
        return False
    if mode == emit.SHELL:
        return True
    if value is None:
        return fits(b"unset " + os.fsencode(name) + b"\n")
    if any(char in value for char in "\r\n\0"):
        return False
    return fits(b"export " + os.fsencode(name) + b"=" + os.fsencode(value) + b"\n")


def expected_env(scenario, mode):
    """``(environment, True)`` for a restore, ``(environment, False)`` for the failure."""
    task, before, after, was, now = scenario
    env = dict(task)
    for name in set(before) | set(after):
        new = after.get(name)
        if omitted(name) or before.get(name) == new or task.get(name) == new:
            continue
        if not carriable(name, new, mode):
            if name in PROMPTS:
                continue
            return dict(task, **{FAILED: f"{was.label(now)}->unsafe-environment"}), False
        if new is None:
            env.pop(name, None)
        else:
            env[name] = new
    env[RELOADED] = f"{was.label(now)}->{now.label(was)}"
    env.pop(FAILED, None)
    return env, True


def as_bytes(env) -> dict:
    return {os.fsencode(name): os.fsencode(value) for name, value in env.items()}


def shell_names(code: bytes) -> list:
    """The names the shell code exports or unsets, read as a POSIX shell tokenizes it."""
    words = shlex.split(os.fsdecode(code))
    names = []
    for verb, operand in zip(words[::2], words[1::2]):
        assert verb in ("export", "unset")
        names.append(operand.split("=", 1)[0] if verb == "export" else operand)
    assert len(words) % 2 == 0
    return names


def prolog_names(output: bytes) -> list:
    names = []
    for line in slurm_taskprolog.read_lines(output, None):
        for verb in (b"export ", b"unset "):
            if line.startswith(verb):
                names.append(os.fsdecode(line[len(verb) :].rstrip(b"\n").split(b"=", 1)[0]))
    return names


# --- strategies -------------------------------------------------------------------------

_ODD_CHARS = ["\n", "\r", "\t", "\x0b", "\x1b", "\x7f", "'", '"', "$", "\\", "`", " ", "=", "é", "€", "😀"]
_VALUE_CHARS = st.sampled_from([*_ODD_CHARS, "a", "/", ":", "\0"])
_INVALID_NAMES = ["a-b", "1x", "x.y", "a b", " lead", "é", os.fsdecode(b"n\xff"), "tab\tx", "nl\nx", "cr\rx"]
_REAL_NAMES = [
    "PATH",
    "MODULEPATH",
    "LOADEDMODULES",
    "_LMFILES_",
    "_ModuleTable001_",
    "EESSI_CPU_FAMILY",
    "EESSI_SOFTWARE_PATH",
    "LMOD_RC",
    "HOME",
    "X",
    *sorted(PROMPTS),
]
_OMITTED_SAMPLES = [*sorted(OMITTED_NAMES), "SLURM_JOB_ID", "SLURM_LOCALID", "SLURM_", "BASH_FUNC_module%%"]

_NAME_KINDS = (
    [st.from_regex(r"\A[a-z_][a-z0-9_]{0,10}\Z")] * 10
    + [st.sampled_from(_REAL_NAMES)] * 6
    + [st.sampled_from(_OMITTED_SAMPLES)] * 3
    + [
        st.sampled_from(_INVALID_NAMES),
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="=\0"), min_size=1, max_size=5),
        # Long enough that "unset NAME\n" crosses the 4094-byte line either way.
        st.integers(4084, 4092).map(lambda length: "L" * length),
    ]
)
# Mostly plain names, so that most scenarios can be restored; now and then one the
# reference refuses.
variable_names = (
    st.sampled_from(_NAME_KINDS)
    .flatmap(lambda kind: kind)
    .filter(lambda name: name not in (FAILED, RELOADED, SUBDIR, ACCEL))
)


def near_limit(name: str):
    """Values whose export line is a few bytes either side of 4094, in 1-, 2- or 3-byte characters."""

    def fill(args):
        length, char = args
        room = max(0, length - len(b"export " + os.fsencode(name) + b"=\n"))
        width = len(char.encode())
        return char * (room // width) + "v" * (room % width)

    return st.tuples(st.integers(LINE_MAX - 4, LINE_MAX + 4), st.sampled_from("vé€")).map(fill)


def values_for(name: str, nul: bool):
    plain = st.one_of(
        st.text(_VALUE_CHARS, min_size=1, max_size=12),
        st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
        st.binary(max_size=10).map(os.fsdecode),
        near_limit(name),
    )
    return plain if nul else plain.map(lambda value: value.replace("\0", ""))


@st.composite
def variables(draw, nul=False, max_size=6):
    chosen = draw(st.lists(variable_names, max_size=max_size, unique=True))
    return {name: draw(values_for(name, nul)) for name in chosen}


label_texts = st.one_of(
    st.sampled_from(TARGETS),
    st.text(st.one_of(_VALUE_CHARS, st.characters(exclude_categories=["Cs"])), max_size=12).map(
        lambda text: text.replace("\0", "")
    ),
    st.just("x86_64/" + "z" * 250),
)
nodes = st.builds(decide.Node, label_texts, st.one_of(st.none(), st.sampled_from(ACCELS), label_texts))


@st.composite
def scenarios(draw, nul):
    """``(task, before, after, was, now)``: a task and what the restore helper reported for it."""
    was, now = draw(nodes), draw(nodes)
    assume(was != now)
    task = draw(variables(nul=False))
    task[SUBDIR] = was.cpu
    if was.accel:
        task[ACCEL] = was.accel
    for marker in (FAILED, RELOADED):
        if draw(st.booleans()):
            task[marker] = draw(values_for(marker, nul=False))
    # The helper's shell starts from the task's environment and changes some of it.
    before = {name: value for name, value in task.items() if draw(st.integers(0, 9)) != 0}
    before.update(draw(variables(nul=False, max_size=3)))
    before[SUBDIR] = was.cpu
    after = {
        name: value
        for name, value in before.items()
        if name in (SUBDIR, FAILED, RELOADED) or draw(st.integers(0, 4)) != 0
    }
    for name in [name for name in after if name not in (SUBDIR, FAILED, RELOADED)]:
        if draw(st.integers(0, 3)) == 0:
            after[name] = draw(values_for(name, nul))
    after.update(draw(variables(nul=nul)))
    after[SUBDIR] = now.cpu
    after[ACCEL] = now.accel or ""
    return task, before, after, was, now


# A name the reload removed whose "unset NAME\n" line is 4097 bytes: always tried.
LONG_UNSET = (
    {"L" * 4090: "1", SUBDIR: "x86_64/amd/zen3"},
    {"L" * 4090: "1", SUBDIR: "x86_64/amd/zen3"},
    {SUBDIR: "x86_64/intel/icelake"},
    decide.Node("x86_64/amd/zen3", None),
    decide.Node("x86_64/intel/icelake", None),
)


# What the shell form exists for: newlines, quotes and bytes that are not UTF-8.
AWKWARD_VALUES = (
    {"PS1": "$ ", "MODULEPATH": "/old", "GONE": "x", SUBDIR: "x86_64/amd/zen3"},
    {"PS1": "$ ", "MODULEPATH": "/old", "GONE": "x", SUBDIR: "x86_64/amd/zen3"},
    {
        "PS1": "two\nlines $ ",
        "MODULEPATH": "/new 'single' \"double\" $HOME `date` \\ end\n",
        "NEW": os.fsdecode(b"\xff\xfe\x01\r\nline"),
        SUBDIR: "x86_64/intel/icelake",
    },
    decide.Node("x86_64/amd/zen3", None),
    decide.Node("x86_64/intel/icelake", "accel/nvidia/cc80"),
)


def decided(scenario, mode):
    task, before, after, was, now = scenario
    return decide.from_report(task, mode, restore.Report(before, after), was=was, now=now)


# --- properties ---------------------------------------------------------------------------


@PROPERTY
@given(scenarios(nul=True), st.sampled_from([None, "0", "1", "", "10"]))
@example(LONG_UNSET, "0")
def test_slurm_applies_exactly_the_restored_environment_or_only_the_failure(scenario, local_id):
    task = scenario[0]
    result = decided(scenario, emit.PROLOG)
    applied = slurm_taskprolog.parse(emit.prolog_output(result, local_id), as_bytes(task))

    expected, restored = expected_env(scenario, emit.PROLOG)
    assert applied.env == as_bytes(expected)
    assert result.action == ("reload" if restored else "fail")
    if local_id in (None, "0"):
        assert len(applied.printed) == 1
        assert os.fsencode(result.message).startswith(applied.printed[0])
        applied.printed[0].decode()
    else:
        assert applied.printed == []


@PROPERTY
@given(scenarios(nul=True), st.sampled_from([emit.PROLOG, emit.SHELL]))
@example(AWKWARD_VALUES, emit.SHELL)
def test_no_omitted_name_is_ever_emitted(scenario, mode):
    result = decided(scenario, mode)
    assert not [name for name, _value in result.changes if omitted(name)]
    if mode == emit.PROLOG:
        emitted = prolog_names(emit.prolog_output(result, "0"))
    else:
        emitted = shell_names(emit.shell_output(result)[0])
    assert emitted == [name for name, _value in result.changes]
    assert not [name for name in emitted if omitted(name)]


@PROPERTY
@given(scenarios(nul=True), st.sampled_from([None, "0", "1"]))
@example(LONG_UNSET, "0")
def test_every_prolog_line_fits_an_old_slurmd_read(scenario, local_id):
    output = emit.prolog_output(decided(scenario, emit.PROLOG), local_id)
    lines = slurm_taskprolog.read_lines(output, None)
    assert b"".join(lines) == output
    assert all(line.endswith(b"\n") for line in lines)
    assert [len(line) for line in lines if not fits(line)] == []


@BASH_PROPERTY
@given(scenarios(nul=False))
@example(AWKWARD_VALUES)
def test_bash_evaluating_the_shell_form_reproduces_the_environment(scenario):
    task, before, after, was, now = scenario
    stdout, _message = emit.shell_output(decided(scenario, emit.SHELL))
    # Omitted names include what bash itself reads at start-up (BASH_ENV, SHELLOPTS, ...):
    # the guard never emits them, so they stay out of the shell and out of the comparison.
    start = {name: value for name, value in task.items() if not omitted(name)}
    result = bash_env_after_eval(stdout, as_bytes(start))

    expected, _restored = expected_env((start, before, after, was, now), emit.SHELL)
    controlled = {name for name in {*task, *before, *after, FAILED, RELOADED} if not omitted(name)}
    for name in controlled:
        if name in BASH_DROPS and expected.get(name) == start.get(name):
            continue
        want = expected.get(name)
        assert result.get(os.fsencode(name)) == (None if want is None else os.fsencode(want)), name


# --- the command --------------------------------------------------------------------------

_ARG_TOKENS = st.one_of(
    st.sampled_from(
        ["--shell", "--json", "--bogus", "-x", "extra", "--", "--shell=1", "-", "", "--sh", "--js"]
    ),
    # -h/--help make argparse print help and exit, which is a request, not bad arguments.
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=8).filter(
        lambda arg: not arg.startswith(("-h", "--h"))
    ),
)
_GUARD_VARIABLES = st.fixed_dictionaries(
    {},
    optional={
        SUBDIR: st.one_of(st.sampled_from(TARGETS), label_texts, st.just("")),
        ACCEL: st.one_of(st.sampled_from(ACCELS), label_texts),
        "EESSI_ARCH_GUARD": st.sampled_from(["0", "off", "1", "yes", " NO ", ""]),
        "EESSI_ARCH_GUARD_VERBOSE": st.sampled_from(["1", "0", ""]),
        "EESSI_ARCH_GUARD_TIMEOUT": st.sampled_from(["5", "0", "-1", "nan", "x", "1e400"]),
        "SLURM_LOCALID": st.sampled_from(["0", "1", "", "x"]),
        "SLURM_JOB_ID": st.sampled_from(["1", "12345", "../x"]),
    },
)
_SKIP = re.compile(rb"eessi-arch-guard: skipped, [^\n\r\0]*\n\Z")
_PROLOG_LINE = re.compile(
    rb"(export [A-Za-z_][A-Za-z0-9_]*=[^\n\r\0]*|unset [A-Za-z_][A-Za-z0-9_]*|print [^\n\r\0]*)\n\Z"
)
_MESSAGE = re.compile(rb"eessi-arch-guard: [^\n\r\0]*\n\Z")


def _assert_lines(stream: bytes, shape) -> None:
    for line in slurm_taskprolog.read_lines(stream, None):
        assert fits(line), line[:80]
        assert shape.match(line), line


def _assert_shell_code(code: bytes) -> None:
    """Nothing, or the one export of the failure marker (archdetect cannot run here)."""
    words = shlex.split(os.fsdecode(code))
    if words:
        verb, assignment = words
        name, _sep, value = assignment.partition("=")
        assert (verb, name) == ("export", FAILED)
        assert value.endswith("->archdetect-failed")


def _parsed(argv):
    """The guard's own parser's reading of ``argv``, or None when it refuses them."""
    try:
        return cli.build_parser().parse_args(argv)
    except Exception:  # only the parser's refusal raises here
        return None


def _asks_for_shell(argv) -> bool:
    """Whether the caller wrote ``--shell`` (with or without a value), whatever else is wrong."""
    return any(arg == "--shell" or arg.startswith("--shell=") for arg in argv)


@PROPERTY
@given(variables(), _GUARD_VARIABLES, st.lists(_ARG_TOKENS, max_size=3))
@example({}, {SUBDIR: "x86_64/amd/zen3"}, ["--shell", "--bogus"])
def test_the_command_returns_0_and_writes_only_lines_of_the_allowed_shapes(task, guard, argv):
    # EESSI_PREFIX points nowhere: archdetect cannot be found, so nothing is run.
    environ = dict(task, **guard, EESSI_PREFIX="/nonexistent/eessi-prefix")
    environ.pop("EESSI_INIT_PREFIX", None)
    stdout, stderr = io.BytesIO(), io.BytesIO()

    assert cli.main(argv, environ=environ, stdout=stdout, stderr=stderr) == 0

    out, err = stdout.getvalue(), stderr.getvalue()
    options = _parsed(argv)
    if options is None and _asks_for_shell(argv):
        assert out == b""
        assert _SKIP.match(err)
    elif options is None:
        assert err == b""
        # The reference prints for local task 0 only, and also makes any failure one print
        # line: for the other local tasks either reading is accepted.
        if out or environ.get("SLURM_LOCALID") in (None, "0"):
            assert out.startswith(b"print ")
            assert _SKIP.match(out[len(b"print ") :])
    else:
        _assert_lines(err, _MESSAGE)
        if options.json:
            assert json.loads(out)["action"] in ("skip", "fail")
        elif options.shell:
            _assert_shell_code(out)
        else:
            _assert_lines(out, _PROLOG_LINE)
            prints = [line for line in out.splitlines() if line.startswith(b"print ")]
            assert len(prints) == (1 if out and environ.get("SLURM_LOCALID") in (None, "0") else 0)
