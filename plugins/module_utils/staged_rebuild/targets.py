# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The site file: a site's CPU targets, each with its own trees, and the check a job makes.

A heterogeneous cluster keeps one software tree per CPU target. The site describes them once,
in an INI file (``--targets-file``, else ``$EB_STAGED_REBUILD_TARGETS``)::

    [site]
    # EESSI's archdetect script, run by each job on its node (bash SCRIPT cpupath)
    archdetect = /cvmfs/software.eessi.io/versions/2023.06/init/eessi_archdetect.sh

    [target zen3]
    cpu = x86_64/amd/zen3                 # archdetect's answer on the target's nodes
    installpath = /apps/zen3              # or installpath-software + installpath-modules
    state-root = /apps/zen3/.eb-staged-rebuild   # the default with installpath
    constraint = zen3                     # sbatch --constraint, and/or
    partition = zen3                      # sbatch --partition

Everything is checked when the file is read, and a refusal is one line naming the file, the
section and the key: an unknown section or key, a missing ``cpu``, a target with neither
``constraint`` nor ``partition``, a relative path, a name that is not a plain name. The file
is read as a regular file only (a FIFO or a device would block or feed it anything).

``check_cpu`` is what a target's job runs on its node before building: EESSI's archdetect
says which CPU target the node is, with the job's environment (so EESSI's own
``EESSI_SOFTWARE_SUBDIR_OVERRIDE`` acts as it does for EESSI: a generic target built on any
node), and a node that is another target refuses the run before anything is built.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import stat
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from ..arch_guard import archdetect
from ..common import errors
from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import setting
from . import paths, slurmjob
from .records import AbsPath

TARGETS_VARIABLE = "EB_STAGED_REBUILD_TARGETS"
ALL = "all"  # --target all: every target of the file, in its order
SITE_SECTION = "site"
TARGET_PREFIX = "target "
SITE_KEYS = ("archdetect",)
TARGET_KEYS = (
    "cpu",
    "installpath",
    "installpath-software",
    "installpath-modules",
    "state-root",
    "constraint",
    "partition",
)
# A target's name goes into job names, journal fields and messages: a plain name.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# What archdetect answers: machine/vendor/model, path components only.
_CPU = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_.+-]+)*\Z")
# What sbatch takes after --constraint / --partition: no spaces or control characters.
_SLURM_VALUE = re.compile(r"^[A-Za-z0-9_.,:|&!*\[\]()-]{1,256}\Z")
_MAX_BYTES = 1 << 20
ARCHDETECT_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class Target:
    """One CPU target: the trees built for it, their state root, and how Slurm reaches its nodes."""

    name: str
    cpu: str
    trees: paths.Trees
    state_root: AbsPath
    constraint: Optional[str] = None
    partition: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Site:
    """The site file as read: ``targets`` in the file's order."""

    path: AbsPath
    archdetect: Optional[AbsPath]
    targets: Dict[str, Target]


def site_file(given: Optional[str], environ: Mapping[str, str]) -> Optional[AbsPath]:
    """The site file: ``--targets-file``, else ``$EB_STAGED_REBUILD_TARGETS``, else None."""
    path = given or environ.get(TARGETS_VARIABLE) or None
    return None if path is None else AbsPath(os.path.abspath(path))


def _refuse(path: str, where: str, what: str) -> errors.UsageError:
    return errors.UsageError(f"site file {path}, {where}: {what}")


