# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What eessi-arch-guard sees on one node: the per-node half of a fleet report.

For each EESSI version it runs the guard's own steps 3 and 4 (``archdetect.detect`` and
``archdetect.select_target``) in the environment a job would have here once that version's
EESSI is loaded, so the target and the token it reports are the ones the guard would reach:
``no-software-dir``, ``archdetect-failed`` or, when archdetect outlives the deadline,
``timeout``. Beside that: whether the arch_guard role's install is there and whole, the Lmod
a reload would use, and the directory the guard would put its cache and work directories in.

The job's environment is built, not inherited: the process that asks (an Ansible module, run
by root over ssh) has an environment no job has, and an ``EESSI_SOFTWARE_SUBDIR_OVERRIDE`` in
an administrator's login would make archdetect answer for a CPU the node does not have. It
holds a system ``PATH``, the version's ``EESSI_PREFIX``, the job's ``TMPDIR`` when given,
and only what the caller passes on top (``job_env``).

Only reads; nothing is written on the node. archdetect's children run in their own sessions,
are killed at the deadline, and SIGTERM ends them too (``deadline.SigtermScope``).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Optional

from ..common import errors
from ..common.deadline import Deadline, DeadlineExceeded, SigtermScope, raise_on_sigterm
from . import archdetect, decide, installed, restore, settings
from .decision import ARCHDETECT_FAILED, NO_SOFTWARE_DIR, TIMEOUT

DEFAULT_EESSI_ROOT = "/cvmfs/software.eessi.io"
# Where the arch_guard role installs the guard (its arch_guard_prefix).
DEFAULT_GUARD_PREFIX = installed.DEFAULT_PREFIX
# A job's PATH before any module: the system's directories, where a node's nvidia-smi is.
DEFAULT_JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
DEFAULT_TIMEOUT_SECONDS = settings.DEFAULT_TIMEOUT_SECONDS

# Lmod's usual homes: the distributions' package (Debian, Ubuntu, EL, SUSE link the versioned
# directory as .../lmod/lmod), and Lmod's own default install prefix /opt/apps. The first
# executable one wins; patterns expand in sorted order.
LMOD_LOCATIONS = (
    "/usr/share/lmod/lmod/libexec/lmod",
    "/opt/apps/lmod/lmod/libexec/lmod",
    "/usr/share/lmod/*/libexec/lmod",
    "/opt/apps/lmod/*/libexec/lmod",
)

# A version is one directory name under <eessi_root>/versions.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Set by this module for each version (EESSI_PREFIX) or by an option of its own (TMPDIR).
_RESERVED = {"EESSI_PREFIX": "it is each version's prefix", "TMPDIR": "give the job's TMPDIR as tmpdir"}


class NodeInfoError(errors.UsageError):
    """An option refused before anything runs; ``str(err)`` is the one-line message."""


def node_report(
    *,
    eessi_root=DEFAULT_EESSI_ROOT,
    versions=None,
    prefix=DEFAULT_GUARD_PREFIX,
    lmod_cmd=None,
    tmpdir=None,
    job_env=None,
    timeout=DEFAULT_TIMEOUT_SECONDS,
    environ=None,
) -> dict:
    """The report for this node (see the module's RETURN); raises NodeInfoError on bad options.

    ``versions`` None or empty: every version directory under ``eessi_root``. ``environ``
    (default ``os.environ``) is where ``LMOD_CMD`` is looked up when ``lmod_cmd`` is None.
    ``timeout`` bounds each version's archdetect runs, as the guard's deadline bounds a task's.
    An empty ``lmod_cmd`` or ``tmpdir`` is one not given (a template's empty default).
    """
    lmod_cmd, tmpdir = lmod_cmd or None, tmpdir or None
    extra = check_options(
        eessi_root=eessi_root,
        versions=versions,
        prefix=prefix,
        lmod_cmd=lmod_cmd,
        tmpdir=tmpdir,
        job_env=job_env,
        timeout=timeout,
    )
    eessi_root, prefix = os.path.normpath(eessi_root), os.path.normpath(prefix)
    environ = os.environ if environ is None else environ
    available = find_versions(eessi_root)
    wanted = _unique(versions) if versions else available
    with SigtermScope():
        raise_on_sigterm()
        reports = [
            version_report(eessi_root, version, job_environment(eessi_root, version, tmpdir, extra), timeout)
            for version in wanted
        ]
    return {
        "changed": False,
        "node": node_name(),
        "eessi_root": eessi_root,
        "available_versions": available,
        "eessi": reports,
        "targets": {report["version"]: report["target"] for report in reports},
        "problems": {report["version"]: report["problem"] for report in reports if report["problem"]},
        "guard": guard_install(prefix),
        "lmod": lmod_report(lmod_cmd, environ),
        "tmpdir": tmpdir,
        "cache_dir": settings.scratch_dir({"TMPDIR": tmpdir} if tmpdir else {}),
    }


