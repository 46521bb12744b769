# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether slurmd runs configless on this node (``--conf-server``): then it reads the
controller's slurm.conf, not its own, and the role's layout decision follows.

A name and a command line prove nothing: any user can start a script called ``slurmd`` with
``--conf-server`` in its arguments, and would then stop every rollout (or change the layout).
A process counts only when it is root's, or SlurmdUser's, by its real and its effective uid
(which no other user can take), and ``/proc/PID/exe``, the file the kernel runs it from, is
a slurmd binary: root's, writable by nobody else, and named ``slurmd`` or as the file that
``slurmd`` in the system's directories resolves to (Debian's ``/usr/sbin/slurmd`` is a link
to ``slurmd-wlm``). A user who runs the real binary is not root; a root process that runs a
script named slurmd runs its interpreter, not slurmd.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from typing import Iterable, Optional

from ..common import dirfd, errors

PROC = "/proc"
NAME = "slurmd"
CONF_SERVER = "--conf-server"
_STATUS_MAX_BYTES = 64 * 1024
_CMDLINE_MAX_BYTES = 256 * 1024
_DELETED = " (deleted)"  # what /proc/PID/exe says of a binary replaced since it started
# Where a distribution's package puts slurmd: root's directories, not the caller's PATH.
SEARCH_PATH = ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin", "/bin")


def binary_names(search_path: Iterable[str] = SEARCH_PATH) -> frozenset:
    """The names /proc/PID/exe may give a slurmd binary here: ``slurmd``, and the name of the
    file each ``slurmd`` of ``search_path`` resolves to."""
    names = {NAME}
    for folder in search_path:
        candidate = os.path.join(folder, NAME)
        if os.path.lexists(candidate):
            names.add(os.path.basename(os.path.realpath(candidate)))
    return frozenset(names)


def _program(exe: str) -> str:
    """The file name of ``exe`` as /proc/PID/exe gives it, without " (deleted)"."""
    return os.path.basename(exe[: -len(_DELETED)] if exe.endswith(_DELETED) else exe)


def counts(process: dict, allowed_uids: Iterable[int], names: Iterable[str] = (NAME,)) -> bool:
    """Whether ``process`` (``{"uids": (real, effective), "exe": path, "exe_uid",
    "exe_mode", "argv": [...]}``) is a configless slurmd of ``allowed_uids``, its binary
    named one of ``names`` (``binary_names``)."""
    allowed = set(allowed_uids)
    return (
        set(process["uids"]) <= allowed
        and _program(process["exe"]) in set(names)
        and process["exe_uid"] == 0
        and not process["exe_mode"] & (stat.S_IWGRP | stat.S_IWOTH)
        and any(arg == CONF_SERVER or arg.startswith(CONF_SERVER + "=") for arg in process["argv"][1:])
    )


def allowed_uids(slurmd_user: Optional[str]) -> list:
    """root, and SlurmdUser's uid when slurm.conf names another (a name or a number)."""
    uids = [0]
    if slurmd_user:
        # A name that is no user here: nothing runs as it.
        with contextlib.suppress(KeyError):
            uids.append(int(slurmd_user) if slurmd_user.isdigit() else pwd.getpwnam(slurmd_user).pw_uid)
    return list(dict.fromkeys(uids))


def _process(pid: str, proc: str, names: frozenset) -> Optional[dict]:
    """What counts needs of ``pid``, or None when it is gone or runs no file named as slurmd."""
    base = os.path.join(proc, pid)
    try:
        exe = os.readlink(os.path.join(base, "exe"))
        if _program(exe) not in names:
            return None
        binary = os.stat(os.path.join(base, "exe"))  # the file it runs, even one since replaced
        status = dirfd.read_regular(os.path.join(base, "status"), "", limit=_STATUS_MAX_BYTES)
        cmdline = dirfd.read_regular(os.path.join(base, "cmdline"), "", limit=_CMDLINE_MAX_BYTES)
    except (OSError, errors.UsageError):
        return None  # ended meanwhile, or a kernel thread: no slurmd of ours
    # "Uid:\treal\teffective\tsaved\tfilesystem"
    lines = status.decode("ascii", "replace").splitlines()
    uids = next((line.split()[1:3] for line in lines if line.startswith("Uid:")), None)
    if not uids:
        return None
    return {
        "pid": int(pid),
        "uids": [int(uid) for uid in uids],
        "exe": exe,
        "exe_uid": binary.st_uid,
        "exe_mode": stat.S_IMODE(binary.st_mode),
        "argv": [os.fsdecode(arg) for arg in cmdline.split(b"\0")[:-1]],
    }


def configless_pids(
    slurmd_user: Optional[str] = None, proc: str = PROC, search_path: Iterable[str] = SEARCH_PATH
) -> list:
    """The pids of the configless slurmd processes of this node, as ``counts`` decides."""
    allowed = allowed_uids(slurmd_user)
    names = binary_names(search_path)
    found = []
    for pid in sorted((name for name in os.listdir(proc) if name.isdigit()), key=int):
        process = _process(pid, proc, names)
        if process is not None and counts(process, allowed, names):
            found.append(process["pid"])
    return found
