"""A live tree built by the real EasyBuild, and the real ``eb-staged-rebuild`` to rebuild it.

``EbSite`` is one test's world, all under one directory owned by the build user (root, or the
unprivileged ``hpcstack-test`` through ``setpriv``): the live install (``apps/software`` and
``apps/modules``), the tool's state root, EasyBuild's own state, the generations of the tiny
packages (``tinypkgs``) and a link to this checkout's code. Everything the build user runs
(plain ``eb`` for the first install, the tool with ``--eb``, Lmod's ``module load``) runs as
that user, with EasyBuild's environment from ``stackenv.easybuild_env``: Lmod, Lua module
files, offline sources, and ``MODULEPATH`` = the live ``modules/all``.

Every process a site starts carries a token in its environment (``EBSITE_TOKEN``), so a test
can find and stop what a killed tool left running (``leftovers``/``stop_leftovers``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import checkout
import stackenv
import tinypkgs
from tests.support.staged import LiveLayout, snapshot
from tests.support.users import UnprivilegedUser

# A real build of both tiny packages takes seconds; EasyBuild's own bwrap mode, used alone,
# adds about 12 s of retries per package. This bounds one tool run or one plain eb run.
EB_RUN_TIMEOUT = 300
MODULE_TIMEOUT = 60
TOKEN_VARIABLE = "EBSITE_TOKEN"  # noqa: S105 - a variable name, not a secret
LIB = f"{tinypkgs.LIB}/{tinypkgs.VERSION}"
APP = f"{tinypkgs.APP}/{tinypkgs.VERSION}"
OWNERS = ("root", "user")


def failure_cases(backends):
    """``(backend, owner)`` for the failure-path tests: each backend as both owners, but bwrap
    as the build user only: the publish matrix runs it as both owners, and the unprivileged
    case is the one where bubblewrap needs a user namespace of its own."""
    return [
        (backend, owner) for backend in backends for owner in OWNERS if backend != "bwrap" or owner == "user"
    ]


class BuiltTrees:
    """The live trees plain ``eb`` built in this process, kept to be copied into later sites.

    A test that needs TinyLib built live by plain ``eb`` pays a real EasyBuild run (a second
    of CPU per package) only the first time a worker builds those packages, with those
    options, for that owner. The first site of each owner in a test has the same directory
    in every test of a worker (``home``; a test runs at a time in a worker), so a later
    site there gets a copy (``cp -a``: modes, owners, times, symlinks) of the ``apps`` and
    ``eb-state`` the first build left, which is exactly what it built in that very place.
    Only an install into a site where EasyBuild wrote nothing yet is copied (see
    ``EbSite.install``); a test's second install, or a second site's, is built.
    test_smoke_easybuild.py compares a copy with a real build.
    """

    TREES = ("apps", "eb-state")

    def __init__(self, store: Path) -> None:
        self.store = store
        self.kept: dict[tuple, Path] = {}
        # Where the first site of each owner is made in every test: a name as mkdtemp makes
        # them, chosen once per worker.
        self.homes: dict[str, Path] = {}
        for owner in OWNERS:
            home = Path(tempfile.mkdtemp(prefix=f"ebsite-{owner}-"))
            home.rmdir()
            self.homes[owner] = home

    def key(self, site: EbSite, packages: tinypkgs.TinyPackages, names, eb_args) -> tuple | None:
        """What decides the trees ``eb`` builds in ``site``; None where a copy cannot stand in."""
        if any(os.path.lexists(site.root / tree) for tree in self.TREES):
            return None  # a second install, or a test's own start: eb builds on what is there
        digest = hashlib.sha256()
        for directory in (packages.sources, packages.easyconfigs):
            if site.root not in directory.parents:
                return None
            digest.update(str(directory.relative_to(site.root)).encode() + b"\0")
            for path in sorted(directory.rglob("*")):
                if path.is_file():
                    digest.update(
                        str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0"
                    )
        # A file named in the options (a hook) is read by eb: the key holds its bytes too.
        files = [Path(arg.split("=", 1)[-1]) for arg in eb_args]
        for path in files:
            if path.is_file():
                digest.update(path.read_bytes())
        return (str(site.root), site.uid, tuple(names), tuple(eb_args), digest.hexdigest())

    def keep(self, key: tuple, site: EbSite) -> None:
        kept = self.store / str(len(self.kept))
        kept.mkdir()
        for tree in self.TREES:
            if os.path.lexists(site.root / tree):
                subprocess.run(["cp", "-a", str(site.root / tree), str(kept / tree)], check=True)
        self.kept[key] = kept

    def copy_into(self, key: tuple, site: EbSite) -> bool:
        """Put the kept trees of ``key`` into ``site``; False when there are none."""
        kept = self.kept.get(key)
        if kept is None:
            return False
        for tree in self.TREES:
            if os.path.lexists(kept / tree):
                subprocess.run(["cp", "-a", str(kept / tree), str(site.root / tree)], check=True)
        return True


@dataclass
class EbSite(LiveLayout):
    """One test's live EasyBuild tree, its state root, and the build user who owns both."""

    root: Path
    user: UnprivilegedUser | None  # None: everything runs as root
    lmod: stackenv.Lmod
    eb: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    built: BuiltTrees | None = None

    # --- where things are ---------------------------------------------------------------

    @property
    def installpath(self) -> Path:
        return self.root / "apps"

    @property
    def state_root(self) -> Path:
        return self.root / "state"

    @property
    def package_root(self) -> Path:
        return self.root / "pkg"

    @property
    def uid(self) -> int:
        return 0 if self.user is None else self.user.uid

    def class_link(self, module: str, module_class: str = "tools") -> Path:
        return self.modules / module_class / (module + ".lua")

    def generation(self, run_id: str) -> Path:
        return self.software / ".eb-staged-rebuild" / run_id

    def build_log(self, run_id: str) -> Path:
        return self.state_root / "runs" / run_id / "build.log"

    def journals(self) -> list[Path]:
        runs = self.state_root / "runs"
        return sorted(runs.glob("*/journal.json")) if runs.is_dir() else []

    def scratch(self, name: str) -> Path:
        """A new directory owned by the build user, outside the live trees."""
        path = self.root / name
        path.mkdir()
        self.give(path)
        return path

    def give(self, path: Path) -> None:
        """Hand ``path`` (recursively) to the build user."""
        if self.user is None:
            return
        os.lchown(path, self.user.uid, self.user.gid)
        # os.walk does not descend into symlinked directories (pkg/hpcstack_ops is one).
        for directory, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(directory, name), self.user.uid, self.user.gid)

    # --- packages and environments ------------------------------------------------------

    def write_packages(self, label: str, greeting: str = tinypkgs.GREETING) -> tinypkgs.TinyPackages:
        """A generation of TinyLib/TinyApp (own sources and easyconfigs, owned by the build user)."""
        packages = tinypkgs.write_packages(self.root / label, greeting=greeting)
        self.give(self.root / label)
        return packages

    def write_binary_package(self, label: str) -> tinypkgs.TinyPackages:
        packages = tinypkgs.write_binary_package(self.root / label)
        self.give(self.root / label)
        return packages

    def base_env(self) -> dict:
        """A clean login-like environment for the build user (nothing of pytest's own)."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "HOME": str(self.root / "home"),
            "USER": "root" if self.user is None else self.user.name,
            "LOGNAME": "root" if self.user is None else self.user.name,
            "TMPDIR": str(self.root / "tmp"),
        }
        env[TOKEN_VARIABLE] = self.token
        return env

    def eb_env(self, packages: tinypkgs.TinyPackages | None, **extra) -> dict:
        """EasyBuild's environment for ``packages`` into the live tree (also the tool's).

        ``extra`` is applied last; a value of None removes that variable.
        """
        env = stackenv.easybuild_env(
            self.lmod,
            prefix=self.root / "eb-state",
            installpath=self.installpath,
            sources=packages.sources if packages else self.root / "no-sources",
            easyconfigs=packages.easyconfigs if packages else self.root / "no-easyconfigs",
            base=self.base_env(),
        )
        if self.user is not None:
            env.pop("EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES", None)
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    def tool_env(self, packages: tinypkgs.TinyPackages | None, **extra) -> dict:
        env = self.eb_env(packages, **extra)
        env["PYTHONPATH"] = str(self.package_root)
        return env

    def as_owner(self, argv: list[str]) -> list[str]:
        return list(argv) if self.user is None else self.user.command(list(argv))

    def run_as_owner(self, argv, env, timeout) -> subprocess.CompletedProcess:
        """Run ``argv`` as the site's owner in its root, no input, output captured as text."""
        return subprocess.run(
            self.as_owner(argv),
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # --- plain EasyBuild: the live tree before any staged rebuild -----------------------

    def install(self, packages: tinypkgs.TinyPackages, *names: str, eb_args=()) -> None:
        """Build ``names`` (with their dependencies) straight into the live tree with plain ``eb``
        (or copy what it built for the same packages in an earlier site: ``BuiltTrees``)."""
        key = self.built.key(self, packages, names, eb_args) if self.built is not None else None
        if key is not None and self.built.copy_into(key, self):
            return
        easyconfigs = [str(packages.easyconfig(name)) for name in names]
        argv = [str(self.eb), "--robot", *eb_args, *easyconfigs]
        done = self.run_as_owner(argv, self.eb_env(packages), EB_RUN_TIMEOUT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if key is not None:
            self.built.keep(key, self)

    # --- the tool -----------------------------------------------------------------------

    def tool_command(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hpcstack_ops.staged_rebuild.cli",
            "--state-root",
            str(self.state_root),
            *args,
        ]

    def run_tool(self, *args: str, packages, env=None, timeout=EB_RUN_TIMEOUT) -> subprocess.CompletedProcess:
        """Run ``eb-staged-rebuild --state-root <root> ARGS`` as the build user; never raises.

        ``env``: variables on top of EasyBuild's environment (None removes one).
        """
        return self.run_as_owner(self.tool_command(*args), self.tool_env(packages, **(env or {})), timeout)

    def popen_tool(self, *args: str, packages, env=None) -> subprocess.Popen:
        """Start the tool as the build user; the caller signals, waits and closes it."""
        return subprocess.Popen(
            self.as_owner(self.tool_command(*args)),
            cwd=self.root,
            env=self.tool_env(packages, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def rebuild_args(  # noqa: PLR0917 - mirrors the command line's parts
        self, modules, packages, backend=None, eb_args=(), extra=(), json_output=True
    ) -> list[str]:
        """``[--json] rebuild --installpath .. --module M.. --eb EB [--backend B] EXTRA -- EB-ARGS ECS``.

        The easyconfigs are those of ``packages`` for each module, as absolute paths.
        """
        args = ["--json"] if json_output else []
        args += ["rebuild", f"--installpath={self.installpath}", f"--eb={self.eb}"]
        for module in modules:
            args += ["--module", module]
        if backend is not None:
            args += ["--backend", backend]
        easyconfigs = [str(packages.easyconfig(*module.split("/"))) for module in modules]
        return [*args, *extra, "--", *eb_args, *easyconfigs]

    def rebuild(  # noqa: PLR0917 - mirrors the command line's parts
        self, modules, packages, backend=None, eb_args=(), extra=(), env=None, json_output=True
    ):
        return self.run_tool(
            *self.rebuild_args(modules, packages, backend, eb_args, extra, json_output),
            packages=packages,
            env=env,
        )

    # --- what users see -----------------------------------------------------------------

    def module_shell(self, script: str) -> subprocess.CompletedProcess:
        """``bash -c SCRIPT`` as the build user, with ``module`` and MODULEPATH = the live ``modules/all``."""
        env = self.lmod.env([self.modules_all], base=self.base_env())
        return self.run_as_owner(self.lmod.shell_command(script), env, MODULE_TIMEOUT)

    def snapshot(self) -> dict:
        """Type, mode, owner, inode and bytes of everything in the live trees."""
        return snapshot(self.software, self.modules)

    @staticmethod
    def snapshot_of(*paths: Path) -> dict:
        """The same record for some entries only (a live directory, a module file, a link)."""
        return snapshot(*paths)

    # --- leftovers of a killed tool -----------------------------------------------------

    def leftovers(self) -> list[int]:
        """Pids of live processes started by this site (their environment has the token)."""
        needle = f"{TOKEN_VARIABLE}={self.token}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue  # gone already, or a kernel thread
        return found

    def wait_until_gone(self, timeout: float) -> list[int]:
        """Wait until no process of this site runs any more; those still running at the end."""
        deadline = time.monotonic() + timeout
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.leftovers()

    def stop_leftovers(self, wait=10.0) -> list[int]:
        """SIGKILL every process of this site still running; return the pids it found."""
        pids = self.leftovers()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.wait_until_gone(wait)
        return pids


def grep_bytes(needle: bytes, *roots: Path) -> list[str]:
    """``grep -r``: every file (and symlink target) under ``roots`` that contains ``needle``.

    Symlinks are read, never followed.
    """
    hits = []
    for root in roots:
        if not os.path.lexists(root):
            continue
        entries = [Path(root)]
        if root.is_dir() and not root.is_symlink():
            for directory, dirs, files in os.walk(root):
                entries.extend(Path(directory, name) for name in dirs + files)
        for path in entries:
            if path.is_symlink():
                if needle in os.fsencode(os.readlink(path)):
                    hits.append(str(path))
            elif path.is_file() and needle in path.read_bytes():
                hits.append(str(path))
    return hits


def result_json(done: subprocess.CompletedProcess) -> dict:
    """The ``--json`` result of a successful run; fails the test with the tool's output otherwise."""
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-5000:])
    return json.loads(done.stdout)


def wait_for(path: Path, proc: subprocess.Popen, timeout=EB_RUN_TIMEOUT) -> None:
    """Wait until ``path`` exists; fail if ``proc`` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"the tool ended (exit {proc.returncode}) before {path} appeared: {out[-2000:]}{err[-3000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)


def _site_directory(home: Path, taken: list[Path]) -> Path:
    """``home`` when this test has no site there and it is free (the last test's was removed),
    else a new temporary directory: private to root until the site is handed to its owner."""
    if home not in taken:
        try:
            home.mkdir(mode=0o700)
            return home
        except FileExistsError:
            pass
    return Path(tempfile.mkdtemp(prefix=home.name.rsplit("-", 1)[0] + "-"))


@pytest.fixture(scope="session")
def built_trees(tmp_path_factory):
    """The live trees plain ``eb`` built in this worker (``BuiltTrees``)."""
    return BuiltTrees(tmp_path_factory.mktemp("built-trees"))


@pytest.fixture
def eb_site_factory(lmod, unprivileged_user, built_trees):
    """``make(owner)``: a fresh ``EbSite`` owned by ``"root"`` or ``"user"`` (the unprivileged user).

    The site's directory is a private temporary directory handed to its owner; it holds a link
    to this checkout's code (``pkg/hpcstack_ops``) readable by that user. Removed afterwards,
    after any process the site started and left running was stopped.
    """
    try:
        eb = stackenv.find_eb()
    except stackenv.StackError as err:
        pytest.fail(str(err))
    sites = []

    def make(owner: str) -> EbSite:
        assert owner in OWNERS, owner
        user = unprivileged_user if owner == "user" else None
        root = _site_directory(built_trees.homes[owner], [site.root for site in sites])
        site = EbSite(root=root, user=user, lmod=lmod, eb=eb, built=built_trees)
        for name in ("home", "tmp"):
            (root / name).mkdir()
        checkout.link_package(site.package_root)
        site.give(root)
        sites.append(site)
        return site

    yield make
    for site in sites:
        site.stop_leftovers()
        shutil.rmtree(site.root, ignore_errors=True)
