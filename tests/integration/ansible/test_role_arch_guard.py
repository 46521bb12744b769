"""The arch_guard role on this machine, without Slurm: its refusals, check mode, an install
beside a slurm.conf it does not own, what the installed launcher does, upgrades and removal.

Each refusal is one failed task whose message says what is wrong and what to set, and it
comes before the role writes anything: the prefix and the state directory are not created
and slurm.conf is byte for byte what it was. The refusal cases share one ansible-playbook
run, one play each on a node of its own (see "the refusals" below). The role runs
``scontrol reconfigure`` only when it changed slurm.conf, so these tests either leave
slurm.conf to the site (``arch_guard_manage_slurm_conf: false``) or are refused before the
handler. (A fresh
install that owns slurm.conf, chaining the TaskProlog it names and removal on a real Slurm
are the molecule scenarios': test_molecule_arch_guard.py.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

import checkout
import pythons
from ansible_collections.hpcstack.ops.plugins.lookup.tree_digest import digest_files, list_tree
from localplay import LocalPlaybooks
from tests.integration.harness import refusal_batch

ROLE = "hpcstack.ops.arch_guard"
# The play runs the role, then shows the facts it set, for the test to read.
PLAYBOOK = """\
- name: Roll the guard out
  hosts: localhost
  gather_facts: false
  roles:
    - role: hpcstack.ops.arch_guard
  post_tasks:
    - name: Show the facts the role set
      ansible.builtin.debug:
        msg:
          arch_guard_task_prolog: "{{ arch_guard_task_prolog | default(None) }}"
          arch_guard_launcher: "{{ arch_guard_launcher | default(None) }}"
          arch_guard_python_interpreter: "{{ arch_guard_python_interpreter | default(None) }}"
