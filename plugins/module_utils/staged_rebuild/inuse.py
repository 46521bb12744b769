# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of some directory trees the processes of this node use, read from ``/proc``.

A process uses a tree when one of these lies inside it: its executable, its working
directory or its root (the links ``exe``, ``cwd``, ``root``), a file it holds open
(``fd/*``), a file it has mapped (``maps``: a shared library, an ``mmap`` of data), or a
path named by a value of its environment (a ``:``-separated list counts part by part). The
kernel keeps the first five up to date through renames: once a tree has been swapped out,
what a job still holds of it reads under the hidden sibling's name, the name gc collects.

As root every process can be read. Another user can read only their own processes' links,
maps and environments (the kernel asks for ptrace access): the others are counted as
unreadable, and so is any process whose entries could not be read for another reason than
its end. An unreadable process never makes a tree look unused: gc then keeps to its other
rules (the grace period), which only ever keep more. Processes in another mount namespace
(a container, a sandbox) name paths as their own root sees them, and processes in another
pid namespace are not listed here at all: neither is seen.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

PROC = "/proc"
LINKS = ("exe", "cwd", "root")
# A process's environment or maps above this is read only this far, and the process counts
# as unreadable: no process can hide a path from gc behind a large environment.
READ_LIMIT = 16 * 1024 * 1024
_DELETED = " (deleted)"


@dataclasses.dataclass(frozen=True)
class Process:
    """A process that uses a tree, and how (``exe``, ``cwd``, ``root``, ``fd``, ``maps``,
    ``environ``); ``job_id`` is its ``SLURM_JOB_ID`` where its environment could be read."""

    pid: int
    uid: int
    user: str
    command: str
    uses: Tuple[str, ...]
    job_id: Optional[str] = None

    @classmethod
    def from_dict(cls, record: Mapping) -> Process:
        """A process as another host's scan reported it (``dataclasses.asdict``); KeyError or
        TypeError or ValueError for a record that is not one."""
        return cls(
            pid=int(record["pid"]),
            uid=int(record["uid"]),
            user=str(record["user"]),
            command=str(record["command"]),
            uses=tuple(str(how) for how in record["uses"]),
            job_id=None if record.get("job_id") is None else str(record["job_id"]),
        )


@dataclasses.dataclass
class Scan:
    """One pass over ``/proc``: the users of each tree asked about, and what could not be seen."""

    users: Dict[str, List[Process]]
    scanned: int
    unreadable: int
    as_uid: int

    @property
    def every_process(self) -> bool:
        """Whether the scan could read every process: only as root."""
        return self.as_uid == 0

    def summary(self) -> dict:
        """The scan as a report's fields."""
        seen = "every process" if self.every_process else f"only the processes of uid {self.as_uid}"
        return {
            "scanned": self.scanned,
            "unreadable": self.unreadable,
            "as_uid": self.as_uid,
            "seen": f"{seen} of this node's pid namespace",
        }


def scan(trees: Sequence[str], proc: str = PROC) -> Scan:
    """Which processes use each of ``trees`` (absolute directories), from one pass over ``proc``."""
    targets = {tree: _spellings(tree) for tree in trees}
    users: Dict[str, List[Process]] = {tree: [] for tree in trees}
    # A path inside a tree holds the tree's path: what holds none of them is not parsed.
    needles = tuple({spelling for spellings in targets.values() for spelling in spellings})
    encoded = tuple(os.fsencode(needle) for needle in needles)
    scanned = unreadable = 0
    own = os.getpid()
    entries = []
    if targets:  # nothing to look for: nothing read
        try:
            entries = os.listdir(proc)
        except OSError:
            entries = []
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        directory = os.path.join(proc, entry)
        found = _read_process(directory, needles, encoded)
        if found is None:  # it ended while it was read
            continue
        scanned += 1
        if not found.complete:
            unreadable += 1
        for tree, spellings in targets.items():
            uses = tuple(sorted({how for how, path in found.paths if _inside(path, spellings)}))
            if uses:
                users[tree].append(_process(directory, int(entry), uses, found.environ))
    return Scan(users, scanned, unreadable, os.geteuid())


@dataclasses.dataclass
class _Found:
    """What one process names that may lie in a tree, and whether all of it could be read."""

    paths: List[Tuple[str, str]]
    complete: bool
    environ: bytes = b""


def _read_process(directory: str, needles: Tuple[str, ...], encoded: Tuple[bytes, ...]) -> Optional[_Found]:
    """The paths one process names that contain one of ``needles`` (``encoded``: the same as
    bytes), each with where it came from; None when the process has ended."""
    found = _Found([], True)
    for name in LINKS:
        _add_link(found, name, os.path.join(directory, name), needles)
    fds = os.path.join(directory, "fd")
    try:
        names = os.listdir(fds)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        names, found.complete = [], False
    for fd in names:
        _add_link(found, "fd", os.path.join(fds, fd), needles)
    for name, parse in (("maps", _mapped_paths), ("environ", _environment_paths)):
        try:
            data, whole = _read(os.path.join(directory, name), READ_LIMIT)
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            found.complete = False
            continue
        found.complete = found.complete and whole
        if name == "environ":
            found.environ = data
        if any(needle in data for needle in encoded):
            found.paths.extend((name, path) for path in parse(data))
    return found


def _process(directory: str, pid: int, uses: Tuple[str, ...], environ: bytes) -> Process:
    """A process that uses a tree, with its owner, command and job read now."""
    try:
        uid = os.stat(directory).st_uid
    except OSError:
        uid = -1
    try:
        command = _read(os.path.join(directory, "comm"), 4096)[0].decode(errors="replace").strip()
    except OSError:
        command = "?"
    return Process(pid, uid, _user(uid), command, uses, _job_id(environ))


def _add_link(found: _Found, how: str, link: str, needles: Tuple[str, ...]) -> None:
    try:
        target = _link(link)
    except (FileNotFoundError, ProcessLookupError):
        return  # a kernel thread has no executable, a zombie no links; a descriptor closed meanwhile
    except OSError:
        found.complete = False
        return
    if any(needle in target for needle in needles):
        found.paths.append((how, target))


def _link(path: str) -> str:
    return _undeleted(os.readlink(path))


def _undeleted(path: str) -> str:
    """A path as the kernel names a file that was unlinked, without its " (deleted)"."""
    return path[: -len(_DELETED)] if path.endswith(_DELETED) else path


def _read(path: str, limit: int) -> Tuple[bytes, bool]:
    """Up to ``limit`` bytes of a ``/proc`` file, and whether that was all of it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks: List[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)[:limit], False
    finally:
        os.close(fd)


def _mapped_paths(data: bytes) -> List[str]:
    """The files of a ``maps`` listing: the sixth field, where it is a path."""
    paths: List[str] = []
    for line in data.split(b"\n"):
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(b"/"):
            paths.append(_undeleted(os.fsdecode(fields[5])))
    return paths


def _environment_paths(data: bytes) -> List[str]:
    """Every absolute path an environment's values name, a ``:``-separated list part by part."""
    paths: List[str] = []
    for record in data.split(b"\0"):
        _name, sep, value = record.partition(b"=")
        if sep:
            paths.extend(os.fsdecode(part) for part in value.split(b":") if part.startswith(b"/"))
    return paths


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the form of a Slurm job id: digits, an array task's ``123_4`` or
    a heterogeneous job's component ``123+1``. A process's ``SLURM_JOB_ID`` is whatever its
    owner set: only a value of this form is named as a job for people."""
    for separator in ("_", "+"):
        head, found, tail = value.partition(separator)
        if found:
            return _digits(head) and _digits(tail)
    return _digits(value)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _job_id(environ: bytes) -> Optional[str]:
    """The Slurm job a process belongs to: its environment's ``SLURM_JOB_ID``."""
    for record in environ.split(b"\0"):
        if record.startswith(b"SLURM_JOB_ID="):
            return os.fsdecode(record[len(b"SLURM_JOB_ID=") :]) or None
    return None


def _spellings(tree: str) -> Tuple[str, ...]:
    """The tree's path as given and as the kernel names it (symlinks on the way resolved)."""
    given = os.path.normpath(tree)
    return tuple(dict.fromkeys((given, os.path.realpath(given))))


def _inside(path: str, spellings: Tuple[str, ...]) -> bool:
    path = os.path.normpath(path)
    return any(path == tree or path.startswith(tree + "/") for tree in spellings)


def _user(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 (a user name only for a process that uses a tree)

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """What the scans of other hosts answered: who uses each tree on which host, the hosts
    that gave no answer (unreachable, failed, or answering something unreadable), and the
    trees each answer covers (``asked``: host -> the trees its scan was asked about)."""

    users: Dict[str, List[Tuple[str, Process]]]
    unanswered: Tuple[str, ...]
    asked: Mapping[str, FrozenSet[str]] = dataclasses.field(default_factory=dict)

    def not_asked(self, tree: str) -> List[str]:
        """The hosts that answered, but not about ``tree``: their scans ran before it was a
        candidate (a rebuild swapped it out after the candidates were listed), so they say
        nothing of it."""
        return sorted(host for host, trees in self.asked.items() if tree not in trees)

    @classmethod
    def from_answers(cls, answers: Mapping[str, Optional[Mapping]]) -> Fleet:
        """``answers``: host -> the ``in_use`` that host's scan returned (``{tree: [process
        records]}``, every tree it was asked about); anything else (None, "", a failed task's
        leftovers) is no answer."""
        users: Dict[str, List[Tuple[str, Process]]] = {}
        unanswered = []
        asked = {}
        for host in sorted(answers):
            answer = answers[host]
            found = None
            if isinstance(answer, Mapping):
                try:
                    found = {
                        str(tree): [Process.from_dict(record) for record in records]
                        for tree, records in answer.items()
                    }
                except (AttributeError, KeyError, TypeError, ValueError):
                    found = None
            if found is None:
                unanswered.append(host)
                continue
            asked[host] = frozenset(found)
            for tree, processes in found.items():
                users.setdefault(tree, []).extend((host, process) for process in processes)
        return cls(users, tuple(unanswered), asked)
