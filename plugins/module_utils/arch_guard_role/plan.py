# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The arch_guard role's decisions: pure functions of its settings and of what the survey
found (``survey.py``), so that each is tested from a table.

- ``settings_problem``: the settings no survey is needed to refuse;
- ``fleet``: which hosts read the slurm.conf the role edits (per_node, shared, configless),
  the configuration's owner, and the layouts refused (several at once; configless without
  the controller named);
- ``node``: for one host, what to refuse (the first problem its own checks found, ``checks.py``,
  and what depends on more than the node), what to install (the interpreter, the build), what
  the launcher and the wrapper say, which TaskProlog to chain, what to write in slurm.conf and
  the state directory and what to leave as it is (a rerun that changes nothing writes
  nothing), and for removal, what to put back.

The role's filter plugin (``plugins/filter/arch_guard.py``) hands them the play's variables;
the role's tasks only say in which order things happen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from typing import Mapping, Optional

from ..arch_guard import installed
from ..arch_guard.settings import MAX_TIMEOUT_SECONDS
from ..common.version import VERSION
from . import checks, slurmconf, survey, trust

LAYOUTS = ("auto", "per_node", "shared", "configless")
# Filesystems that other hosts mount too: a file there is one file for all of them, known by
# the filesystem's source and the inode (the device number is each client's own). On any
# other filesystem a file is the same one only under the same kernel (its boot id), at the
# same device and inode: two hosts cloned from one image have equal inodes but two files.
NETWORK_FILESYSTEMS = frozenset(
    (
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "cifs",
        "smb3",
        "9p",
        "virtiofs",
        "panfs",
        "wekafs",
    )
)
# Each refusal of ``node``: the one line the role fails with, or "" (an assert's message is a string).
REFUSALS = (
    "settings",
    "prefix",
    "node",
    "state_dir",
    "python",
    "conf",
    "lines",
    "kept",
    "chain",
    "outside",
    "not_installed",
    "still_named",
)
STATE_DIR_MODE = 0o700
KEPT_FILE_MODE = 0o600
_TRUE = frozenset(("y", "yes", "on", "1", "true", "t"))


def as_bool(value) -> bool:
    """A variable's truth as Ansible's ``bool`` filter takes it ("yes", "True", 1, ...)."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


class Settings:
    """The role's public variables the decisions read, by their names without ``arch_guard_``."""

    def __init__(self, variables: Mapping) -> None:
        self.raw = dict(variables)
        self.state = str(variables.get("state", "present"))
        self.prefix = str(variables.get("prefix", installed.DEFAULT_PREFIX))
        self.python = str(variables.get("python") or "")
        self.python_candidates = [str(path) for path in variables.get("python_candidates") or []]
        self.manage_slurm_conf = as_bool(variables.get("manage_slurm_conf", False))
        self.slurm_conf = str(variables.get("slurm_conf", ""))
        self.slurm_conf_host = str(variables.get("slurm_conf_host") or "")
        self.slurm_conf_layout = str(variables.get("slurm_conf_layout", "auto"))
        self.chain_task_prolog = str(variables.get("chain_task_prolog") or "")
        self.state_dir = str(variables.get("state_dir", ""))
        self.timeout = variables.get("timeout", 60)
        self.verbose = as_bool(variables.get("verbose", False))
        self.disabled_partitions = [str(name) for name in variables.get("disabled_partitions") or []]

    @property
    def candidates(self) -> list:
        """The interpreters the role looks at, in order."""
        return [self.python] if self.python else self.python_candidates

    def path(self, relative: str) -> str:
        """A path of the install under the prefix (``installed``'s names)."""
        return os.path.join(os.path.normpath(self.prefix), relative)

    @property
    def kept_file(self) -> str:
        return os.path.join(self.state_dir, slurmconf.KEPT_FILE)


# ------------------------------------------------------------------ the settings


def _timeout(value) -> Optional[float]:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds <= MAX_TIMEOUT_SECONDS else None


