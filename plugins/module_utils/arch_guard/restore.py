# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restore helper: reload the task's modules through Lmod on this node.

Lmod keeps what EESSI's module detected with ``source_sh`` in its module table, and a
second ``load`` of a loaded module reuses it: an environment from a login node keeps the
login node's answer. Only unloading and loading again makes EESSI detect anew. The helper
is a bash child in its own session and its own work directory: it unloads the task's
modules (last first), loads them again in order, and writes its environment before and
after as NUL-separated ``NAME=value`` records. Lmod's messages stay in the child's captured
stderr.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..common import proc
from ..common.deadline import Deadline, DeadlineExceeded, SigtermHeld
from . import archdetect, envdelta, settings

TYPE_CHECKING = False  # type checkers take this as True
if TYPE_CHECKING:
    from .family import NodeLmod

# $1: the env program, $2 and $3: this node's family's Lmod and its init/bash when they
# replace the job's, of another family (else empty), $4...: the modules, in load order. The
# work directory is the cwd.
# Lmod ends its output with `false` when a command fails, and then changes nothing, so
# eval's status is Lmod's; the LOADEDMODULES check catches a module that Lmod skipped
# without saying so.
#
# Each Lmod call pays Lmod's start, so there are two: the first unloads every module (last
# first; `load -<name>` unloads, before the loads of the same call) and loads the modules
# up to the EESSI module, the second loads the rest. Two, because EESSI's module points
# LMOD_PACKAGE_PATH at its SitePackage (its load hooks: the GPU driver check among them),
# which Lmod reads when it starts: the modules after it get those hooks, as in a login that
# loads EESSI first. Only when a call fails, or a module is missing afterwards, are the
# modules taken one by one, so that the module that cannot be loaded is named and Lmod's
# words about it are the helper's stderr (the grouped calls' words are dropped, or they
# would be said twice). LMOD_TERM_WIDTH spares each Lmod process (those that EESSI's
# source_sh starts among them) a `stty size` for a terminal the helper does not have; it
# is given to Lmod's command only, never exported, so no report holds it.
HELPER_SCRIPT = r"""
env_tool=$1
node_lmod=$2
node_lmod_init=$3
shift 3
lmod() {
    local code
    code=$(LMOD_TERM_WIDTH=${LMOD_TERM_WIDTH:-80} "$LMOD_CMD" bash "$@") || return 1
    eval "$code"
}
loaded() {
    case ":${LOADEDMODULES-}:" in
        *":$1:"*) return 0 ;;
    esac
    return 1
}
all_loaded() {
    local module
    for module in "$@"; do
        loaded "$module" || return 1
    done
}
# 0: reloaded; 1: the first call failed, nothing changed; 2: a later step failed.
grouped_reload() {
    local split=$# i unloads=()
    for (( i = $#; i >= 1; i-- )); do
        unloads+=("-${!i}")
    done
    for (( i = 1; i <= $#; i++ )); do
        case ${!i} in
            EESSI/*) split=$i; break ;;
        esac
    done
    lmod load "${unloads[@]}" "${@:1:split}" 2>/dev/null || return 1
    if (( split < $# )); then
        lmod load "${@:split+1}" 2>/dev/null || return 2
    fi
    all_loaded "$@" || return 2
}
"$env_tool" -0 > before.env || exit 90
if [ -n "$node_lmod" ]; then
    # Lmod's variables as a fresh start on this node sets them (LMOD_CMD, LMOD_DIR, ...).
    # shellcheck disable=SC1090
    . "$node_lmod_init" > /dev/null 2>&1
    if [ "${LMOD_CMD-}" != "$node_lmod" ]; then
        printf '%s set LMOD_CMD to %s, not %s\n' "$node_lmod_init" "${LMOD_CMD-}" "$node_lmod" >&2
        exit 92
    fi
fi
if (( $# > 0 )); then
    grouped_reload "$@"
    status=$?
    if (( status == 1 )); then
        for (( i = $#; i >= 1; i-- )); do
            lmod unload "${!i}"
        done
    fi
    if (( status != 0 )); then
        for module in "$@"; do
            lmod load "$module"
            loaded "$module" || { printf '%s' "$module" > failed-module; exit 3; }
        done
    fi
fi
"$env_tool" -0 > after.env || exit 91
: > complete
"""