def _read(path: str) -> str:
    """The file's text; only a regular file is read (a FIFO would block, a device feed anything)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise errors.UsageError(f"site file {path} cannot be read: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise errors.UsageError(f"site file {path} is not a regular file")
        if info.st_size > _MAX_BYTES:
            raise errors.UsageError(f"site file {path} is larger than {_MAX_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as err:
        raise errors.UsageError(f"site file {path} cannot be read: {err.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise errors.UsageError(f"site file {path} is not UTF-8 (byte {err.start})") from None


def load(path: str) -> Site:
    """The site file at ``path``, every section and key checked; UsageError otherwise."""
    path = os.path.abspath(path)
    parser = configparser.ConfigParser(
        interpolation=None, inline_comment_prefixes=("#", ";"), default_section="\0none"
    )
    try:
        parser.read_string(_read(path), source=path)
    except configparser.Error as err:
        # Its message spans lines (the file, the line, the text): one line for the user.
        raise errors.UsageError(f"site file {path}: {' '.join(err.message.split())}") from None
    archdetect_script = None
    found: Dict[str, Target] = {}
    for section in parser.sections():
        values = dict(parser.items(section))
        if section == SITE_SECTION:
            _unknown_keys(path, section, values, SITE_KEYS)
            archdetect_script = _absolute(path, section, "archdetect", values.get("archdetect"))
            continue
        if not section.startswith(TARGET_PREFIX):
            raise _refuse(path, f"[{section}]", "not a section of a site file ([site], [target NAME])")
        name = section[len(TARGET_PREFIX) :].strip()
        if not _NAME.match(name) or name == ALL:
            raise _refuse(
                path, f"[{section}]", f"target name {name!r} is not a plain name ([A-Za-z0-9._-]), nor 'all'"
            )
        target = _target(path, section, name, values)
        _refuse_shared(path, section, target, found.values())
        found[name] = target
    if not found:
        raise errors.UsageError(f"site file {path} has no [target NAME] section")
    return Site(AbsPath(path), archdetect_script, found)


def _refuse_shared(path: str, section: str, target: Target, earlier: Iterable[Target]) -> None:
    """Each target has a tree and a state root of its own: a submission gives every target's
    run one run id, and one tree published for two targets would be swapped twice."""
    for other in earlier:
        for key, mine, theirs in (
            ("state-root", target.state_root, other.state_root),
            ("installpath-software", target.trees.software, other.trees.software),
            ("installpath-modules", target.trees.modules, other.trees.modules),
        ):
            if mine == theirs:
                raise _refuse(path, f"[{section}] {key}", f"{mine} is also target {other.name}'s")


def _unknown_keys(path: str, section: str, values: Mapping[str, str], known: Sequence[str]) -> None:
    for key in values:
        if key not in known:
            raise _refuse(path, f"[{section}] {key}", f"unknown key (known: {', '.join(known)})")


def _absolute(path: str, section: str, key: str, value: Optional[str]) -> Optional[AbsPath]:
    if value is None:
        return None
    if not os.path.isabs(value):
        raise _refuse(path, f"[{section}] {key}", f"{value!r} is not an absolute path")
    return AbsPath(os.path.normpath(value))


def _target(path: str, section: str, name: str, values: Mapping[str, str]) -> Target:
    _unknown_keys(path, section, values, TARGET_KEYS)
    cpu = values.get("cpu")
    if not cpu:
        raise _refuse(path, f"[{section}] cpu", "missing: the CPU target archdetect names on its nodes")
    if not _CPU.match(cpu):
        raise _refuse(path, f"[{section}] cpu", f"{cpu!r} is not a CPU target such as x86_64/amd/zen3")
    installpath = _absolute(path, section, "installpath", values.get("installpath"))
    software = _absolute(path, section, "installpath-software", values.get("installpath-software"))
    modules = _absolute(path, section, "installpath-modules", values.get("installpath-modules"))
    state_root = _absolute(path, section, "state-root", values.get("state-root"))
    if software or modules:
        if installpath or not (software and modules):
            raise _refuse(
                path,
                f"[{section}] installpath-software",
                "installpath-software and installpath-modules go together, without installpath",
            )
        trees = paths.Trees(software, modules)
        if state_root is None:
            raise _refuse(path, f"[{section}] state-root", "missing: needed with installpath-software")
    elif installpath:
        trees = paths.Trees.from_installpath(installpath)
        state_root = state_root or AbsPath(os.path.join(installpath, paths.GENERATIONS))
    else:
        raise _refuse(path, f"[{section}] installpath", "missing: the target's live tree")
    constraint, partition = values.get("constraint") or None, values.get("partition") or None
    if constraint is None and partition is None:
        raise _refuse(path, f"[{section}] constraint", "missing: constraint or partition reaches the nodes")
    for key, value in (("constraint", constraint), ("partition", partition)):
        if value is not None and not _SLURM_VALUE.match(value):
            raise _refuse(path, f"[{section}] {key}", f"{value!r} is not a Slurm {key}")
    return Target(name, cpu, trees, state_root, constraint, partition)


def select(site: Site, names: Sequence[str]) -> List[Target]:
    """The targets ``--target`` names, in the order given; ``all`` is every target in the file's order."""
    if ALL in names:
        if len(names) > 1:
            raise errors.UsageError(f"{setting('target')} all goes alone")
        return list(site.targets.values())
    chosen = []
    for name in names:
        if name not in site.targets:
            known = ", ".join(site.targets)
            raise errors.UsageError(f"{setting('target')} {name!r} is not a target of {site.path} ({known})")
        if site.targets[name] in chosen:
            raise errors.UsageError(f"{setting('target')} {name} is given twice")
        chosen.append(site.targets[name])
    return chosen


def check_cpu(site: Site, target: Target, env: Mapping[str, str], deadline: Deadline) -> str:
    """archdetect's answer on this node when it is the target's cpu; else refuse
    (``PublishError``: nothing was built). The site's script, else EESSI's own
    (``$EESSI_INIT_PREFIX``, ``$EESSI_PREFIX``)."""
    node = slurmjob.this_node(env)
    try:
        script = site.archdetect or archdetect.find_script(env)
        answer = archdetect.cpupath(script, env, deadline)
    except archdetect.ArchdetectFailed as err:
        raise errors.PublishError(
            f"this node ({node}) cannot tell its CPU target: {err} (target {target.name}): nothing was built"
        ) from None
    except DeadlineExceeded:
        raise errors.PublishError(
            f"archdetect did not answer on this node ({node}) within {deadline.seconds:g} s "
            f"(target {target.name}): nothing was built"
        ) from None
    if answer != target.cpu:
        raise errors.PublishError(
            f"this node ({node}) is {answer}, not {target.cpu} (target {target.name}): nothing was built"
        )
    return answer