def settings_problem(settings: Settings) -> Optional[str]:
    """The one line that refuses settings no survey is needed to refuse, or None.

    It names the settings at fault, then says what each must be."""
    wrong = []
    for name in ("prefix", "state_dir"):
        if not os.path.isabs(getattr(settings, name)):
            wrong.append(name)
    # "/", and "//" or "/./", which normpath keeps as they are.
    if os.path.isabs(settings.prefix) and not [
        part for part in settings.prefix.split("/") if part not in ("", ".")
    ]:
        wrong.append("prefix")
    if settings.python and not os.path.isabs(settings.python):
        wrong.append("python")
    if not all(os.path.isabs(path) for path in settings.python_candidates):
        wrong.append("python_candidates")
    if settings.chain_task_prolog and not os.path.isabs(settings.chain_task_prolog):
        wrong.append("chain_task_prolog")
    if settings.manage_slurm_conf and not os.path.isabs(settings.slurm_conf):
        wrong.append("slurm_conf")
    if settings.manage_slurm_conf and settings.chain_task_prolog:
        wrong += ["manage_slurm_conf", "chain_task_prolog"]
    if _timeout(settings.timeout) is None:
        wrong.append("timeout")
    if settings.slurm_conf_layout == "per_node" and settings.slurm_conf_host:
        wrong += ["slurm_conf_layout", "slurm_conf_host"]
    if not wrong:
        return None
    named = ", ".join(f"arch_guard_{name}={settings.raw.get(name)!r}" for name in dict.fromkeys(wrong))
    return (
        f"arch_guard: cannot use {named}: arch_guard_prefix, arch_guard_state_dir, arch_guard_python, "
        "arch_guard_python_candidates, arch_guard_chain_task_prolog and arch_guard_slurm_conf must be "
        "absolute paths (the prefix not /); arch_guard_chain_task_prolog is for a slurm.conf the role "
        "does not own (with arch_guard_manage_slurm_conf the configured TaskProlog is chained by "
        f"itself); arch_guard_timeout must be more than 0 and at most {MAX_TIMEOUT_SECONDS:g} seconds; "
        "arch_guard_slurm_conf_host names the owner of one configuration, which "
        "arch_guard_slurm_conf_layout per_node has not"
    )


# ------------------------------------------------------------------ the fleet


def conf_key(identity: Optional[Mapping]) -> str:
    """What names one slurm.conf file among hosts ("" for a host without one)."""
    if not identity or identity.get("sha256") is None:
        return ""
    if is_network(identity):
        parts = (identity["fstype"], identity["source"], identity["ino"], identity["sha256"])
    else:
        parts = (identity["boot_id"], identity["dev"], identity["ino"], identity["sha256"])
    return " ".join(str(part) for part in parts)


def is_network(identity: Mapping) -> bool:
    fstype = identity.get("fstype") or ""
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def auto_layout(identities: list, slurm_conf_host: str = "") -> str:
    """The layout of the hosts' slurm.conf from ``identities`` (``[(host, identity)]``, the
    survey's ``slurm_conf.identity`` of each host): ``configless`` when a slurmd runs with
    ``--conf-server``, ``shared`` when an owner is named, ``per_node`` when every host reads
    a file of its own on a local filesystem, ``shared`` when all read one, else ``mixed``.
    A host without the file counts as no file (its refusal comes later, by name)."""
    if any((identity or {}).get("configless") for _host, identity in identities):
        return "configless"
    if slurm_conf_host:
        return "shared"
    keys = [key for key in (conf_key(identity) for _host, identity in identities) if key]
    if len(set(keys)) == len(keys) and not any(
        identity and identity.get("sha256") is not None and is_network(identity)
        for _h, identity in identities
    ):
        return "per_node"
    if len(set(keys)) == 1 and len(keys) == len(identities):
        return "shared"
    return "mixed"