def check_options(*, eessi_root, versions, prefix, lmod_cmd, tmpdir, job_env, timeout) -> dict:
    """Refuse what cannot name a place on the node or a job's variable; returns ``job_env`` as str."""
    for name, path in (
        ("eessi_root", eessi_root),
        ("prefix", prefix),
        ("lmod_cmd", lmod_cmd),
        ("tmpdir", tmpdir),
    ):
        if path is not None and not os.path.isabs(path):
            raise NodeInfoError(f"{name} must be an absolute path, not {path!r}")
    for version in versions or ():
        if not isinstance(version, str) or not _VERSION.match(version):
            raise NodeInfoError(f"versions: {version!r} is not the name of a directory under versions/")
    if not 0 < timeout <= settings.MAX_TIMEOUT_SECONDS:
        raise NodeInfoError(
            f"timeout must be more than 0 and at most {settings.MAX_TIMEOUT_SECONDS:g} seconds"
        )
    extra = {}
    for name, value in (job_env or {}).items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise NodeInfoError(f"job_env: {name!r} is not a variable name")
        if name in _RESERVED:
            raise NodeInfoError(f"job_env must not set {name}: {_RESERVED[name]}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise NodeInfoError(f"job_env: {name} must be a string, not {type(value).__name__}")
        text = str(value)
        if "\0" in text:
            raise NodeInfoError(f"job_env: {name} contains a NUL byte")
        extra[name] = text
    return extra


def find_versions(eessi_root) -> list:
    """The version directories under ``<eessi_root>/versions``, sorted; none when it is not there."""
    versions_dir = os.path.join(eessi_root, "versions")
    try:
        names = os.listdir(versions_dir)
    except OSError:
        return []
    return sorted(
        name for name in names if _VERSION.match(name) and os.path.isdir(os.path.join(versions_dir, name))
    )


def job_environment(eessi_root, version, tmpdir, extra) -> dict:
    """What a job here has once EESSI ``version`` is loaded, as far as archdetect and the guard read it."""
    env = {"PATH": DEFAULT_JOB_PATH, "EESSI_PREFIX": os.path.join(eessi_root, "versions", version)}
    if tmpdir:
        env["TMPDIR"] = tmpdir
    env.update(extra)
    return env


def version_report(eessi_root, version, env, timeout) -> dict:
    """The guard's view of one version: archdetect's answer, the target, the token if any."""
    eessi_prefix = env["EESSI_PREFIX"]
    report = {
        "version": version,
        "prefix": eessi_prefix,
        "prefix_exists": os.path.isdir(eessi_prefix),
        "archdetect": _script(env),
        "cpupath": None,
        "accelpath": None,
        "target": None,
        "accel": None,
        "software_dir": None,
        "software_dir_exists": False,
        "problem": None,
        "detail": None,
    }
    try:
        detection = archdetect.detect(env, Deadline(timeout))
    except archdetect.ArchdetectFailed as err:
        return dict(report, problem=ARCHDETECT_FAILED, detail=str(err))
    except DeadlineExceeded as err:
        return dict(report, problem=TIMEOUT, detail=str(err))
    report.update(cpupath=list(detection.candidates), accelpath=detection.accel)
    target = archdetect.select_target(detection.candidates, eessi_prefix)
    if target is None:
        # The directory EESSI would have wanted: the most specific candidate's.
        return dict(
            report,
            software_dir=_software_dir(eessi_prefix, detection.candidates[0]),
            problem=NO_SOFTWARE_DIR,
            detail=decide.no_software_detail(detection.candidates, eessi_prefix),
        )
    software_dir = _software_dir(eessi_prefix, target)
    report.update(
        target=target,
        accel=detection.accel,
        software_dir=software_dir,
        software_dir_exists=os.path.isdir(software_dir),
    )
    return report


def guard_install(prefix) -> dict:
    """The arch_guard role's install under ``prefix``: whole (``installed``), absent, or what is wrong.

    Nothing there at all is ``installed: false`` with no problem; a part missing, or a
    release.json that cannot be read, is ``installed: false`` with the problem in one line.
    """
    report = {
        "prefix": prefix,
        "installed": False,
        "version": None,
        "digest": None,
        "python": None,
        "launcher": None,
        "code": None,
        "problem": None,
    }
    release_path = os.path.join(prefix, installed.RELEASE_FILE)
    launcher = os.path.join(prefix, installed.LAUNCHER)
    code = os.path.join(prefix, installed.CODE_DIR)
    parts = (release_path, launcher, os.path.join(prefix, installed.LIB))
    if not any(os.path.lexists(path) for path in parts):
        return report
    if _is_executable(launcher):
        report["launcher"] = launcher
    if os.path.isdir(code):
        report["code"] = code
    try:
        release = installed.read_release(release_path)
    except installed.ReleaseError as err:
        return dict(report, problem=str(err))
    report.update({key: release[key] for key in ("version", "digest", "python")})
    if report["code"] is None:
        problem = f"the guard's code is not in {code}"
    elif report["launcher"] is None:
        problem = f"the launcher {launcher} is not an executable file"
    elif not _is_executable(release["python"]):
        problem = (
            f"the guard's interpreter {release['python']} (from {release_path}) is not an executable file"
        )
    else:
        return dict(report, installed=True)
    return dict(report, problem=problem)


def lmod_report(lmod_cmd, environ) -> dict:
    """The Lmod a reload would run: the option, else ``LMOD_CMD``, else the first usual location."""
    command: Optional[str]
    source: Optional[str]
    if lmod_cmd:
        command, source = lmod_cmd, "option"
    elif environ.get("LMOD_CMD"):
        command, source = environ["LMOD_CMD"], "environment"
    else:
        command = next((path for path in _lmod_candidates() if _is_executable(path)), None)
        source = "search" if command else None
    # The guard's own test of $LMOD_CMD (step 7, lmod-unavailable when it fails).
    executable = command is not None and restore.lmod_command({"LMOD_CMD": command}) is not None
    return {"cmd": command, "executable": executable, "source": source}


def node_name() -> str:
    """The host name without its domain, as a fleet report lists nodes."""
    return os.uname().nodename.split(".", 1)[0]


def _lmod_candidates():
    for location in LMOD_LOCATIONS:
        if "*" in location:
            yield from sorted(glob.glob(location))
        else:
            yield location


def _script(env):
    try:
        return archdetect.find_script(env)
    except archdetect.ArchdetectFailed:
        return None


def _software_dir(eessi_prefix, target) -> str:
    return os.path.join(eessi_prefix, "software", "linux", target, "software")


def _is_executable(path) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _unique(names) -> list:
    return list(dict.fromkeys(names))
