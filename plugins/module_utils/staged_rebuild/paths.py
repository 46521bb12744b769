# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where things are: the live trees, a module's paths, the state root, and the refusals.

A live install is ``<software>/<Name>/<version>``; its module file is
``<modules>/all/<module name>.lua`` (or the Tcl file without the suffix), where the module name
is ``<Name>/<version>`` in EasyBuild's flat naming and a longer path in a hierarchy
(``ModulePaths``). A run stages the
new install as the hidden sibling ``<software>/<Name>/.<version>.<run_id>``: the exchange
then leaves the old tree under that same name, which is the retired path. Being a sibling
keeps stage and live on one filesystem, which the exchange needs.

Every path given by the user or parsed from a file is checked before use: a module name
cannot leave its root, and no component of a module path or of the state root may be a
symlink (a link would let one wrong entry redirect a swap or a delete elsewhere).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat

from ..common import errors
from ..common.errors import setting
from . import fsutil
from .records import AbsPath

# One path component of a module name: what EasyBuild writes (Name, version-toolchain).
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
# \Z, not $: "$" also matches before a final newline, which would let "run1\n" through.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
GENERATIONS = ".eb-staged-rebuild"


@dataclasses.dataclass(frozen=True)
class Trees:
    """The live software root and module root (``<installpath>/software``, ``.../modules``)."""

    software: AbsPath
    modules: AbsPath

    def __post_init__(self) -> None:
        # Frozen: the normalised paths are set once, here.
        object.__setattr__(self, "software", os.path.abspath(self.software))
        object.__setattr__(self, "modules", os.path.abspath(self.modules))

    @classmethod
    def from_installpath(cls, installpath: str) -> Trees:
        return cls(
            AbsPath(os.path.join(installpath, "software")), AbsPath(os.path.join(installpath, "modules"))
        )

    @property
    def modules_all(self):
        return os.path.join(self.modules, "all")

    def generation(self, run_id):
        """The run's build area, inside the software root so its trees move by rename."""
        return os.path.join(self.software, GENERATIONS, run_id)


def parse_module(value):
    """``Name/version`` -> ``(name, version)``; anything that could leave a root is refused."""
    parts = value.split("/")
    if len(parts) != 2 or not all(_COMPONENT.match(part) for part in parts):
        raise errors.UsageError(
            f"{setting('modules')} {value!r} is not NAME/VERSION of plain names "
            "(no '..', no '/', no leading '.')"
        )
    return parts[0], parts[1]


def parse_module_name(value):
    """A module name as EasyBuild's naming schemes make them, checked: ``Name/version`` (flat)
    or a longer path under ``modules/all`` (``Core/toy/0.0``, ``Compiler/GCC/6.4.0/toy/0.0``),
    every component a plain name. Returned as given; anything that could leave a root is refused."""
    parts = value.split("/")
    if len(parts) < 2 or not all(_COMPONENT.match(part) for part in parts):
        raise errors.UsageError(
            f"{setting('modules')} {value!r} is not NAME/VERSION of plain names "
            "(no '..', no '/', no leading '.')"
        )
    return value


def check_run_id(run_id):
    if not RUN_ID.match(run_id) or run_id in (".", ".."):
        raise errors.UsageError(f"run id {run_id!r} is not a plain name ([A-Za-z0-9._-], at most 128)")
    return run_id


def is_plain_name(value):
    """One path component of the kind EasyBuild writes: no '/', no '..', no leading '.'."""
    return bool(_COMPONENT.match(value))