def fleet(settings: Settings, host: str, identities: list, node_name: str) -> dict:
    """The layout, the owner of the configuration and the layout's refusals, for ``host``
    among the batch's ``identities`` (``[(host, identity)]``, in the play's order)."""
    found = auto_layout(identities, settings.slurm_conf_host)
    if not settings.manage_slurm_conf:
        layout = "per_node"
    elif settings.slurm_conf_layout == "auto":
        layout = found
    else:
        layout = settings.slurm_conf_layout
    refusals = {"mixed": "", "configless": ""}
    if settings.manage_slurm_conf and settings.slurm_conf_layout == "auto" and found == "mixed":
        refusals["mixed"] = _mixed(identities)
    if layout == "configless" and not settings.slurm_conf_host:
        configless = [name for name, identity in identities if (identity or {}).get("configless")]
        refusals["configless"] = (
            f"arch_guard: slurmd on {', '.join(configless) or host} runs configless (--conf-server): it "
            "reads the controller's slurm.conf, not its own; set arch_guard_slurm_conf_host to the "
            "controller's inventory host"
        )
    batch = [name for name, _identity in identities]
    owner = host if layout == "per_node" else settings.slurm_conf_host or (batch[0] if batch else host)
    return {
        "layout": layout,
        "one_conf": layout != "per_node",
        "owner": owner,
        "node_name": node_name,
        "refusals": refusals,
    }


def _mixed(identities: list) -> str:
    by_key: dict = {}
    for name, identity in identities:
        key = conf_key(identity)
        if key:
            by_key.setdefault(key, []).append(name)
    groups = "; ".join(", ".join(names) for names in by_key.values())
    return (
        f"arch_guard: the hosts of this play read {len(by_key)} different slurm.conf, some of them "
        f"shared ({groups}); run the role once for each configuration, or set arch_guard_slurm_conf_layout"
    )


# ------------------------------------------------------------------ what the role writes


def launcher_text(settings: Settings, python: str) -> str:
    """The launcher: the guard run with the absolute ``python`` in isolated mode, the site's
    settings as its defaults (a job's own EESSI_ARCH_GUARD_TIMEOUT and _VERBOSE still win)."""
    launcher = settings.path(installed.LAUNCHER)
    code = settings.path(os.path.join(installed.LIB, installed.CURRENT))
    partitions = [str(name) for name in settings.disabled_partitions]
    return f"""#!{python} -IS
# Ansible managed: hpcstack.ops.arch_guard wrote this file, and puts it back when it changes.
# eessi-arch-guard as hpcstack.ops.arch_guard installed it: Slurm's TaskProlog, or
# eval "$({launcher} --shell)" in a job script. -IS: the job's PYTHONHOME,
# PYTHONPATH, user site-packages and current directory cannot reach the guard.
import sys

sys.path.insert(0, {json.dumps(code)})
try:
    from {installed.PACKAGE}.arch_guard.launcher import run
except Exception as problem:  # a TaskProlog that fails kills the task: skip instead
    import os

    if os.environ.get("SLURM_LOCALID") in (None, "0"):
        print("print eessi-arch-guard: skipped, {installed.CANNOT_LOAD} (%s)" % type(problem).__name__)
    raise SystemExit(0) from None

raise SystemExit(
    run(
        timeout={float(settings.timeout)!r},
        verbose={settings.verbose!r},
        disabled_partitions={json.dumps(partitions)},
    )
)
"""


def wrapper_text(settings: Settings, chain: str) -> str:
    """The TaskProlog that runs the site's ``chain`` first, then the launcher."""
    return f"""#!/bin/sh
# Ansible managed: hpcstack.ops.arch_guard wrote this file, and puts it back when it changes.
# Slurm's TaskProlog as hpcstack.ops.arch_guard installed it: the site's TaskProlog first,
# then eessi-arch-guard. slurmd reads both outputs as one, in this order, so the site's
# directives and messages reach the task as before; its exit status is the task's. When it
# fails, Slurm kills the task anyway, and the guard is not run.
{shlex.quote(chain)}
status=$?
if [ "$status" -eq 0 ]; then
    {shlex.quote(settings.path(installed.LAUNCHER))}
fi
exit "$status"
"""