"""
FACTS = re.compile(r"^TASK \[Show the facts the role set\].*?^ok: \[localhost\] => (\{.*?^\})$", re.M | re.S)
SLURM_CONF = """\
# slurm.conf of a test, which no Slurm reads
ClusterName=test
SlurmctldHost=localhost
SlurmdPort=6818
"""
CODE_DIRS = ("plugins/module_utils/common", "plugins/module_utils/arch_guard")
RUN_TIMEOUT = 120


class Host:
    """A node: the guard's prefix, the state directory and a slurm.conf, under ``root``.

    ``root`` is root's and 0755 under /tmp (sticky), so the prefix passes the role's check of
    the directories on its way, as /opt would.
    """

    def __init__(self, root: Path, collection: Path = checkout.REPO) -> None:
        self.root = root
        self.prefix = root / "opt" / "arch-guard"
        self.state_dir = root / "state"
        self.slurm_conf = root / "slurm" / "slurm.conf"
        self.slurm_conf.parent.mkdir()
        self.slurm_conf.write_text(SLURM_CONF)
        self.playbook = root / "play.yml"
        self.playbook.write_text(PLAYBOOK)
        self.collection = collection
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
        self.playbooks = LocalPlaybooks(root / "ansible", env, collection)

    def variables(self, **overrides) -> dict:
        variables = {
            "arch_guard_prefix": str(self.prefix),
            "arch_guard_state_dir": str(self.state_dir),
            "arch_guard_slurm_conf": str(self.slurm_conf),
            "arch_guard_manage_slurm_conf": False,
        }
        variables.update(overrides)
        return variables

    def run(self, *extra, **overrides):
        # JSON, so that booleans, numbers and lists keep their types.
        return self.playbooks.run(str(self.playbook), "-e", json.dumps(self.variables(**overrides)), *extra)

    def written(self) -> list:
        """What the role made: the prefix (and the directory it would create it in), the state
        directory."""
        candidates = [self.prefix.parent, self.prefix, self.state_dir]
        return [str(path) for path in candidates if os.path.lexists(path)]

    @property
    def launcher(self) -> Path:
        return self.prefix / "bin" / "eessi-arch-guard"

    @property
    def wrapper(self) -> Path:
        return self.prefix / "bin" / "task-prolog"

    def release(self) -> dict:
        return json.loads((self.prefix / "release.json").read_text())

    def builds(self) -> list:
        lib = self.prefix / "lib"
        return sorted(path.name for path in lib.iterdir() if path.is_dir() and not path.is_symlink())

    def current_build(self) -> str:
        return os.readlink(self.prefix / "lib" / "current")


def _scratch_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="hpcstack-arch-guard-", dir="/tmp"))
    root.chmod(0o755)
    return root


@pytest.fixture
def root():
    path = _scratch_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host(root):
    return Host(root)


@pytest.fixture(scope="module")
def old_pythons():
    """A Python 3.7 and a 3.6 (pyenv's, as tools/pythons.py finds them) and their versions."""
    found = {}
    for version in ("3.7", "3.6"):
        path = pythons.find(version)
        assert path, f"no Python {version} here (pyenv) to show the refusal of an old interpreter with"
        done = subprocess.run(
            [path, "-IS", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            check=True,
        )
        found[path] = done.stdout.strip()
    return found


def _failed_task(output: str, host: str = "localhost") -> str:
    """The name of the one task that failed on ``host`` in ``output`` (a play's, or a run's)."""
    sections = re.split(r"^TASK \[", output, flags=re.M)[1:]
    # "fatal:" for a task, "failed:" for an item of a loop.
    failed = [
        section.split("\n", 1)[0].rsplit("] *", 1)[0]
        for section in sections
        if re.search(rf"^(fatal|failed): \[{re.escape(host)}\]", section, re.M)
    ]
    assert len(failed) == 1, output
    return failed[0]


def _refused(play, task, message):
    assert play.done.returncode == 2, play.output
    assert play.failed == 1, play.output
    assert _failed_task(play.stdout) == f"{ROLE} : {task}", play.stdout
    assert message in play.stdout, play.stdout


def _assert_nothing_written(host, slurm_conf=SLURM_CONF):
    assert host.written() == []
    assert host.slurm_conf.read_text() == slurm_conf


def _succeeded(play):
    assert (play.done.returncode, play.failed) == (0, 0), play.output


def _facts(play) -> dict:
    found = FACTS.search(play.stdout)
    assert found, play.stdout
    return json.loads(found.group(1))["msg"]


def _task_changed(play, task):
    """Whether the role's task named ``task`` reported a change in ``play``."""
    section = play.stdout.split(f"TASK [{ROLE} : {task}]", 1)
    assert len(section) == 2, f"task {task!r} did not run:\n{play.stdout}"
    # After the task's diff, when there is one.
    return re.search(r"^changed: \[localhost\]", section[1].split("\nTASK [", 1)[0], re.M) is not None


def _run(argv, env, **kwargs):
    return subprocess.run(
        [str(arg) for arg in argv],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        **kwargs,
    )


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------ the refusals
#
# Every refusal case below arranges a node of its own (a Host under one scratch directory) and
# names the variables the role gets there. One ansible-playbook run holds them all: one play
# per case, each on an inventory host of its own (this machine, under the case's name, so that
# no case sees the facts another set), the role in a block whose rescue lets the next play
# run. Each test reads its case's play: the one task that failed, its message, and what the
# node holds after it. (The exit status of a refused run, 2, is the removal tests'.)

REFUSAL_PLAY = """\
- name: {name}
  hosts: {alias}
  gather_facts: false
  vars: {variables}
""" + refusal_batch.RESCUED_ROLE.format(role="hpcstack.ops.arch_guard")
BATCH = refusal_batch.Batch("arch_guard_refusals")
REFUSAL = BATCH.mark
_case = BATCH.case  # register ``arrange(host, old_pythons) -> variables`` as a refusal case


@pytest.fixture(scope="module")
def refusals(old_pythons):
    scratch = _scratch_root()
    hosts, plays = {}, []
    aliases = BATCH.aliases()
    try:
        for name, arrange in BATCH.arrange.items():
            case_root = scratch / aliases[name]
            case_root.mkdir(mode=0o755)
            host = hosts[name] = Host(case_root)
            variables = host.variables(**arrange(host, old_pythons))
            plays.append(
                REFUSAL_PLAY.format(
                    name=json.dumps(f"refusal: {name}"), alias=aliases[name], variables=json.dumps(variables)
                )
            )
        inventory = {alias: {"ansible_connection": "local"} for alias in aliases.values()}
        play = refusal_batch.run(scratch, "".join(plays), inventory)
        yield refusal_batch.Refusals(play, hosts, aliases)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _refused_in(refusals, name, task, message):
    """Case ``name`` was refused by the one task ``task``, whose output says ``message``; its
    node and its play's output."""
    section = refusals.section(name)
    alias = refusals.aliases[name]
    assert _failed_task(section, alias) == f"{ROLE} : {task}", section
    assert message in section, section
    # The rescue ran: the role stopped at the refusal.
    assert "TASK [The role refused]" in section, section
    return refusals.hosts[name], section


@REFUSAL
def test_every_refusal_case_ran_in_one_play_of_its_own_and_was_refused(refusals):
    refusal_batch.assert_every_case_refused(refusals)


# the interpreter


def _no_python_3_8(host, old_pythons):
    host.slurm_conf.write_text(SLURM_CONF + f"TaskProlog={host.root}/site/prolog.sh\n")
    return {
        "arch_guard_python_candidates": list(old_pythons),
        "arch_guard_python_package": "",
        "arch_guard_manage_slurm_conf": True,
    }


_case("no Python 3.8 among the candidates", _no_python_3_8)
_case("a Python 3.7 as arch_guard_python", lambda host, old: {"arch_guard_python": next(iter(old))})
_case("a missing arch_guard_python", lambda host, old: {"arch_guard_python": str(host.root / "no-python")})


@REFUSAL
def test_no_python_3_8_among_the_candidates_is_refused(refusals, old_pythons):
    name = "no Python 3.8 among the candidates"
    host, section = _refused_in(
        refusals,
        name,
        "Refuse a node without Python 3.8 or newer",
        f"no Python 3.8 or newer on {refusals.aliases[name]}",
    )

    for path, version in old_pythons.items():
        assert f"{path}: {version}" in section
    assert "set arch_guard_python to one, or arch_guard_python_package to a package" in section
    _assert_nothing_written(host, SLURM_CONF + f"TaskProlog={host.root}/site/prolog.sh\n")


@REFUSAL
def test_a_python_3_7_given_as_arch_guard_python_is_refused(refusals, old_pythons):
    old, version = next(iter(old_pythons.items()))

    host, section = _refused_in(
        refusals,
        "a Python 3.7 as arch_guard_python",
        "Refuse a node without Python 3.8 or newer",
        f"{old}: {version}",
    )

    assert "set arch_guard_python to one" in section
    _assert_nothing_written(host)


@REFUSAL
def test_an_arch_guard_python_that_does_not_exist_is_refused(refusals):
    host = refusals.hosts["a missing arch_guard_python"]

    _refused_in(
        refusals,
        "a missing arch_guard_python",
        "Refuse a node without Python 3.8 or newer",
        f"{host.root / 'no-python'}: does not run",
    )
    _assert_nothing_written(host)


# the prefix
#
# One kind of unsafe prefix here: the refusal is one task for every kind. The survey's check
# of each kind (writable by others, by its group, a user's, a symlink, a file) on real
# directories is test_checks.py's, and the plan's refusal from it test_plan.py's.

UNSAFE_PREFIX_KINDS = ["a symlink"]


def _unsafe_prefix(kind):
    def arrange(host, _old):
        unsafe = host.root / "unsafe"
        if kind == "a symlink":
            (host.root / "real").mkdir()
            unsafe.symlink_to(host.root / "real")
        else:
            unsafe.mkdir()
            # Not sticky: whoever may write here may rename what root makes in it.
            unsafe.chmod({"writable by others": 0o777, "writable by its group": 0o775}.get(kind, 0o755))
            if kind == "a user's":
                os.chown(unsafe, 65534, 65534)
        return {"arch_guard_prefix": str(unsafe / "arch-guard")}

    return arrange


for _kind in UNSAFE_PREFIX_KINDS:
    _case(f"a prefix {_kind}", _unsafe_prefix(_kind))


@REFUSAL
@pytest.mark.parametrize("kind", UNSAFE_PREFIX_KINDS)
def test_a_prefix_that_users_could_replace_is_refused(refusals, kind):
    host = refusals.hosts[f"a prefix {kind}"]
    unsafe = host.root / "unsafe"

    _, section = _refused_in(
        refusals,
        f"a prefix {kind}",
        "Refuse a prefix that users could replace",
        f"arch_guard: {unsafe} must be a directory",
    )

    assert "owned by root and writable by root alone" in section
    assert not os.path.lexists(unsafe / "arch-guard")
    assert not os.path.lexists(host.root / "real" / "arch-guard")
    _assert_nothing_written(host)


# the settings
#
# One unusable value of each type the settings reach the role with (a path, a list, a number,
# a boolean with a path): each goes through Ansible's templating to the plan. Every rule
# with every value it refuses is test_plan.py's table
# (test_settings_the_role_cannot_use_are_named_with_every_rule).

UNUSABLE_SETTINGS = [
    {"arch_guard_prefix": "opt/arch-guard"},
    {"arch_guard_python_candidates": ["/usr/bin/python3", "python3"]},
    {"arch_guard_timeout": 90000},
    {"arch_guard_manage_slurm_conf": True, "arch_guard_chain_task_prolog": "/bin/true"},
]


def _settings_id(settings) -> str:
    return ",".join(f"{name[len('arch_guard_') :]}={value}" for name, value in settings.items())


for _settings in UNUSABLE_SETTINGS:
    _case(f"settings {_settings_id(_settings)}", lambda host, old, settings=_settings: dict(settings))


@REFUSAL
@pytest.mark.parametrize("settings", UNUSABLE_SETTINGS, ids=_settings_id)
def test_settings_the_role_cannot_use_are_refused_first(refusals, settings):
    host, section = _refused_in(
        refusals,
        f"settings {_settings_id(settings)}",
        "Check the settings",
        "must be absolute paths (the prefix not /)",
    )

    assert "arch_guard_timeout must be more than 0 and at most" in section
    assert "arch_guard_chain_task_prolog is for a slurm.conf the role does not own" in section
    _assert_nothing_written(host)


# slurm.conf


def _two_task_prolog_lines(host, _old):
    site = _executable(host.root / "site" / "prolog.sh", "#!/bin/sh\n")
    host.slurm_conf.write_text(SLURM_CONF + f"TaskProlog={site}\ntaskprolog = /usr/local/sbin/other\n")
    return {"arch_guard_manage_slurm_conf": True}


_case("two TaskProlog lines", _two_task_prolog_lines)


@REFUSAL
def test_a_slurm_conf_with_two_task_prolog_lines_is_refused(refusals):
    host = refusals.hosts["two TaskProlog lines"]

    _, section = _refused_in(
        refusals,
        "two TaskProlog lines",
        "Refuse more than one TaskProlog line",
        f"{host.slurm_conf} has 2 TaskProlog lines",
    )

    assert "keep one, then run the role again" in section
    site = host.root / "site" / "prolog.sh"
    _assert_nothing_written(host, SLURM_CONF + f"TaskProlog={site}\ntaskprolog = /usr/local/sbin/other\n")


# A FIFO, which a read would hang on. The survey's reading of a missing slurm.conf, a FIFO
# and a directory is test_survey.py's; the plan's refusal from it test_plan.py's.
UNREADABLE_SLURM_CONF = {
    "a FIFO": "not a regular file",
}


def _unreadable_slurm_conf(kind):
    def arrange(host, _old):
        host.slurm_conf.unlink()
        if kind == "a FIFO":
            os.mkfifo(host.slurm_conf, 0o644)
        elif kind == "a directory":
            host.slurm_conf.mkdir()
        return {"arch_guard_manage_slurm_conf": True}

    return arrange


for _kind in UNREADABLE_SLURM_CONF:
    _case(f"slurm.conf {_kind}", _unreadable_slurm_conf(_kind))


@REFUSAL
@pytest.mark.parametrize("kind", list(UNREADABLE_SLURM_CONF))
def test_a_slurm_conf_the_survey_cannot_read_is_refused_without_waiting_on_it(refusals, kind):
    """The survey reads slurm.conf only when it is a regular file: a FIFO there would hang a
    read until some writer came (the batch's timeout says it did not)."""
    host = refusals.hosts[f"slurm.conf {kind}"]

    _refused_in(
        refusals,
        f"slurm.conf {kind}",
        "Refuse a slurm.conf that cannot be read",
        f"arch_guard: cannot read {host.slurm_conf} ({UNREADABLE_SLURM_CONF[kind]}: {host.slurm_conf})",
    )
    assert host.written() == []


# The survey's look at a missing TaskProlog and at a directory is test_survey.py's, the
# plan's refusal of each kind test_plan.py's (chain-missing, chain-a-directory, ...).
UNRUNNABLE_PROLOG_KINDS = ["not executable"]


def _unrunnable_prolog_in_slurm_conf(kind):
    def arrange(host, _old):
        site = host.root / "site" / "prolog.sh"
        if kind == "a directory":
            site.mkdir(parents=True)
        elif kind == "not executable":
            _executable(site, "#!/bin/sh\necho print site\n").chmod(0o644)
        host.slurm_conf.write_text(SLURM_CONF + f'TaskProlog = "{site}"   # the site\'s own\n')
        return {"arch_guard_manage_slurm_conf": True}

    return arrange


for _kind in UNRUNNABLE_PROLOG_KINDS:
    _case(f"slurm.conf's TaskProlog {_kind}", _unrunnable_prolog_in_slurm_conf(_kind))


@REFUSAL
@pytest.mark.parametrize("kind", UNRUNNABLE_PROLOG_KINDS)
def test_a_task_prolog_in_slurm_conf_that_cannot_run_is_refused(refusals, kind):
    host = refusals.hosts[f"slurm.conf's TaskProlog {kind}"]
    site = host.root / "site" / "prolog.sh"

    _refused_in(
        refusals,
        f"slurm.conf's TaskProlog {kind}",
        "Refuse a TaskProlog to chain that cannot run",
        f"the TaskProlog to run before the guard, {site}, is not an executable file for all users",
    )
    _assert_nothing_written(host, SLURM_CONF + f'TaskProlog = "{site}"   # the site\'s own\n')


def _unrunnable_prolog_to_chain(host, _old):
    site = _executable(host.root / "site" / "prolog.sh", "#!/bin/sh\n")
    site.chmod(0o744)
    return {"arch_guard_chain_task_prolog": str(site)}


_case("a TaskProlog to chain that cannot run", _unrunnable_prolog_to_chain)


@REFUSAL
def test_a_task_prolog_to_chain_that_cannot_run_is_refused(refusals):
    host = refusals.hosts["a TaskProlog to chain that cannot run"]
    site = host.root / "site" / "prolog.sh"

    _refused_in(
        refusals,
        "a TaskProlog to chain that cannot run",
        "Refuse a TaskProlog to chain that cannot run",
        f"{site}, is not an executable file",
    )
    _assert_nothing_written(host)


# ------------------------------------------------------------------ the prefix: accepted


def test_a_prefix_under_a_sticky_directory_writable_by_all_is_accepted(host):
    sticky = host.root / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    host.prefix = sticky / "arch-guard"

    play = host.run()

    _succeeded(play)
    assert host.launcher.is_file()


# ------------------------------------------------------------------ check mode


@pytest.mark.parametrize("managed", [True, False], ids=["managing slurm.conf", "not managing slurm.conf"])
def test_check_mode_on_a_new_host_reports_changes_and_writes_nothing(host, managed):
    play = host.run("--check", "--diff", arch_guard_manage_slurm_conf=managed)

    _succeeded(play)
    assert play.changed > 0
    if managed:
        assert _task_changed(play, "Set TaskProlog in slurm.conf")
        # The handler is notified and does nothing in check mode: no scontrol here.
        assert "RUNNING HANDLER [hpcstack.ops.arch_guard : Reconfigure Slurm]" in play.stdout
    _assert_nothing_written(host)


# ------------------------------------------------------------------ an install


def test_an_install_beside_the_site_s_slurm_conf_sets_the_facts_and_leaves_slurm_conf(host):
    """One install checked for everything a default install must be: the facts, slurm.conf
    untouched, an idempotent rerun, files root's alone and byte-compiled, and a launcher that
    ignores the job's Python settings."""
    first = host.run()
    second = host.run()

    _succeeded(first)
    assert first.changed > 0
    facts = _facts(first)
    assert facts["arch_guard_task_prolog"] == str(host.launcher)
    assert facts["arch_guard_launcher"] == str(host.launcher)
    # The first of the default candidates that is Python 3.8 or newer.
    assert facts["arch_guard_python_interpreter"] == "/usr/bin/python3"
    assert host.launcher.read_text().startswith("#!/usr/bin/python3 -IS\n")
    assert not host.wrapper.exists()
    assert host.release()["python"] == "/usr/bin/python3"
    _assert_nothing_written_but_the_guard(host)
    assert (second.done.returncode, second.changed) == (0, 0), second.output
    assert _facts(second) == facts
    _assert_root_s_alone_and_byte_compiled(host, facts["arch_guard_python_interpreter"])
    _assert_the_launcher_ignores_the_job_s_python_settings(host)


def _assert_nothing_written_but_the_guard(host):
    assert host.written() == [str(host.prefix.parent), str(host.prefix)]
    assert host.slurm_conf.read_text() == SLURM_CONF


def _job_env(host, **extra) -> dict:
    """A task's environment with EESSI loaded for a target whose archdetect is not there: the
    guard's decision is a failure it reports, in lines of its own."""
    tmpdir = host.root / "job-tmp"
    tmpdir.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/nonexistent",
        "TMPDIR": str(tmpdir),
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": "node001",
        "EESSI_SOFTWARE_SUBDIR": "x86_64/amd/zen3",
        "EESSI_PREFIX": "/nonexistent/eessi",
    }
    env.update(extra)
    return env


GUARD_LINES = [
    "export EESSI_ARCH_GUARD_FAILED=x86_64/amd/zen3->archdetect-failed",
    "print eessi-arch-guard: could not detect this node's CPU; the job keeps its x86_64/amd/zen3",
]


def test_a_chained_task_prolog_runs_first_and_the_guard_after_it(host):
    """Chained: the site's prolog runs first and the guard after it; a failing site prolog
    fails the wrapper and the guard does not run; removal is refused while slurm.conf names
    the wrapper; a run that no longer chains removes the wrapper. One install for all: the
    wrapper runs the site's file as it is then."""
    site = _executable(
        host.root / "site" / "prolog.sh",
        "#!/bin/sh\necho export SITE_PROLOG_VAR=from-the-site\necho print site-prolog: hello\n",
    )

    first = host.run(arch_guard_chain_task_prolog=str(site))
    second = host.run(arch_guard_chain_task_prolog=str(site))

    _succeeded(first)
    assert _facts(first)["arch_guard_task_prolog"] == str(host.wrapper)
    assert _facts(first)["arch_guard_launcher"] == str(host.launcher)
    assert (second.done.returncode, second.changed) == (0, 0), second.output
    _assert_nothing_written_but_the_guard(host)
    ran = _run([host.wrapper], _job_env(host))
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0, ran
    assert lines[:2] == ["export SITE_PROLOG_VAR=from-the-site", "print site-prolog: hello"]
    assert lines[2] == GUARD_LINES[0]
    assert lines[3].startswith(GUARD_LINES[1])
    assert len(lines) == 4

    _executable(site, "#!/bin/sh\necho print site-prolog: broken\nexit 3\n")
    failing = _run([host.wrapper], _job_env(host))

    assert (failing.returncode, failing.stdout) == (3, "print site-prolog: broken\n"), failing
    _assert_a_removal_is_refused_while_slurm_conf_names(host, host.wrapper)

    unchained = host.run()

    _succeeded(unchained)
    assert _facts(unchained)["arch_guard_task_prolog"] == str(host.launcher)
    assert not host.wrapper.exists()


# ------------------------------------------------------------------ the installed launcher


def _broken_job_side(root: Path) -> dict:
    """What a job may set that must not reach the guard: a python3 first on PATH that
    fails, PYTHONHOME, and a PYTHONPATH whose hpcstack_ops raises."""
    _executable(root / "broken-bin" / "python3", "#!/bin/sh\necho the job\\'s python3 ran >&2\nexit 97\n")
    package = root / "pythonpath" / "hpcstack_ops"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("the job\'s PYTHONPATH reached the guard")\n')
    return {
        "PATH": f"{root / 'broken-bin'}:/usr/bin:/bin",
        "PYTHONHOME": "/nonexistent",
        "PYTHONPATH": str(root / "pythonpath"),
    }


def _assert_root_s_alone_and_byte_compiled(host, python):
    for folder, folders, names in os.walk(host.prefix):
        for name in [*folders, *names]:
            info = os.lstat(os.path.join(folder, name))
            assert (info.st_uid, info.st_gid) == (0, 0), os.path.join(folder, name)
            if not stat.S_ISLNK(info.st_mode):
                assert info.st_mode & 0o022 == 0, os.path.join(folder, name)
    assert stat.S_IMODE(host.prefix.stat().st_mode) == 0o755
    assert stat.S_IMODE(host.launcher.stat().st_mode) == 0o755
    tag = _run([python, "-c", "import sys; print(sys.implementation.cache_tag)"], {}).stdout.strip()
    package = host.prefix / "lib" / "current" / "hpcstack_ops"
    modules = sorted(package.rglob("*.py"))
    assert {path.parent.name for path in modules} == {"hpcstack_ops", "common", "arch_guard"}
    missing = [
        path for path in modules if not (path.parent / "__pycache__" / f"{path.stem}.{tag}.pyc").is_file()
    ]
    assert missing == []
    # The guard's part of module_utils, nothing of the rest.
    copied = sorted(str(path.relative_to(package)) for path in modules)
    listed = list_tree(str(checkout.REPO), CODE_DIRS)
    expected = [name.replace("plugins/module_utils/", "", 1) for name in listed if name.endswith(".py")]
    assert copied == sorted([*expected, "__init__.py"])


def _assert_the_launcher_ignores_the_job_s_python_settings(host):
    env = _broken_job_side(host.root)
    assert _run(["python3", "-c", "pass"], env).returncode == 97

    # From a directory holding that hpcstack_ops too: -I keeps the current directory out.
    ran = _run([host.launcher, "--json"], env, cwd=host.root / "pythonpath")

    assert (ran.returncode, ran.stderr) == (0, ""), ran
    decision = json.loads(ran.stdout)
    assert decision["action"] == "skip"
    assert decision["detail"] == "EESSI is not loaded (EESSI_SOFTWARE_SUBDIR is unset or empty)"
    assert decision["mode"] == "prolog"


def test_the_site_s_settings_reach_the_guard(host):
    _succeeded(
        host.run(arch_guard_timeout=2, arch_guard_verbose=True, arch_guard_disabled_partitions=["debug"]),
    )
    env = _job_env(host, SLURM_JOB_PARTITION="debug", **_broken_job_side(host.root))

    off = _run([host.launcher, "--json"], env)
    job_on = _run([host.launcher, "--json"], dict(env, EESSI_ARCH_GUARD="1"))
    quiet = _run([host.launcher, "--json"], dict(env, EESSI_ARCH_GUARD_VERBOSE="0"))
    as_prolog = _run([host.launcher], env)

    disabled = "disabled by EESSI_ARCH_GUARD=0"
    assert off.returncode == 0, off
    assert json.loads(off.stdout)["detail"] == disabled
    assert off.stderr == f"eessi-arch-guard: {disabled}\n"
    # The site switched the partition off: the job cannot switch it on.
    assert json.loads(job_on.stdout)["detail"] == disabled
    # The site's verbosity is a default; the job's own setting wins.
    assert (quiet.returncode, quiet.stderr) == (0, "")
    assert json.loads(quiet.stdout)["detail"] == disabled
    assert (as_prolog.returncode, as_prolog.stdout) == (0, "")

    # Another partition, and an archdetect that hangs: the guard gives up when the site's
    # timeout has passed, or the job's own when it sets one.
    init = host.root / "eessi-init"
    _executable(init / "eessi_archdetect.sh", "#!/bin/bash\nexec sleep 300\n")
    env = _job_env(host, SLURM_JOB_PARTITION="batch", EESSI_INIT_PREFIX=str(init))
    del env["SLURM_JOB_ID"]  # no step cache: each run decides anew

    site = _run([host.launcher, "--json"], env)
    job = _run([host.launcher, "--json"], dict(env, EESSI_ARCH_GUARD_TIMEOUT="1"))

    assert site.returncode == 0, site
    assert json.loads(site.stdout)["action"] == "fail"
    assert "gave up after 2 s" in json.loads(site.stdout)["message"]
    assert site.stderr.startswith("eessi-arch-guard: ")
    assert (job.returncode, json.loads(job.stdout)["action"]) == (0, "fail")
    assert "gave up after 1 s" in json.loads(job.stdout)["message"]


# ------------------------------------------------------------------ upgrades


def _change(collection: Path, relative: str, note: str) -> str:
    """Append ``note`` to one file of the guard's code in ``collection``; the code's new digest."""
    path = collection / relative
    path.write_text(path.read_text() + f"# {note}\n")
    return digest_files(str(collection), list_tree(str(collection), CODE_DIRS))


def test_a_new_release_of_the_guard_is_switched_in_and_the_build_before_it_kept(root, tmp_path):
    """Each new release gets a build of its own and the one before it is kept; a run that
    changes nothing, or finds only an interpreter's leftovers in the source tree, installs
    nothing."""
    collection = checkout.copy_to(tmp_path / "collection")
    host = Host(root, collection)
    _succeeded(host.run())
    [first_build] = host.builds()
    assert host.current_build() == first_build
    assert host.release()["digest"] == digest_files(str(collection), list_tree(str(collection), CODE_DIRS))

    second_digest = _change(collection, "plugins/module_utils/arch_guard/emit.py", "a later release")
    second = host.run()

    _succeeded(second)
    assert _task_changed(second, "Switch to this build")
    second_build = host.current_build()
    assert second_build != first_build
    # A task that started before the switch still imports the build it started with.
    assert host.builds() == sorted([first_build, second_build])
    assert host.release()["digest"] == second_digest
    assert host.release()["build"] == second_build
    installed = host.prefix / "lib" / "current" / "hpcstack_ops" / "arch_guard" / "emit.py"
    assert installed.read_text().endswith("# a later release\n")
    ran = _run([host.launcher, "--json"], {"PATH": "/usr/bin:/bin"})
    assert json.loads(ran.stdout)["action"] == "skip"

    third_digest = _change(collection, "plugins/module_utils/arch_guard/lean_os.py", "yet another release")
    third = host.run()
    # What an interpreter leaves in the source tree is not part of the code: the run after
    # the third, with such leftovers there, installs nothing (and keeps both builds).
    pycache = collection / "plugins" / "module_utils" / "arch_guard" / "__pycache__"
    pycache.mkdir(exist_ok=True)
    (pycache / "emit.cpython-311.pyc").write_bytes(b"not code")
    fourth = host.run()

    _succeeded(third)
    third_build = host.current_build()
    assert host.release()["digest"] == third_digest
    assert (fourth.done.returncode, fourth.changed) == (0, 0), fourth.output
    assert host.builds() == sorted([second_build, third_build])


# ------------------------------------------------------------------ removal


def _assert_a_removal_is_refused_while_slurm_conf_names(host, named: Path):
    """slurm.conf names ``named`` (the launcher or the wrapper): removal is one refused task,
    and the guard, slurm.conf and the state directory stay as they were."""
    wrapper_there = host.wrapper.is_file()
    slurm_conf = SLURM_CONF + f'TaskProlog = "{named}" # ours\n'
    host.slurm_conf.write_text(slurm_conf)

    play = host.run(arch_guard_state="absent")

    _refused(
        play,
        "Refuse to remove a guard that slurm.conf still names",
        f"arch_guard: {host.slurm_conf} still names the guard as TaskProlog",
    )
    assert host.launcher.is_file()
    assert host.wrapper.is_file() == wrapper_there
    assert host.slurm_conf.read_text() == slurm_conf
    assert not host.state_dir.exists()
    host.slurm_conf.write_text(SLURM_CONF)


def test_removing_a_guard_that_slurm_conf_does_not_name_removes_the_prefix(host):
    """While slurm.conf names the launcher, removal is refused; once it names another
    TaskProlog, check mode reports the removal and removes nothing, then the removal, then a
    second removal that has nothing left to do."""
    _succeeded(host.run())
    _assert_a_removal_is_refused_while_slurm_conf_names(host, host.launcher)
    slurm_conf = SLURM_CONF + "TaskProlog=/usr/local/sbin/site-prolog\n"
    host.slurm_conf.write_text(slurm_conf)

    checked = host.run("--check", arch_guard_state="absent")

    _succeeded(checked)
    assert checked.changed > 0
    assert host.launcher.is_file()

    play = host.run(arch_guard_state="absent")
    again = host.run(arch_guard_state="absent")

    _succeeded(play)
    assert play.changed > 0
    assert not host.prefix.exists()
    assert host.slurm_conf.read_text() == slurm_conf
    assert not host.state_dir.exists()
    assert (again.done.returncode, again.changed) == (0, 0), again.output


def test_removing_a_guard_that_was_never_installed_changes_nothing(host):
    play = host.run(arch_guard_state="absent")

    assert (play.done.returncode, play.changed, play.failed) == (0, 0, 0), play.output
    _assert_nothing_written(host)


def test_the_python_given_runs_the_guard_and_compiles_its_code(host):
    python = pythons.find("3.8")
    assert python, "no Python 3.8 here (pyenv) to give the role as arch_guard_python"

    play = host.run(arch_guard_python=python)

    _succeeded(play)
    assert _facts(play)["arch_guard_python_interpreter"] == python
    assert host.launcher.read_text().startswith(f"#!{python} -IS\n")
    assert host.release()["python"] == python
    assert list(
        (host.prefix / "lib" / "current" / "hpcstack_ops" / "arch_guard" / "__pycache__").glob(
            "cli.cpython-38.pyc"
        )
    )
    ran = _run([host.launcher, "--json"], {"PATH": "/usr/bin:/bin"})
    assert (ran.returncode, json.loads(ran.stdout)["action"]) == (0, "skip"), ran