def is_inside(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def require_inside(path, root, what):
    """Refuse ``path`` (e.g. parsed from a module file) unless it lies under ``root``."""
    if not os.path.isabs(path) or not is_inside(path, root) or ".." in path.split("/"):
        raise errors.UsageError(f"{what} {path} leaves {root}")
    return os.path.normpath(path)


class ModulePaths:
    """The paths of one module in the live trees and in a run.

    A module is two names: ``module``, its name under ``<modules>/all`` (what ``module load``
    takes: ``toy/0.0`` flat, ``Core/toy/0.0`` or ``Compiler/GCC/6.4.0-2.28/toy/0.0`` in a
    hierarchy), and ``install_subdir``, its install directory under ``<software>`` as
    ``<Name>/<dir>`` (``toy/0.0``, ``toy/0.0-GCC-6.4.0-2.28``). EasyBuild's flat scheme makes
    them equal; the live module file's root says which it is (``naming.locate``). ``name``
    and ``version`` are the install directory's two components: the swap exchanges
    ``<software>/<name>/<version>`` with its hidden sibling.
    """

    def __init__(self, trees, module, install_subdir, run_id):
        self.trees = trees
        self.module = module
        self.install_subdir = install_subdir
        self.name, self.version = install_subdir.split("/")
        self.run_id = run_id
        self.stable_path = os.path.join(trees.software, self.name, self.version)
        self.retired_path = os.path.join(trees.software, self.name, f".{self.version}.{run_id}")
        self.module_dir = os.path.join(trees.modules_all, os.path.dirname(module))

    @property
    def is_flat(self):
        return self.module == self.install_subdir

    def module_file_names(self):
        """The two names the module file can have: the Lua file and the Tcl file."""
        base = os.path.basename(self.module)
        return os.path.join(self.module_dir, base + ".lua"), os.path.join(self.module_dir, base)

    def module_file(self):
        """The live module file: the Lua file, else an existing Tcl file, else where Lua goes."""
        lua, tcl = self.module_file_names()
        if not os.path.lexists(lua) and os.path.lexists(tcl):
            return tcl
        return lua

    def staged_build(self, generation):
        """Where the build in ``generation`` puts this module's install and module file: the
        module file has the live one's name, as the build keeps its syntax (``syntax``)."""
        return (
            os.path.join(generation, "software", self.name, self.version),
            os.path.join(
                generation,
                "modules",
                "all",
                os.path.dirname(self.module),
                os.path.basename(self.module_file()),
            ),
        )


RETIRE_RUN_PREFIX = "retire-"


def retired_module_path(state_root, run_id, module_file):
    """Where the retire ``run_id`` keeps ``module_file``: the only place its rollback takes a
    file from, so that a journal edited by hand cannot move another file into place."""
    return os.path.join(state_root, "retired", run_id[len(RETIRE_RUN_PREFIX) :], module_file.lstrip("/"))


def _all_dir_of(module_file):
    """``<installpath>/modules/all`` of a module file below it: at ``all/<Name>/<file>`` (flat
    naming) or deeper (``all/Core/<Name>/<file>``, ``all/Compiler/GCC/<version>/<Name>/<file>``:
    hierarchical naming), the nearest directory up named ``all`` in one named ``modules``."""
    module_dir = os.path.dirname(module_file)
    here = os.path.dirname(module_dir)
    while here != os.path.dirname(here):
        if os.path.basename(here) == "all" and os.path.basename(os.path.dirname(here)) == "modules":
            return here
        here = os.path.dirname(here)
    raise errors.UsageError(
        f"module file {module_file} is not in a module tree <installpath>/modules/all/<Name>/; "
        "refusing to retire it"
    )


def software_root_of(module_file):
    """The software root that a module file's root must lie under: ``<installpath>/software``
    for a module file at ``<installpath>/modules/all/.../<Name>/<file>``, as EasyBuild lays it
    out."""
    return os.path.join(os.path.dirname(os.path.dirname(_all_dir_of(module_file))), "software")


def module_root_of(module_file):
    """``<installpath>/modules`` of ``<installpath>/modules/all/.../<Name>/<file>`` (the layout
    ``software_root_of`` checks): the root a module file's directories are opened from."""
    return os.path.dirname(_all_dir_of(module_file))


def require_live_dir(paths):
    """The live ``Name/version`` must exist as a real directory: the swap needs two names."""
    fsutil.refuse_symlink_components(paths.stable_path, stop_at=paths.trees.software)
    try:
        info = os.lstat(paths.stable_path)
    except FileNotFoundError:
        raise errors.UsageError(
            f"{paths.module} is not installed: {paths.stable_path} does not exist "
            "(a staged rebuild replaces an existing install)"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise errors.UsageError(f"{paths.stable_path} is not a directory")
    return info


def require_module_file_path(paths):
    """Refuse a module path with a symlink component, also when the file is missing, and a
    module file that is not a regular file (a FIFO there would block the backup's read)."""
    module_file = paths.module_file()
    fsutil.refuse_symlink_components(module_file, stop_at=paths.trees.modules)
    try:
        info = os.lstat(module_file)
    except FileNotFoundError:
        return module_file
    if not stat.S_ISREG(info.st_mode):
        raise errors.UsageError(f"module file {module_file} is not a regular file")
    return module_file


def prepare_state_root(state_root):
    """Create the state root (mode 0700) if needed; refuse it if any component is a link."""
    state_root = os.path.abspath(state_root)
    fsutil.refuse_symlink_components(state_root)
    try:
        os.makedirs(state_root, mode=0o700, exist_ok=True)
    except OSError as err:
        raise errors.UsageError(f"cannot create state root {state_root}: {err.strerror}") from None
    if not os.path.isdir(state_root):
        raise errors.UsageError(f"state root {state_root} is not a directory")
    for sub in ("runs", "retired"):
        path = os.path.join(state_root, sub)
        fsutil.refuse_symlink_components(path)
        os.makedirs(path, mode=0o700, exist_ok=True)
    return state_root