_WORK_DIR_REMEDY = (
    "set TMPDIR to a directory of the job's user (mode 0700), or make /tmp root's with mode 1777"
)

_REPORT_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# An environment twice over is far below this; a report that is larger is not the helper's.
REPORT_MAX_BYTES = 16 * 1024 * 1024

# Where the helper's `env` is looked for: the system's, not one a module put on PATH.
_ENV_TOOL_PATH = "/usr/bin:/bin"
_WORK_DIR_PREFIX = ".eessi-arch-guard-restore."
# Random names tried for the work directory: 64 random bits each, so only a directory
# that refuses new entries (or a bug) exhausts them.
_WORK_DIR_TRIES = 5


class RestoreFailed(Exception):
    """The helper died, timed out or left no usable report."""


class ModuleLoadFailed(Exception):
    """One of the task's modules cannot be loaded on this node."""

    def __init__(self, module: str, detail: str) -> None:
        super().__init__(detail)
        self.module = module


class Report:
    """The helper's environment before and after the reload, as ``{name: value}``."""

    __slots__ = ("after", "before")

    def __init__(self, before: dict, after: dict) -> None:
        self.before = before
        self.after = after


def lmod_command(env):
    """``$LMOD_CMD`` when it names an executable file, else None."""
    command = env.get("LMOD_CMD", "")
    if command and os.path.isfile(command) and os.access(command, os.X_OK):
        return command
    return None


