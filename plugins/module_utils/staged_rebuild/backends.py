# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the build runs, so that EasyBuild cannot touch the live install.

``bwrap``: EasyBuild's own bubblewrap mode, with the run's generation directory as its
bubblewrap install path, and the live software and module trees bind-mounted read-only.
``userns``: a private mount namespace (``sandbox``) with the live trees read-only and each
stage at its live ``Name/version`` path. ``installpath``: EasyBuild builds into separate trees
in the generation directory, with no kernel sandbox; the stage path is rewritten afterwards.
``auto`` takes the first of these whose probe succeeds, in that order.

Both sandboxes show the stage at its live path the same way: the live ``<software>/<Name>`` is
covered by a view (``sandbox.make_view``) that holds the stage as a plain directory and the
other live entries bind-mounted read-only, so that EasyBuild's ``--rebuild`` removes an
ordinary directory, not a mount point (which fails with EBUSY and makes EasyBuild retry,
sleeping 2 s each time, then empty it instead).

EasyBuild's bubblewrap mode runs in two passes: an unsandboxed first pass resolves the
easyconfigs, creates ``<software path>/Name/version`` and writes ``bwrap_info.json``; then it
runs itself again under ``bwrap`` with each stage bind-mounted onto that directory. The first
pass is given ``<generation>/first-pass/software`` as its software path (through
``$EASYBUILD_INSTALLPATH_SOFTWARE``, which the sandbox sets back to the live tree for the
second pass): so it creates nothing in the live tree, and its own binds land out of the way
of the build, which finds the view at the live path.

Every backend leaves, for each module, the install in ``<generation>/software/Name/version``
and the module file in ``<generation>/modules/all/Name/version.lua`` (``version`` for Tcl): the
planner takes them from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ..common import errors, proc
from ..common.deadline import Deadline, DeadlineExceeded
from ..common.errors import setting
from . import bwrapinfo, easybuild, naming, sandbox
from . import syntax as module_syntax

# Where a run names none, the site's choice in EB_STAGED_REBUILD_BACKEND (``settings``: the
# build_host role writes it into the command), else auto.
BACKENDS = ("auto", "bwrap", "userns", "installpath")
SANDBOXED = ("bwrap", "userns")  # also the order in which auto tries them
UNSANDBOXED = (
    "eb-staged-rebuild: warning: backend installpath: EasyBuild runs WITHOUT a sandbox; "
    "a hook that writes outside its install path is not contained (--backend bwrap|userns requires one)"
)
_PROBE_TIMEOUT = 30
BWRAP_PROBE = ("bwrap", "--dev-bind", "/", "/", "true")


def probe_bwrap() -> bool:
    """Does bubblewrap run here, for this user (``bwrap --dev-bind / / true``)?"""
    try:
        done = proc.run_child(BWRAP_PROBE, env=None, deadline=Deadline(_PROBE_TIMEOUT))
    except (OSError, DeadlineExceeded):
        return False
    return done.returncode == 0


def probe_userns() -> bool:
    """Can this user make the userns backend's sandbox: a read-only bind whose write fails with EROFS?"""
    scratch = tempfile.mkdtemp(prefix="eb-staged-rebuild-userns-")
    spec = {"read_only": [scratch], "writable": [], "views": [], "probe": [scratch]}
    try:
        done = proc.run_child(
            [shutil.which("true", path=os.defpath) or "/bin/true"],
            env=None,
            deadline=Deadline(_PROBE_TIMEOUT),
            preexec=lambda: sandbox.enter(spec),  # the tool runs one thread
        )
    except (OSError, subprocess.SubprocessError, DeadlineExceeded):
        # SubprocessError: the sandbox's set-up raised in the child, before exec.
        return False
    finally:
        os.rmdir(scratch)
    return done.returncode == 0


_PROBES = {"bwrap": probe_bwrap, "userns": probe_userns}
_REFUSALS = {
    "bwrap": f"{setting('backend')} bwrap: 'bwrap --dev-bind / / true' fails for this user; "
    f"try {setting('backend')} userns (eb-staged-rebuild probe --path DIR tells what works)",
    "userns": f"{setting('backend')} userns: this user cannot make a user and mount namespace "
    "(user.max_user_namespaces, or a policy); eb-staged-rebuild probe --path DIR tells what works",
}


