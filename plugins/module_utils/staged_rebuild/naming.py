# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module names: which live module a ``--module`` value means, and where its install lives.

The live tree is the authority, not a formula of the name: the module file is found under
``<modules>/all`` by its name (a full name such as ``Compiler/GCC/6.4.0-2.28/toy/0.0``, or the
short ``toy/0.0`` when exactly one live module ends so), and the install directory is the one
its root assignment names (``local root = "..."``, Tcl ``set root ...``), which must be
``<software>/<Name>/<dir>``: the swap exchanges that directory with a sibling. A flat name whose
module file is missing keeps the flat formula (``<software>/<Name>/<version>``), as EasyBuild's
flat scheme lays it out.

Naming schemes: EasyBuild's flat ``EasyBuildMNS`` (``modules/all/<Name>/<version>``), and
``HierarchicalMNS`` and ``MigrateFromEBToHMNS`` (``modules/all/{Core | Compiler/<c>/<v> |
MPI/<c>/<v>/<m>/<v>}/<Name>/<version>``, installs named as in the flat scheme). A build under
any other scheme, or a module whose name is not of the scheme the build uses, is refused
before EasyBuild runs: the build would write its module file elsewhere than the live one.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import List, Optional, Tuple

from ..common import errors
from ..common.errors import setting
from . import modulefile, paths

FLAT_SCHEME = "EasyBuildMNS"
HIERARCHICAL_SCHEMES = ("HierarchicalMNS", "MigrateFromEBToHMNS")
SCHEMES = (FLAT_SCHEME, *HIERARCHICAL_SCHEMES)
# The levels of EasyBuild's hierarchy and how many components a module name has at each.
HIERARCHY_LEVELS = {"Core": 3, "Compiler": 5, "MPI": 7}
CORE_LEVEL = "Core"  # the level a hierarchy's MODULEPATH starts with
_LUA = ".lua"
# A live module tree deeper than this is not one EasyBuild wrote; the search stops there.
_MAX_DEPTH = 12


@dataclasses.dataclass(frozen=True)
class Located:
    """A live module: its full name under ``modules/all`` and its install ``<Name>/<dir>``."""

    module: str
    install_subdir: str


def _module_file(modules_all: str, module: str) -> Optional[str]:
    """The live module file of ``module`` (Lua, else Tcl), or None; a link or a directory is not one."""
    for candidate in (os.path.join(modules_all, module + _LUA), os.path.join(modules_all, module)):
        try:
            info = os.lstat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            return candidate
    return None


def candidates(modules_all: str, short: str) -> List[str]:
    """Every live module name under ``modules_all`` that ends in ``short`` (``toy/0.0``):
    ``short`` itself and ``<levels>/short``. Walks without following links, skipping hidden
    entries (``.modulerc``, ``.version``) and the files that are not module files."""
    wanted = [short, short + _LUA]
    found = []
    for top, dirs, files in os.walk(modules_all):
        depth = os.path.relpath(top, modules_all).count(os.sep)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < _MAX_DEPTH else []
        for entry in sorted(files):
            relative = os.path.relpath(os.path.join(top, entry), modules_all)
            for suffix in wanted:
                if relative == suffix or relative.endswith("/" + suffix):
                    name = relative[: -len(_LUA)] if suffix.endswith(_LUA) else relative
                    if name not in found and _module_file(modules_all, name):
                        found.append(name)
    return sorted(found)


def install_subdir_of(trees: paths.Trees, module: str, module_file: str) -> str:
    """``<Name>/<dir>`` of the install the live module file's root names, a directory two
    levels under the software root, as EasyBuild installs them. A flat module whose file names
    no such root keeps the flat scheme's own place (its name); a hierarchical one is refused."""
    root = modulefile.parse_root(modulefile.read_text(module_file))
    relative = os.path.relpath(os.path.normpath(root), trees.software) if root and os.path.isabs(root) else ""
    parts = relative.split(os.sep)
    if len(parts) == 2 and all(paths.is_plain_name(part) for part in parts):
        return "/".join(parts)
    if module.count("/") == 1:
        return module
    named = f"names root {root}, which is not" if root else "has no root assignment naming"
    raise errors.UsageError(
        f"{module}'s live module file {module_file} {named} <Name>/<version> under the software tree "
        f"{trees.software}; a staged rebuild finds the install by it"
    )


def locate(trees: paths.Trees, value: str) -> Located:
    """The live module ``value`` names (module docstring); refused with one line when none,
    or more than one, does."""
    paths.parse_module_name(value)
    module_file = _module_file(trees.modules_all, value)
    if module_file is not None:
        return Located(value, install_subdir_of(trees, value, module_file))
    found = candidates(trees.modules_all, value)
    if len(found) > 1:
        raise errors.UsageError(
            f"{setting('modules')} {value} is ambiguous: the live tree has {', '.join(found)}; "
            "give the full module name"
        )
    for module, module_file in ((module, _module_file(trees.modules_all, module)) for module in found):
        if module_file is not None:
            return Located(module, install_subdir_of(trees, module, module_file))
    if value.count("/") == 1:
        return Located(value, value)  # flat, without a module file: the install is checked next
    raise errors.UsageError(
        f"{setting('modules')} {value} matches no live module file under {trees.modules_all}"
    )


def scheme_of_name(module: str) -> Tuple[str, ...]:
    """The schemes whose layout a module name is of: a name under a hierarchy level with that
    level's number of components is hierarchical, ``<Name>/<version>`` flat."""
    parts = module.split("/")
    if HIERARCHY_LEVELS.get(parts[0]) == len(parts):
        return HIERARCHICAL_SCHEMES
    if len(parts) == 2:
        return (FLAT_SCHEME,)
    return ()


def check_scheme(scheme: Optional[str], said: Optional[str], modules: List[str]) -> None:
    """Refuse a naming scheme this tool does not place, and modules of another scheme's layout
    than the build's. ``said`` is how the scheme was given (``--module-naming-scheme=X``);
    ``scheme`` None is EasyBuild's default, the flat scheme."""
    scheme = scheme or FLAT_SCHEME
    said = said or f"the module naming scheme {scheme}"
    if scheme not in SCHEMES:
        raise errors.UsageError(
            f"{said} is not a naming scheme staged rebuilds handle ({', '.join(SCHEMES)}): "
            "rebuild these modules with plain eb, or under one of those schemes"
        )
    for module in modules:
        if scheme not in scheme_of_name(module):
            layout = (
                "a flat name"
                if scheme == FLAT_SCHEME
                else "a hierarchical name (Core/..., Compiler/..., MPI/...)"
            )
            other = (
                "give --module-naming-scheme=HierarchicalMNS to EasyBuild"
                if scheme == FLAT_SCHEME and scheme_of_name(module)
                else f"name the module as {scheme} does"
            )
            raise errors.UsageError(
                f"{module} is not {layout}, but EasyBuild would build it under {said}, and write its "
                f"module file elsewhere: {other}"
            )