def reload_modules(env, modules, deadline: Deadline, lmod: NodeLmod, start=None) -> Report:
    """Run the helper from ``env`` and return its report.

    ``lmod`` is the Lmod to reload with (``family.lmod_for_node``); ``start`` the settings
    the helper starts with instead of the task's (``{name: value}``, None to unset:
    ``family.before_eessi``). Raises ModuleLoadFailed, RestoreFailed, DeadlineExceeded or
    Terminated. The work directory is removed whatever happens, a SIGTERM held until it is.
    """
    env_tool = proc.find_program("env", _ENV_TOOL_PATH)
    if env_tool is None:
        raise RestoreFailed(f"no env program in {_ENV_TOOL_PATH}")
    node_lmod = (lmod.command, lmod.init) if lmod.init is not None else ("", "")
    argv = [
        archdetect.bash_path(env),
        "--noprofile",
        "--norc",
        "-c",
        HELPER_SCRIPT,
        "restore",
        env_tool,
        *node_lmod,
    ]
    child_env = envdelta.reload_environment(env)
    for name, value in (start or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    work = None
    work_fd = None
    try:
        # Held so that a SIGTERM cannot fall between creating the directory and knowing it.
        with SigtermHeld():
            work = _make_work_dir(env)
            work_fd = _open_work_dir(work)
        try:
            result = proc.run_child(argv + list(modules), env=child_env, deadline=deadline, cwd=work)
        except OSError as err:
            raise RestoreFailed(f"cannot start the restore helper: {err.strerror}") from None
        return _read_report(work_fd, result, deadline)
    finally:
        if work is not None:
            with SigtermHeld():
                _remove_work_dir(work, work_fd)
        if work_fd is not None:
            os.close(work_fd)


def _make_work_dir(env) -> str:
    """A new directory under TMPDIR, or under /tmp when TMPDIR refuses it or is not trusted.

    slurmstepd, too, falls back to /tmp when the job's TMPDIR is not writable; a task
    should not lose its repair to that. Only a trusted directory (``settings.distrust``) is
    used: in one that others can write to without the sticky bit, they could rename the
    work directory away and plant their own, with their own report in it.
    """
    refusals = []
    for root in settings.scratch_candidates(env):
        reason = settings.distrust(root)
        if reason is not None:
            refusals.append(f"{reason}, not trusted")
            continue
        try:
            return _new_dir(root)
        except OSError as err:
            refusals.append(f"cannot create the helper's work directory in {root}: {err.strerror}")
    raise RestoreFailed(
        f"no place for the restore helper's work directory: {'; '.join(refusals)}; {_WORK_DIR_REMEDY}"
    )


def _new_dir(root: str) -> str:
    """A new directory in ``root`` under a random name, mode 0700, as ``tempfile.mkdtemp``
    makes one (tempfile and shutil would cost every cold decision milliseconds of imports)."""
    for _try in range(_WORK_DIR_TRIES):
        path = os.path.join(root, _WORK_DIR_PREFIX + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"{_WORK_DIR_TRIES} random names were all taken")


def _remove_work_dir(work: str, work_fd) -> None:
    """Empty the work directory through its descriptor (the directory this process made,
    whatever its name now leads to), then remove it. Failures are ignored: it is scratch."""
    names = []
    if work_fd is not None:
        with contextlib.suppress(OSError):
            names = os.listdir(work_fd)
    for name in names:
        try:
            os.unlink(name, dir_fd=work_fd)
        except IsADirectoryError:
            # Only something a module's command made in the helper's working directory.
            import shutil  # noqa: PLC0415 (never needed on the guard's usual path)

            shutil.rmtree(os.path.join(work, name), ignore_errors=True)
        except OSError:
            pass
    with contextlib.suppress(OSError):
        os.rmdir(work)


def _open_work_dir(work: str) -> int:
    """The work directory just made, as a descriptor: the report is read through it, so a
    directory renamed away and replaced by another after it was made is never read."""
    try:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise RestoreFailed(f"cannot open the helper's work directory {work}: {err.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
        os.close(fd)
        raise RestoreFailed(f"the helper's work directory {work} is not this user's with mode 0700")
    return fd


def _read_report(work_fd: int, result: proc.ChildResult, deadline: Deadline) -> Report:
    said = proc.summary(result.stderr)
    failed = _read_file(work_fd, "failed-module", deadline)
    if failed is not None:
        module = os.fsdecode(failed)
        raise ModuleLoadFailed(module, f"module {module} failed to load: {said or 'Lmod said nothing'}")
    if result.returncode != 0 or _read_file(work_fd, "complete", deadline) is None:
        raise RestoreFailed(f"the restore helper exited {result.returncode}: {said or 'no message'}")
    return Report(_read_env(work_fd, "before.env", deadline), _read_env(work_fd, "after.env", deadline))


def _read_file(work_fd: int, name: str, deadline: Deadline):
    """The bytes of the report file ``name``, or None when there is none.

    Read with the step cache's trust rules: opened without following a link and without
    waiting for a writer (``O_NOFOLLOW | O_NONBLOCK``: a FIFO opens at once), and read only
    when ``fstat`` shows a regular file of the running uid with one link; anything else is
    RestoreFailed. Reading shares the decision's deadline (DeadlineExceeded).
    """
    if deadline.expired():
        raise DeadlineExceeded(f"the restore helper's report {name} not read after {deadline.seconds:g} s")
    try:
        fd = os.open(name, _REPORT_OPEN_FLAGS, dir_fd=work_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        # ELOOP: a symlink stands there, and O_NOFOLLOW refused it.
        raise RestoreFailed(f"the restore helper's report {name} cannot be opened: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RestoreFailed(f"the restore helper's report {name} is not a regular file")
        if info.st_uid != os.getuid():
            raise RestoreFailed(f"the restore helper's report {name} belongs to uid {info.st_uid}")
        if info.st_nlink != 1:
            raise RestoreFailed(f"the restore helper's report {name} has {info.st_nlink} links")
        chunks = []
        size = 0
        while True:
            if deadline.expired():
                raise DeadlineExceeded(
                    f"the restore helper's report {name} not read after {deadline.seconds:g} s"
                )
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > REPORT_MAX_BYTES:
                raise RestoreFailed(f"the restore helper's report {name} is over {REPORT_MAX_BYTES} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_env(work_fd: int, name: str, deadline: Deadline) -> dict:
    data = _read_file(work_fd, name, deadline)
    if data is None:
        raise RestoreFailed(f"the restore helper left no report {name}")
    records = data.split(b"\0")
    if records[-1] != b"":
        raise RestoreFailed(f"the restore helper's report {name} is truncated")
    env = {}
    for record in records[:-1]:
        name_part, sep, value = record.partition(b"=")
        if not sep or not name_part:
            raise RestoreFailed(f"the restore helper's report has a record without a name: {record[:40]!r}")
        env[os.fsdecode(name_part)] = os.fsdecode(value)
    return env