def select(requested, probed=None):
    """The backend a run uses: ``requested`` itself after its probe, or ``auto``'s first working one.

    ``probed`` holds results already known (``{"bwrap": bool, "userns": bool}``); a probe not
    in it runs only when the choice needs it, so ``auto`` on a host with bubblewrap never
    makes a namespace. ``requested`` is one of BACKENDS (the request checked it).
    """
    probed = dict(probed or {})

    def works(backend):
        if backend not in probed:
            probed[backend] = _PROBES[backend]()
        return probed[backend]

    if requested == "auto":
        return next((backend for backend in SANDBOXED if works(backend)), "installpath")
    if requested in SANDBOXED and not works(requested):
        raise errors.UsageError(_REFUSALS[requested])
    return requested


def auto_choice(bwrap_works, userns_works):
    """What ``auto`` picks, given the two probes."""
    return select("auto", {"bwrap": bwrap_works, "userns": userns_works})


_SOFTWARE_VARIABLE = "EASYBUILD_INSTALLPATH_SOFTWARE"


class Build:
    """One run's build: which backend, which modules, and the trees they go to."""

    def __init__(self, backend, trees, generation, modules, syntax=module_syntax.LUA, order=()):  # noqa: PLR0917
        self.backend = backend
        self.trees = trees
        self.generation = generation
        self.modules = modules  # [(Name, version of the install directory, module name)]
        self.syntax = syntax  # the module syntax of the live module files (``syntax``)
        self.order = list(order)  # the modules as "Name/version", dependencies first

    @property
    def first_pass_software(self):
        """The software path of the bwrap backend's unsandboxed first pass (module docstring)."""
        return os.path.join(self.generation, "first-pass", "software")

    @property
    def stage_software(self):
        return os.path.join(self.generation, "software")

    @property
    def stage_modules(self):
        return os.path.join(self.generation, "modules")

    @property
    def locks_dir(self):
        return os.path.join(self.stage_software, ".locks")

    def placement_args(self):
        """The options that decide where and how EasyBuild writes, after the user's own: the
        live module files' syntax, then the install paths."""
        # Every install path explicitly, data included: what is not given, EasyBuild derives
        # from the site's --prefix (kept, for its sources and build paths), a live path.
        data = ["--installpath-data=" + os.path.join(self.generation, "data")]
        return (
            module_syntax.placement(self.syntax) + data + self._neutral_settings() + self._install_placement()
        )

    def _neutral_settings(self):
        """EasyBuild's defaults, explicitly, for the settings that would make it write or remove
        elsewhere than the stage. The user's options for them are removed
        (``easybuild.filter_args``), but a configuration file may set them too, and an option
        beats the file: module files under another suffix than ``all`` (not where the live ones
        are), EasyBuild's own bubblewrap mode around another backend's sandbox, and the removal
        of install directories that have no module file."""
        neutral = ["--suffix-modules-path=all", "--disable-remove-ghost-install-dirs"]
        if self.backend != "bwrap":
            neutral.append("--disable-bwrap")  # the bwrap backend turns it on itself, below
        return neutral

    def _install_placement(self):
        if self.backend == "installpath":
            return [
                "--installpath-software=" + self.stage_software,
                "--installpath-modules=" + self.stage_modules,
            ]
        if self.backend == "userns":
            # The live software path, where the sandbox shows the stage; modules and locks to the stage.
            return [
                "--installpath-software=" + self.trees.software,
                "--installpath-modules=" + self.stage_modules,
                "--locks-dir=" + self.locks_dir,
            ]
        read_only = [self.trees.software, self.trees.modules]
        for path in (*read_only, self.generation):
            if "," in path:
                raise errors.UsageError(
                    f"{setting('backend')} bwrap: {path} contains a comma, "
                    "which EasyBuild's --bwrap-options cannot carry"
                )
        bwrap_options = []
        for path in read_only:
            bwrap_options += ["--ro-bind", path, path]
        bwrap_options += ["--bind", self.generation, self.generation]
        for view_dir, live_name_dir, versions in self._views():
            bwrap_options += ["--bind", view_dir, live_name_dir]
            # bwrap takes each source from the host's tree, so this is the live sibling,
            # mounted onto its placeholder in the view.
            for sibling in sandbox.view_siblings(live_name_dir, versions):
                live_sibling = os.path.join(live_name_dir, sibling)
                bwrap_options += ["--ro-bind", live_sibling, live_sibling]
        bwrap_options += ["--setenv", _SOFTWARE_VARIABLE, self.trees.software]
        # The tool's own death kills EasyBuild's first pass; this carries it on to the second.
        bwrap_options.append("--die-with-parent")
        return [
            "--installpath-modules=" + self.trees.modules,
            "--locks-dir=" + self.locks_dir,
            "--experimental",
            "--bwrap",
            "--bwrap-installpath=" + self.generation,
            "--bwrap-options=" + ",".join(bwrap_options),
        ]

    def _views(self):
        """``(view_dir, live_name_dir, staged versions)`` for each ``Name`` the run builds."""
        views = []
        for name in sorted({name for name, _version, _module in self.modules}):
            versions = [version for install_name, version, _module in self.modules if install_name == name]
            views.append(
                (os.path.join(self.stage_software, name), os.path.join(self.trees.software, name), versions)
            )
        return views

    def command(self, eb, user_args):
        return easybuild.command(eb, user_args, self.placement_args(), self.order)

    def environment(self, base, eb):
        env = easybuild.with_own_python(easybuild.filter_env(base), eb)
        env["MODULEPATH"] = self.module_path(env.get("MODULEPATH", ""))
        if self.backend == "bwrap":
            # EasyBuild re-runs itself under bwrap as "python -m easybuild.main": the python next
            # to the eb it was started as, as far as PATH can say so.
            env["PATH"] = os.path.dirname(eb) + os.pathsep + env.get("PATH", os.defpath)
            env[_SOFTWARE_VARIABLE] = self.first_pass_software
        return env

    def module_path(self, given):
        """``MODULEPATH`` with the live ``<modules>/all`` first, where plain ``eb`` puts it.

        EasyBuild prepends its module install path's ``all`` to ``MODULEPATH`` and resolves the
        toolchain and dependency modules there (a hierarchical scheme by their full names,
        ``Core/GCC/6.4.0-2.28``, and by their short names from the hierarchy's ``all/Core``,
        which it adds too, but not in the second pass of its bwrap mode). Under userns and
        installpath that install path is the stage's, which holds only what the run builds:
        the live tree's modules come from these entries, in every backend alike.
        """
        live = [self.trees.modules_all]
        if any(
            naming.scheme_of_name(module) == naming.HIERARCHICAL_SCHEMES for _n, _v, module in self.modules
        ):
            # And the hierarchy's entry level, which EasyBuild adds under its module install
            # path as well: the toolchain is loaded by its short name (GCC/6.4.0-2.28).
            live.append(os.path.join(self.trees.modules_all, naming.CORE_LEVEL))
        return os.pathsep.join(
            [*live, *(path for path in given.split(os.pathsep) if path and path not in live)]
        )

    def prepare(self):
        """Make what the backend needs before EasyBuild runs; return the child's sandbox setup."""
        if self.backend not in SANDBOXED:
            return None
        views = [
            (view_dir, live_name_dir, sandbox.make_view(live_name_dir, view_dir, versions))
            for view_dir, live_name_dir, versions in self._views()
        ]
        os.makedirs(self.locks_dir, exist_ok=True)
        if self.backend == "bwrap":
            return None  # EasyBuild makes its sandbox itself, from placement_args
        os.makedirs(self.stage_modules, exist_ok=True)
        spec = {
            "read_only": [self.trees.software, self.trees.modules],
            "writable": [self.generation],
            "views": views,
            "probe": [self.trees.software, self.trees.modules],
        }
        return lambda: sandbox.enter(spec)

    def check(self):
        """After a successful build: refuse a bubblewrap run that wrote elsewhere."""
        if self.backend == "bwrap":
            bwrapinfo.check(self.generation, [module for _name, _version, module in self.modules])