# ------------------------------------------------------------------ one host


def node(
    settings: Settings,
    host: str,
    *,
    survey_facts: Optional[Mapping] = None,
    fleet_facts: Optional[Mapping] = None,
    owner_facts: Optional[Mapping] = None,
    prologs: Optional[Mapping] = None,
    code: Optional[Mapping] = None,
    play_nodes: Optional[list] = None,
) -> dict:
    """What the role does on ``host``, from what is known so far: each input that is None
    (not surveyed yet) leaves the decisions that need it None too.

    ``survey_facts`` is this host's survey, ``fleet_facts`` what ``fleet`` found for it,
    ``owner_facts`` the survey of the configuration's owner (one configuration for many
    nodes), ``prologs`` more TaskProlog facts (a survey of the one to chain, where this
    host's survey could not know it), ``code`` the digest and version of the guard's code,
    ``play_nodes`` the NodeNames of the hosts still in the play.
    """
    decided = _Node(
        settings, host, survey_facts or {}, fleet_facts, owner_facts=owner_facts, prologs=prologs or {}
    )
    return decided.result(code, play_nodes)


class _Node:
    def __init__(self, settings, host, survey_facts, fleet_facts, *, owner_facts, prologs) -> None:
        self.settings, self.host = settings, host
        self.survey = survey_facts
        self.fleet = fleet_facts
        self.one_conf = bool(fleet_facts and fleet_facts["one_conf"])
        self.owner = fleet_facts["owner"] if fleet_facts else host
        # With one configuration, slurm.conf and the kept line are the owner's.
        source = owner_facts if self.one_conf else (survey_facts if fleet_facts else None)
        self.conf = (source or {}).get("slurm_conf")
        self.state = (source or {}).get("state")
        self.nodes = (owner_facts or {}).get("nodes")
        self.prologs = {**(survey_facts.get("prologs") or {}), **(prologs.get("prologs") or {})}
        self.launcher = settings.path(installed.LAUNCHER)
        self.wrapper = settings.path(installed.WRAPPER)

    # -- what slurm.conf and the state directory hold
    def lines(self) -> list:
        return [line["text"] for line in (self.conf or {}).get("task_prolog", [])]

    def named(self) -> bool:
        """Whether slurm.conf's TaskProlog line names the guard's own files."""
        return any(slurmconf.line_path(line) in (self.launcher, self.wrapper) for line in self.lines())

    def kept(self) -> Optional[dict]:
        return (self.state or {}).get("kept")

    def previous_line(self) -> Optional[str]:
        """The site's TaskProlog line: the one in slurm.conf, unless that is the guard's (then
        the one kept from before it)."""
        current = next(iter(self.lines()), "")
        if slurmconf.line_path(current) in (self.launcher, self.wrapper):
            return (self.kept() or {}).get("line")
        return current or None

    def chain(self) -> str:
        if not self.settings.manage_slurm_conf:
            return self.settings.chain_task_prolog
        previous = self.previous_line()
        return slurmconf.line_path(previous) if previous else ""

    # -- refusals
    def refusals(self, play_nodes) -> dict:
        settings = self.settings
        found = dict.fromkeys(REFUSALS, "")
        found["settings"] = settings_problem(settings) or ""
        # The node's own checks (checks.py), each problem its one line: the first refuses.
        for check, line in (self.survey.get("problems") or {}).items():
            refusal = checks.OWN_REFUSAL.get(check, "node")
            found[refusal] = found[refusal] or line
        if self.survey.get("python") is not None and self.python() is None:
            found["python"] = self._no_python()
        if settings.manage_slurm_conf and self.state is not None:
            found["state_dir"] = self._state_dir_problem(self.state) or ""
        if settings.manage_slurm_conf and self.conf is not None:
            found.update(self._conf_refusals(self.conf))
        if self.chain_facts_known() and self.chained() and not self._chain_runs():
            found["chain"] = (
                f"arch_guard: the TaskProlog to run before the guard, {self.chain()}, is not an executable "
                f"file for all users on {self.host}"
            )
        if play_nodes is not None and self.nodes is not None:
            outside = [name for name in self.nodes if name not in play_nodes]
            if outside:
                conf = f"{settings.slurm_conf} on {self.owner}"
                found["outside"] = (
                    f"arch_guard: {conf} ({self.fleet['layout']}) is the configuration of Slurm nodes that "
                    f"are not in this play: {', '.join(outside)}. Its TaskProlog line would name the guard "
                    "on them too, where it is not installed, and their tasks would fail; add them to the "
                    "play (arch_guard_slurm_node_name maps a host to its NodeName), then run it again. "
                    "Nothing was changed."
                )
                found["not_installed"] = (
                    f"arch_guard: the guard is not installed on {', '.join(outside)}, which read {conf}; its "
                    "TaskProlog line was not changed"
                )
        if self.conf is not None and not settings.manage_slurm_conf and self.named():
            found["still_named"] = (
                f"arch_guard: {settings.slurm_conf} still names the guard as TaskProlog; point it elsewhere "
                "(and run scontrol reconfigure) before removing the guard, or let the role own the line "
                "with arch_guard_manage_slurm_conf"
            )
        return found

    def _no_python(self) -> str:
        probed = "; ".join(
            f"{probe['path']}: {probe['version'] or probe['problem']}" for probe in self.probed()
        )
        return (
            f"arch_guard: no Python 3.8 or newer on {self.host} for the guard ({probed}); set "
            "arch_guard_python to one, or arch_guard_python_package to a package that installs one"
        )

    def _state_dir_problem(self, state: Mapping) -> Optional[str]:
        chain = [*state["parents"], *([state["stat"]] if state["stat"] else [])]
        bad = trust.first_distrusted(chain)
        return None if bad is None else trust.refusal(bad[0], self.settings.state_dir)

    def _conf_refusals(self, conf: Mapping) -> dict:
        settings, found = self.settings, {}
        if conf["problem"]:
            found["conf"] = (
                f"arch_guard: cannot read {settings.slurm_conf} ({conf['problem']}); the role owns "
                "its TaskProlog line (arch_guard_manage_slurm_conf), so it must be there"
            )
        lines = self.lines()
        if len(lines) > 1:
            found["lines"] = (
                f"arch_guard: {settings.slurm_conf} has {len(lines)} TaskProlog lines; keep one, then run "
                "the role again"
            )
        state = self.state
        if self.named() and state is not None:
            if state["problem"]:
                found["kept"] = (
                    f"arch_guard: {settings.slurm_conf} on {self.owner} names the guard as TaskProlog, but "
                    f"the line found before it cannot be read ({state['problem']}); changing the line "
                    "now would lose the site's TaskProlog for every node that reads it"
                )
            elif self.one_conf and self.kept() is None:
                found["kept"] = (
                    f"arch_guard: {settings.slurm_conf} on {self.owner} names the guard as TaskProlog, but "
                    f"{settings.kept_file} is not there, where the line found before the guard's is kept: "
                    "another host kept it. Set arch_guard_slurm_conf_host to that host; changing the line "
                    "now would lose the site's TaskProlog for every node that reads it"
                )
        return found

    # -- the interpreter
    def probed(self) -> list:
        return self.survey.get("python") or []

    def python(self) -> Optional[str]:
        return next((probe["path"] for probe in self.probed() if survey.suitable(probe["version"])), None)

    # -- the TaskProlog to chain
    def chained(self) -> bool:
        return bool(self.chain())

    def chain_facts_known(self) -> bool:
        """Whether what is needed to decide the chain is there (and, if one, its facts)."""
        if self.settings.manage_slurm_conf and self.conf is None:
            return False
        return not self.chained() or self.chain() in self.prologs

    def _chain_runs(self) -> bool:
        facts = self.prologs.get(self.chain())
        return (
            os.path.isabs(self.chain())
            and facts is not None
            and facts["type"] == "file"
            and bool(facts["mode"] & 0o001)
        )

    # -- the result
    def result(self, code, play_nodes) -> dict:
        settings = self.settings
        known_conf = self.conf is not None or not settings.manage_slurm_conf
        chain = self.chain() if known_conf else None
        task_prolog = (self.wrapper if chain else self.launcher) if chain is not None else None
        line = f"TaskProlog={task_prolog}" if task_prolog else None
        python = self.python()
        decided = {
            "candidates": settings.candidates,
            "refusals": self.refusals(play_nodes),
            "python": python,
            # No candidate is one, and none was named: the distribution's package may bring one.
            "python_missing": bool(
                self.survey.get("python") is not None and python is None and not settings.python
            ),
            "launcher": self.launcher,
            "wrapper": self.wrapper,
            "launcher_text": launcher_text(settings, python) if python else None,
            "wrapper_text": wrapper_text(settings, chain) if chain else None,
            "write_wrapper": self._wrapper_differs(wrapper_text(settings, chain) if chain else None)
            if chain is not None
            else None,
            "task_prolog_regexp": slurmconf.TASK_PROLOG,
            "package": installed.PACKAGE,
            "chain": chain,
            "chain_unseen": bool(chain) and not self.chain_facts_known(),
            "task_prolog": task_prolog,
            "previous_line": self.previous_line() if known_conf else None,
            "line": line,
            "set_line": None,
            "keep_line": None,
            "named": self.named() if self.conf is not None else None,
            "restore_line": None,
            "forget_kept": None,
            "remove_files": self._prefix_there(),
            "build": None,
            "install_build": None,
            "release": None,
        }
        if code is not None and python is not None:
            release = installed.release_record(VERSION, code["digest"], python)
            decided.update(release=release, build=release["build"])
            decided["install_build"] = (self.survey.get("release") or {}).get("build") != release["build"]
        if settings.manage_slurm_conf and self.conf is not None and self.state is not None:
            decided.update(self._slurm_conf_writes(self.state, line))
        return decided

    def _wrapper_differs(self, text: Optional[str]) -> Optional[bool]:
        """Whether the wrapper the survey saw is not ``text`` (None: no wrapper), a file of
        root's with the launcher's mode: then the wrapper's step writes or removes it."""
        guard = self.survey.get("guard")
        if guard is None:
            return None
        seen = guard.get(self.wrapper)
        if text is None:
            return seen is not None
        wanted = ("file", 0, 0, installed.EXECUTABLE_MODE, hashlib.sha256(text.encode()).hexdigest())
        return (
            seen is None or (seen["type"], seen["uid"], seen["gid"], seen["mode"], seen["sha256"]) != wanted
        )

    def _prefix_there(self) -> Optional[bool]:
        parents = self.survey.get("parents")
        if parents is None:
            return None
        last = parents[-1]
        return last["path"] == os.path.normpath(self.settings.prefix) and last["type"] == "directory"

    def _slurm_conf_writes(self, held: Mapping, line) -> dict:
        kept = self.kept()
        text = slurmconf.kept_text(self.settings.slurm_conf, self.previous_line())
        state = held["stat"]
        state_as_left = bool(state) and (state["type"], state["uid"], state["gid"], state["mode"]) == (
            "directory",
            0,
            0,
            STATE_DIR_MODE,
        )
        lines = (self.conf or {}).get("task_prolog", [])
        return {
            "set_line": [(entry["text"], entry["terminated"]) for entry in lines] != [(line, True)],
            "keep_line": kept is None or kept["text"] != text or not state_as_left,
            "restore_line": (kept or {}).get("line") if self.named() else None,
            "forget_kept": kept is not None,
        }
