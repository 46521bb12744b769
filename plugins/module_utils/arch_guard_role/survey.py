# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the arch_guard role reads on a node, in one call (one round trip): typed facts, no
decision (``plan.py`` decides).

Each part is asked for by its option, and reported under its name:

- the node's checks (``checks.NODE_CHECKS``), each that the options give what it reads: its
  fact under its name (``parents``, the directories from ``/`` down to the prefix, with
  ``prefix``), and its problem, or "", in ``problems`` under the same name;
- ``prefix``: ``guard``, the guard's own paths that are there (``installed``); ``release``,
  release.json (``installed.parse_release``), or ``release_problem``;
- ``state_dir``: ``state``, its directories from ``/`` (``parents``), the state directory
  (``stat``) and the TaskProlog line kept there (``kept``: its text and the line), or
  ``problem``;
- ``slurm_conf``: ``slurm_conf``, the file this host reads: its TaskProlog lines, SlurmdUser,
  what identifies it (``identity``: whether slurmd runs configless here, the filesystem's type
  and source, device, inode, this kernel's boot id, the sha256), or ``problem``;
- ``python``: ``python``, the candidates in order, each started as the launcher starts it
  (``-IS``) for its version, up to the first that is 3.8 or newer;
- ``prologs``: ``prologs``, each path (and those slurm.conf and the kept line name) as it is
  (``trust.facts``, no link followed), null when it is not there;
- ``slurm_nodes``: ``nodes``, the NodeNames ``scontrol show nodes`` lists for that slurm.conf.

Every file is read as the core reads a file it does not trust: no link followed (slurm.conf's
own path resolved first: sites link it to shared storage), no FIFO waited on, the type checked
on the open descriptor, the size bounded. Nothing is written.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import List, Optional

from ..arch_guard import installed
from ..common import dirfd, errors, mountinfo, proc
from ..common.deadline import Deadline, DeadlineExceeded
from . import checks, slurmconf, slurmd, trust

# The interpreter's version, printed by the interpreter itself as the launcher starts it.
PYTHON_VERSION_CODE = 'import sys; print("%d.%d.%d" % sys.version_info[:3])'
MIN_PYTHON = (3, 8)
PROBE_SECONDS = 10
SCONTROL_SECONDS = 60
CONF_MAX_BYTES = 16 * 1024 * 1024
# The launcher and the wrapper are a few hundred bytes.
GUARD_FILE_MAX_BYTES = 1024 * 1024
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*\Z")
_PROBE_ENV = {"PATH": os.defpath, "LC_ALL": "C"}


class SurveyError(errors.UsageError):
    """The survey could not answer; ``str(err)`` is the one line."""


def survey(
    *,
    prefix: Optional[str] = None,
    state_dir: Optional[str] = None,
    slurm_conf: Optional[str] = None,
    python: Optional[List[str]] = None,
    prologs: Optional[List[str]] = None,
    slurm_nodes: bool = False,
) -> dict:
    """The facts the options ask for (the module's RETURN)."""
    asked: dict = {"prefix": prefix, "state_dir": state_dir, "slurm_conf": slurm_conf, "python": python}
    asked.update(prologs=prologs, slurm_nodes=slurm_nodes)
    facts: dict = {"problems": {}}
    for name, check in checks.NODE_CHECKS.items():
        found = check(asked)
        if found is not None:
            facts[name], facts["problems"][name] = found
    extra_prologs = list(prologs or [])
    if prefix:
        facts.update(look_at_prefix(prefix, facts["parents"]))
    if state_dir:
        facts["state"] = look_at_state_dir(state_dir)
        if facts["state"]["kept"] and facts["state"]["kept"]["line"]:
            extra_prologs.append(slurmconf.line_path(facts["state"]["kept"]["line"]))
    if slurm_conf:
        facts["slurm_conf"] = look_at_slurm_conf(slurm_conf)
        extra_prologs += [slurmconf.line_path(line["text"]) for line in facts["slurm_conf"]["task_prolog"]]
        if slurm_nodes:
            facts["nodes"] = listed_nodes(slurm_conf)
    if python is not None:
        facts["python"] = probe_pythons(python)
    if extra_prologs:
        facts["prologs"] = {path: look_at(path) for path in dict.fromkeys(extra_prologs) if path}
    return facts


def look_at(path: str) -> Optional[dict]:
    """``trust.facts`` of ``path`` as it is (a link not followed), or None when it is not there."""
    try:
        return trust.facts(path, os.lstat(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise SurveyError(f"cannot look at {path}: {err.strerror}") from None


def look_at_prefix(prefix: str, parents: list) -> dict:
    """``guard``, ``release`` and ``release_problem``, below the directories the ``parents``
    check walked down to the prefix (looked at again by descriptor: they may have changed)."""
    found: dict = {"guard": {}, "release": None, "release_problem": None}
    if parents[-1]["path"] != os.path.normpath(prefix) or parents[-1]["type"] != "directory":
        return found
    try:
        with dirfd.Directory.open(prefix, "/") as held:
            found["guard"] = _guard_paths(held)
            there = held.lstat(installed.RELEASE_FILE) is not None
    except errors.UsageError as err:  # the prefix was swapped for a link meanwhile
        raise SurveyError(str(err)) from None
    if there:
        try:
            found["release"] = installed.read_release(os.path.join(prefix, installed.RELEASE_FILE))
        except installed.ReleaseError as err:
            found["release_problem"] = str(err)
    return found


def _guard_paths(held: dirfd.Directory) -> dict:
    """The guard's own paths under ``held`` (the prefix) that are there, path -> facts, with
    the sha256 of the launcher's and the wrapper's bytes."""
    seen = {held.path: trust.facts(held.path, os.fstat(held.fd))}
    for name in (installed.BIN, installed.LIB):
        info = held.lstat(name)
        if info is not None:
            seen[held.join(name)] = trust.facts(held.join(name), info)
    if seen.get(held.join(installed.BIN), {}).get("type") != "directory":
        return seen
    bin_path = held.join(installed.BIN)
    with dirfd.Directory(dirfd.open_dir_at(held.fd, installed.BIN, bin_path), bin_path) as bin_dir:
        for relative in (installed.LAUNCHER, installed.WRAPPER):
            name = os.path.basename(relative)
            info = bin_dir.lstat(name)
            if info is None:
                continue
            seen[bin_dir.join(name)] = dict(trust.facts(bin_dir.join(name), info), sha256=None)
            if stat.S_ISREG(info.st_mode):
                data = bin_dir.read_regular(name, "", GUARD_FILE_MAX_BYTES)
                seen[bin_dir.join(name)]["sha256"] = hashlib.sha256(data).hexdigest()
    return seen


def look_at_state_dir(state_dir: str) -> dict:
    """``parents`` of the state directory, its ``stat``, the ``kept`` line (or ``problem``)."""
    parents = trust.look(state_dir)
    found: dict = {"parents": parents[:-1] if parents and parents[-1]["path"] == state_dir else parents}
    found.update(stat=None, kept=None, problem=None)
    if not parents or parents[-1]["path"] != state_dir:
        return found
    found["stat"] = parents[-1]
    if parents[-1]["type"] != "directory":
        return found
    where = os.path.join(state_dir, slurmconf.KEPT_FILE)
    try:
        with dirfd.Directory.open(state_dir, "/") as held:
            data = held.read_regular(slurmconf.KEPT_FILE, "", slurmconf.KEPT_MAX_BYTES)
        text = data.decode("utf-8")
        found["kept"] = dict(slurmconf.parse_kept(text), text=text)
    except FileNotFoundError:
        pass
    except errors.UsageError as err:
        found["problem"] = str(err)
    except OSError as err:
        found["problem"] = f"cannot read {where}: {err.strerror}"
    except ValueError:  # not UTF-8, not JSON, or not the role's
        found["problem"] = f"{where} is not a TaskProlog line the role kept"
    return found


def look_at_slurm_conf(path: str) -> dict:
    """The TaskProlog lines, SlurmdUser and identity of the slurm.conf at ``path``, or its problem."""
    found: dict = {"path": path, "problem": None, "task_prolog": [], "slurmd_user": None}
    real = os.path.realpath(path)
    data = None
    try:
        data = dirfd.read_regular(real, "", limit=CONF_MAX_BYTES)
        info = os.stat(real, follow_symlinks=False)
    except FileNotFoundError:
        found["problem"] = f"file not found: {path}"
    except errors.UsageError as err:
        found["problem"] = (
            f"not a regular file: {path}" if str(err).endswith("is not a regular file") else str(err)
        )
    except OSError as err:
        found["problem"] = f"{err.strerror}: {path}"
    identity: dict = {"configless": False, "fstype": None, "source": None, "dev": None, "ino": None}
    identity.update(boot_id=None, sha256=None)
    if data is not None:
        # Undecodable bytes cannot travel in a result: a TaskProlog path is ASCII anyway.
        text = data.decode("utf-8", "replace")
        found["task_prolog"] = slurmconf.task_prolog_lines(text)
        found["slurmd_user"] = slurmconf.slurmd_user(text)
        _point, fstype, source = mountinfo.mount_of(real)
        identity.update(
            fstype=fstype,
            source=source,
            dev=f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}",
            ino=info.st_ino,
            boot_id=_boot_id(),
            sha256=hashlib.sha256(data).hexdigest(),
        )
    identity["configless"] = bool(slurmd.configless_pids(found["slurmd_user"]))
    found["identity"] = identity
    return found


def _boot_id() -> str:
    return dirfd.read_regular(BOOT_ID, "", limit=64).decode("ascii").strip()


def version_of(path: str) -> dict:
    """``{"path", "version", "problem"}`` of the interpreter ``path``, started as the launcher
    starts it, only when it is a file of root's that nobody else can write: the survey runs
    as root, and would run what another user put there."""
    found = {"path": path, "version": None, "problem": "does not run"}
    if not os.path.isabs(path) or not os.access(path, os.X_OK) or not os.path.isfile(path):
        return found
    why = trust.distrust_executable(path)
    if why is not None:
        return dict(found, problem=f"not started: it {why}")
    try:
        done = proc.run_child(
            [path, "-IS", "-c", PYTHON_VERSION_CODE], env=_PROBE_ENV, deadline=Deadline(PROBE_SECONDS)
        )
    except (OSError, DeadlineExceeded):
        return found
    version = done.stdout.decode("ascii", "replace").strip()
    if done.returncode != 0 or not _VERSION.match(version):
        return found
    return dict(found, version=version, problem=None)


def suitable(version: Optional[str]) -> bool:
    """Whether ``version`` is a Python the guard runs on (3.8 or newer)."""
    return version is not None and tuple(int(part) for part in version.split(".")[:2]) >= MIN_PYTHON


def probe_pythons(candidates: List[str]) -> list:
    """``version_of`` each candidate in order, up to and with the first suitable one."""
    found = []
    for path in candidates:
        found.append(version_of(path))
        if suitable(found[-1]["version"]):
            break
    return found


def listed_nodes(slurm_conf: str) -> list:
    """The NodeNames ``scontrol show nodes`` lists for ``slurm_conf``; SurveyError if it fails."""
    scontrol = proc.find_program("scontrol", os.environ.get("PATH", os.defpath))
    if scontrol is None:
        raise SurveyError(f"arch_guard: no scontrol on PATH to list the nodes that read {slurm_conf}")
    env = dict(os.environ, SLURM_CONF=slurm_conf, LC_ALL="C")
    try:
        done = proc.run_child(
            [scontrol, "show", "nodes", "--oneliner"], env=env, deadline=Deadline(SCONTROL_SECONDS)
        )
    except DeadlineExceeded as err:
        raise SurveyError(f"arch_guard: scontrol show nodes: {err}") from None
    if done.returncode != 0:
        raise SurveyError(f"arch_guard: scontrol show nodes failed: {proc.summary(done.stderr)}")
    return slurmconf.node_names(done.stdout.decode("utf-8", "replace"))
