# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dependants of an install: every live install built on it, in the order to rebuild them.

Discovery (``scan``) reads the live tree once: each install ``<software>/<Name>/<dir>`` with
its own easyconfig copy ``<install>/easybuild/<Name>-<dir>.eb`` (``easyconfig.parse``, never
run), and each live module file under ``<modules>/all`` with its root (which install it is)
and the modules it loads (``modulefile.dependencies``). Every file is opened without
following a link, must be a regular file and is read up to a size limit.

The graph (``graph``) has an edge from an install to each install it depends on: the
easyconfig's toolchain and ``dependencies`` (run time), its ``builddependencies`` (build
time), and the module file's loads (run time). A dependency that inherits the toolchain is
the install of the package's toolchain or, as EasyBuild resolves it, of a subtoolchain: the
one install of that name, version and suffix, or the one among several that the module file
loads. A dependency that names no install, or several, is a problem of the dependant, which
refuses the plan only when the dependant is a member.

The plan (``plan``): the members are the named install and every install that reaches it
through the edges; ``--exclude`` removes a member, and with it every member that reaches the
named install only through excluded ones. Build order: the named install first, then each
member after every member it depends on, the smaller module name first among those free to
go. A dependency cycle among the members is refused: no order builds each against the new
builds of the others.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import os
import re
import stat
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

from ..common import errors
from ..common.errors import setting
from . import easyconfig, fsutil, modulefile, paths

RUNTIME = "runtime"
BUILD = "build"
# A live module file larger than this is not one EasyBuild wrote; it is not read.
MAX_MODULE_FILE_BYTES = 1 << 20
_COPIES_DIR = "easyconfigs"
# A toolchain part of an install directory's name: "-<toolchain>-<toolchain version>".
_TOOLCHAIN_PART = re.compile(r"-[^-]+-.+\Z")
_MAX_MODULE_DEPTH = 12


@dataclasses.dataclass(frozen=True)
class Member:
    """One module of a chain: what it is, where its easyconfig comes from, and why it is in."""

    module: str  # the full live module name
    install_subdir: str  # Name/dir under the software root
    easyconfig: str  # the named package: the easyconfig given; a dependant: its own live copy
    reason: List[str]  # the dependency path from this member to the named package, module names
    kind: str  # RUNTIME, or BUILD when it reaches the named package only through a build dependency


@dataclasses.dataclass(frozen=True)
class Plan:
    """A chain: the named module and its dependants in build order, and who was left out."""

    target: str
    members: List[Member]
    excluded: List[str] = dataclasses.field(default_factory=list)
    warnings: List[str] = dataclasses.field(default_factory=list)

    def to_result(self) -> Dict[str, object]:
        """The plan as ``--json`` and the module show it."""
        return {
            "target": self.target,
            "members": [
                {
                    "module": member.module,
                    "install": member.install_subdir,
                    "easyconfig": member.easyconfig,
                    "reason": list(member.reason),
                    "kind": member.kind,
                }
                for member in self.members
            ],
            "excluded": list(self.excluded),
        }


@dataclasses.dataclass
class Install:
    """One live install as discovery found it."""

    subdir: str
    easyconfig_path: str
    parsed: Optional[easyconfig.Easyconfig] = None
    problem: Optional[str] = None  # why its easyconfig copy cannot be used
    modules: List[str] = dataclasses.field(default_factory=list)  # live modules whose root it is


@dataclasses.dataclass
class Tree:
    """What ``scan`` read: the installs, and each live module's install and loads."""

    software: str
    modules_all: str
    installs: Dict[str, Install]
    module_install: Dict[str, str]  # module name -> install subdir (modules whose root is one)
    module_loads: Dict[str, List[str]]  # module name -> the names its module file loads


def easyconfig_copy(software: str, subdir: str) -> str:
    """Where EasyBuild keeps the easyconfig an install was built from."""
    name, version = subdir.split("/")
    return os.path.join(software, name, version, "easybuild", f"{name}-{version}.eb")


def _read_copy(
    name_dir: fsutil.Directory, version: str, path: str
) -> Tuple[Optional[easyconfig.Easyconfig], Optional[str]]:
    """The parsed copy of the install ``version`` of ``name_dir`` (at ``path``), or why it
    cannot be used (one line). Opened by descriptors from the Name directory, no link followed."""
    try:
        with name_dir.open_below(version, "easybuild") as copies:
            data = copies.read_regular(os.path.basename(path), "easyconfig copy", limit=easyconfig.MAX_BYTES)
    except FileNotFoundError:
        return None, f"its easyconfig copy {path} is missing"
    except errors.UsageError as err:
        return None, str(err)
    except OSError as err:
        return None, f"its easyconfig copy {path} cannot be read: {err.strerror}"
    try:
        return easyconfig.parse(data.decode("utf-8", "replace")), None
    except easyconfig.EasyconfigError as err:
        return None, f"its easyconfig copy {path} cannot be read without running it: {err}"


def _subdirs(directory: fsutil.Directory) -> List[str]:
    """The plain-named real directories in ``directory`` (no link, nothing hidden: stages,
    retired trees, ``.modulerc``)."""
    with os.scandir(directory.fd) as entries:
        return sorted(
            entry.name
            for entry in entries
            if paths.is_plain_name(entry.name) and entry.is_dir(follow_symlinks=False)
        )


def _files(directory: fsutil.Directory) -> List[str]:
    with os.scandir(directory.fd) as entries:
        return sorted(
            entry.name
            for entry in entries
            if paths.is_plain_name(entry.name) and entry.is_file(follow_symlinks=False)
        )


def _module_texts(modules_all: str) -> Iterator[Tuple[str, str, str]]:
    """``(module name, path, text)`` of every plain-named regular file under ``modules_all``
    that can be a module file (a ``.lua`` file, or a Tcl file by its cookie), read by
    descriptors, no link followed, at most ``MAX_MODULE_FILE_BYTES``."""
    try:
        top = fsutil.Directory.open(modules_all)
    except OSError:
        return
    pending = [("", top, 0)]
    try:
        yield from _walk_modules(pending)
    finally:
        for _prefix, directory, _depth in pending:
            os.close(directory.fd)


def _walk_modules(pending: List[Tuple[str, fsutil.Directory, int]]) -> Iterator[Tuple[str, str, str]]:
    """``_module_texts`` of the directories ``pending`` and those below them."""
    while pending:
        prefix, directory, depth = pending.pop()
        with directory:
            for entry in _files(directory):
                try:
                    data = directory.read_regular(entry, "module file", limit=MAX_MODULE_FILE_BYTES)
                except (OSError, errors.UsageError):
                    continue  # not a file that can be a module's
                text = modulefile.decode(data)
                if entry.endswith(".lua") or modulefile.is_tcl(text):
                    name = f"{prefix}/{entry}" if prefix else entry
                    yield (
                        (name[: -len(".lua")] if name.endswith(".lua") else name),
                        directory.join(entry),
                        text,
                    )
            if depth >= _MAX_MODULE_DEPTH:
                continue
            for sub in _subdirs(directory):
                with contextlib.suppress(OSError, errors.UsageError):
                    pending.append(
                        (f"{prefix}/{sub}" if prefix else sub, directory.open_below(sub), depth + 1)
                    )


def scan(trees: paths.Trees) -> Tree:
    """Read the live trees once (module docstring)."""
    software = trees.software
    installs: Dict[str, Install] = {}
    try:
        software_dir = fsutil.Directory.open(software)
    except OSError as err:
        raise errors.UsageError(f"cannot read the software tree {software}: {err.strerror}") from None
    with software_dir:
        for name in _subdirs(software_dir):
            try:
                name_dir = software_dir.open_below(name)
            except (OSError, errors.UsageError):
                continue
            with name_dir:
                for version in _subdirs(name_dir):
                    subdir = f"{name}/{version}"
                    copy = easyconfig_copy(software, subdir)
                    parsed, problem = _read_copy(name_dir, version, copy)
                    installs[subdir] = Install(subdir, copy, parsed, problem)
    module_install: Dict[str, str] = {}
    module_loads: Dict[str, List[str]] = {}
    for module, _path, text in _module_texts(trees.modules_all):
        module_loads[module] = modulefile.dependencies(text)
        install = _install_of(software, module, modulefile.parse_root(text), installs)
        if install is not None:
            module_install[module] = install
            installs[install].modules.append(module)
    return Tree(software, trees.modules_all, installs, module_install, module_loads)


def _install_of(
    software: str, module: str, root: Optional[str], installs: Mapping[str, Install]
) -> Optional[str]:
    """The install a module file's root names; a flat module without one: its own name."""
    if root and os.path.isabs(root):
        relative = os.path.relpath(os.path.normpath(root), software)
        return relative if relative in installs else None
    return module if module in installs else None


# --- The graph ----------------------------------------------------------------------------


@dataclasses.dataclass
class Graph:
    """Edges from each install to the installs it depends on, and each install's problems."""

    edges: Dict[str, Dict[str, str]]  # dependant -> {dependency: RUNTIME | BUILD}
    problems: Dict[str, List[str]]  # install -> why a dependency of it cannot be resolved


class _Modules:
    """The live module names, found by what a module file loads."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = set(names)
        self.by_short: Dict[str, List[str]] = collections.defaultdict(list)
        self.by_name: Dict[str, List[str]] = collections.defaultdict(list)
        for name in sorted(self.names):
            parts = name.split("/")
            self.by_short["/".join(parts[-2:])].append(name)
            if len(parts) >= 2:
                self.by_name[parts[-2]].append(name)

    def has_module_of(self, dependency: easyconfig.Dependency, toolchain: easyconfig.Toolchain) -> bool:
        """Is there a live module of ``dependency`` that is no install of this tree (a module
        file alone, as a hierarchy's compiler modules can be): loadable, nothing to rebuild."""
        toolchain = dependency.toolchain or toolchain
        names = {
            f"{dependency.name}/{dependency.install_dir(toolchain)}",
            f"{dependency.name}/{dependency.version}{dependency.versionsuffix}",
        }
        return any(self.by_short.get(name) for name in names)

    def resolve(self, loaded: str, loader: str) -> List[str]:
        """The live modules ``loader`` loading ``loaded`` can mean: the name itself, or in a
        hierarchy the modules ending in it on the levels the loader sees (Core, its compiler's,
        its own); a bare Name: every version of it."""
        if loaded in self.names:
            return [loaded]
        if "/" not in loaded:
            return list(self.by_name.get(loaded, []))
        found = [
            name
            for name in self.by_short.get("/".join(loaded.split("/")[-2:]), [])
            if name.endswith("/" + loaded)
        ]
        seen = _visible_levels(loader)
        visible = [name for name in found if name[: -len(loaded) - 1] in seen]
        return visible or found


def _visible_levels(module: str) -> Set[str]:
    """The hierarchy levels a module's loads are looked up in: Core, and the module's own
    level with its compiler's (``MPI/GCC/13/OpenMPI/4`` also sees ``Compiler/GCC/13``)."""
    parts = module.split("/")
    levels = {"", "Core", "/".join(parts[:-2])}
    if parts[0] == "MPI" and len(parts) >= 5:
        levels.add("/".join(["Compiler", *parts[1:3]]))
    return levels


def _by_name(installs: Iterable[str]) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = collections.defaultdict(list)
    for subdir in sorted(installs):
        name, version = subdir.split("/")
        found[name].append(version)
    return found


def _dependency_candidates(
    dependency: easyconfig.Dependency, toolchain: easyconfig.Toolchain, versions: List[str]
) -> List[str]:
    """The install directories of ``dependency.name`` it can mean (module docstring)."""
    if dependency.toolchain is not None:
        wanted = dependency.install_dir(dependency.toolchain)
        return [wanted] if wanted in versions else []
    exact = dependency.install_dir(toolchain)
    if exact in versions:
        return [exact]
    head, tail = dependency.version, dependency.versionsuffix
    found = []
    for version in versions:
        if not (version.startswith(head) and version.endswith(tail)) or len(version) < len(head) + len(tail):
            continue
        middle = version[len(head) : len(version) - len(tail)]
        if not middle or _TOOLCHAIN_PART.match(middle):
            found.append(version)
    return found


def _easyconfig_dependencies(parsed: easyconfig.Easyconfig) -> List[Tuple[easyconfig.Dependency, str]]:
    found = [(dependency, RUNTIME) for dependency in parsed.dependencies]
    found += [(dependency, BUILD) for dependency in parsed.builddependencies]
    if not easyconfig.is_system(parsed.toolchain):
        name, version = parsed.toolchain
        # The toolchain is an install of the system toolchain (GCC/13.2.0, foss/2023b), loaded
        # by the module file: a run time dependency.
        toolchain = easyconfig.Dependency(name, version, "", (easyconfig.SYSTEM_NAME, easyconfig.SYSTEM_NAME))
        found.insert(0, (toolchain, RUNTIME))
    return found


def graph(tree: Tree) -> Graph:
    """The edges of every install (module docstring)."""
    modules = _Modules(tree.module_loads)
    versions_of = _by_name(tree.installs)
    edges: Dict[str, Dict[str, str]] = {subdir: {} for subdir in tree.installs}
    problems: Dict[str, List[str]] = collections.defaultdict(list)

    def add(source: str, target: str, kind: str) -> None:
        if target != source and edges[source].get(target) != RUNTIME:
            edges[source][target] = kind

    for subdir, install in tree.installs.items():
        loaded_installs: Set[str] = set()
        for module in install.modules:
            for loaded in tree.module_loads.get(module, []):
                found = modules.resolve(loaded, module)
                targets = sorted({tree.module_install[name] for name in found if name in tree.module_install})
                if len(targets) > 1:
                    problems[subdir].append(
                        f"its module file loads {loaded}, which is ambiguous: {', '.join(found)}"
                    )
                elif not found:
                    problems[subdir].append(f"its module file loads {loaded}, which is no live module")
                for target in targets[:1]:
                    loaded_installs.add(target)
                    add(subdir, target, RUNTIME)
        if install.parsed is None:
            continue
        for dependency, kind in _easyconfig_dependencies(install.parsed):
            candidates = [
                f"{dependency.name}/{version}"
                for version in _dependency_candidates(
                    dependency, install.parsed.toolchain, versions_of.get(dependency.name, [])
                )
            ]
            if len(candidates) > 1:
                # Several subtoolchains have it: the module file says which one it loads.
                candidates = [
                    candidate for candidate in candidates if candidate in loaded_installs
                ] or candidates
            if len(candidates) == 1:
                add(subdir, candidates[0], kind)
            elif candidates:
                problems[subdir].append(
                    f"its {_noun(kind)} {dependency} is ambiguous: the live tree has {', '.join(candidates)}"
                )
            elif not modules.has_module_of(dependency, install.parsed.toolchain):
                problems[subdir].append(
                    f"its {_noun(kind)} {dependency} matches no install under {tree.software} "
                    f"and no module under {tree.modules_all}"
                )
    return Graph(edges, dict(problems))


def _noun(kind: str) -> str:
    return "dependency" if kind == RUNTIME else "build dependency"


# --- The plan -------------------------------------------------------------------------------


def _reach(
    target: str, edges: Mapping[str, Mapping[str, str]], kinds: Tuple[str, ...], skip: Set[str]
) -> Dict[str, str]:
    """Every install that reaches ``target`` through edges of ``kinds`` avoiding ``skip``,
    each with the next install on a shortest path to it (breadth first, by name)."""
    dependants: Dict[str, List[str]] = collections.defaultdict(list)
    for source in sorted(edges):
        for dependency, kind in edges[source].items():
            if kind in kinds:
                dependants[dependency].append(source)
    toward: Dict[str, str] = {}
    queue = collections.deque([target])
    while queue:
        here = queue.popleft()
        for source in dependants.get(here, []):
            if source != target and source not in toward and source not in skip:
                toward[source] = here
                queue.append(source)
    return toward


def _path(member: str, toward: Mapping[str, str], target: str) -> List[str]:
    path = [member]
    while path[-1] != target:
        path.append(toward[path[-1]])
    return path


def _module_of(tree: Tree, subdir: str) -> str:
    """The live module of an install: the one whose root it is (flat named first), else the
    flat scheme's name, which is the install's."""
    found = tree.installs[subdir].modules
    if subdir in found or not found:
        return subdir
    return sorted(found)[0]


def _excluded_installs(
    exclude: List[str], members: Mapping[str, str], target: str, target_module: str
) -> List[str]:
    """The installs the ``--exclude`` values name; refused when one names no member."""
    found = []
    for value in exclude:
        matches = [
            subdir
            for subdir, module in members.items()
            if value in (module, subdir) or module.endswith("/" + value)
        ]
        if value in (target, target_module) or target_module.endswith("/" + value):
            raise errors.UsageError(
                f"{setting('exclude')} {value} is the module named by {setting('modules')}; "
                "rebuild without it instead"
            )
        if len(matches) != 1:
            what = "names more than one member" if matches else "is not a dependant"
            raise errors.UsageError(
                f"{setting('exclude')} {value} {what} of {target_module}; "
                "a dry run shows the plan and its members"
            )
        if matches[0] not in found:
            found.append(matches[0])
    return found


def _build_order(
    target: str, members: Set[str], edges: Mapping[str, Mapping[str, str]], module_of: Mapping[str, str]
) -> List[str]:
    """The members, the named install first, each after every member it depends on; a cycle
    among them is refused."""
    needs = {member: {dep for dep in edges[member] if dep in members or dep == target} for member in members}
    needs[target] = set()  # first, whatever it depends on
    waiting = {member: len(deps) for member, deps in needs.items()}
    users: Dict[str, List[str]] = collections.defaultdict(list)
    for member, deps in needs.items():
        for dep in deps:
            users[dep].append(member)
    ready = [
        ("" if member == target else module_of[member], member)
        for member, count in waiting.items()
        if not count
    ]
    heapq.heapify(ready)
    order = []
    while ready:
        member = heapq.heappop(ready)[1]
        order.append(member)
        for user in users[member]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (module_of[user], user))
    if len(order) != len(needs):
        cycle = sorted(module_of[member] for member in needs if member not in order)
        raise errors.UsageError(
            f"the dependants of {module_of[target]} {', '.join(cycle)} depend on each other (a cycle), "
            f"so no order builds each against the new builds of the others; leave one out with "
            f"{setting('exclude')}"
        )
    return order


def plan(
    tree: Tree,
    target_module: str,
    target_install: str,
    target_easyconfig: str,
    exclude: Optional[List[str]] = None,
) -> Plan:
    """The chain of ``target_install`` (module docstring); refused with one line for a member
    whose easyconfig copy or dependencies cannot be used."""
    found = graph(tree)
    everyone = _reach(target_install, found.edges, (RUNTIME, BUILD), set())
    module_of = {subdir: _module_of(tree, subdir) for subdir in everyone}
    module_of[target_install] = target_module
    excluded = _excluded_installs(list(exclude or []), module_of, target_install, target_module)
    toward_any = _reach(target_install, found.edges, (RUNTIME, BUILD), set(excluded))
    toward_runtime = _reach(target_install, found.edges, (RUNTIME,), set(excluded))
    for subdir in sorted(toward_any, key=lambda subdir: module_of[subdir]):
        install = tree.installs[subdir]
        problems = [install.problem] if install.problem else found.problems.get(subdir, [])
        if problems:
            raise errors.UsageError(
                f"dependant {module_of[subdir]} of {target_module} cannot be rebuilt: {problems[0]}; "
                f"repair it, or leave it out with {setting('exclude')} {module_of[subdir]}"
            )
    order = _build_order(target_install, set(toward_any), found.edges, module_of)
    members = [Member(target_module, target_install, target_easyconfig, [target_module], RUNTIME)]
    for subdir in order[1:]:
        toward = toward_runtime if subdir in toward_runtime else toward_any
        members.append(
            Member(
                module=module_of[subdir],
                install_subdir=subdir,
                easyconfig=tree.installs[subdir].easyconfig_path,
                reason=[module_of[step] for step in _path(subdir, toward, target_install)],
                kind=RUNTIME if subdir in toward_runtime else BUILD,
            )
        )
    left_out = sorted(set(everyone) - set(toward_any), key=lambda subdir: module_of[subdir])
    warnings = []
    for subdir in excluded:
        warnings.append(
            f"{module_of[subdir]} is left out (--exclude): it keeps linking the old {target_module}"
        )
    through = ", ".join(module_of[subdir] for subdir in excluded)
    for subdir in left_out:
        if subdir not in excluded:
            warnings.append(
                f"{module_of[subdir]} is left out: it depends on {target_module} only through {through}, "
                f"and keeps linking the old {target_module}"
            )
    return Plan(
        target=target_module,
        members=members,
        excluded=[module_of[subdir] for subdir in [*excluded, *(s for s in left_out if s not in excluded)]],
        warnings=warnings,
    )


# --- The copies the build reads -------------------------------------------------------------


def copy_path(run_dir: str, member: Member) -> str:
    """Where a run keeps the copy of a dependant's easyconfig that its build reads."""
    name, version = member.install_subdir.split("/")
    return os.path.join(run_dir, _COPIES_DIR, f"{name}-{version}.eb")


def copy_paths(plan_: Plan, run_dir: str) -> List[str]:
    """The copies of the dependants' easyconfigs, in build order (the named module's is given)."""
    return [copy_path(run_dir, member) for member in plan_.members[1:]]


# EasyBuild's reason for a failed run names the easyconfig file whose build failed.
_FAILED_INSTALL = re.compile(r"Installation of (\S+\.eb) failed")


def failed_member(plan_: Plan, easybuild_reason: Optional[str]) -> Optional[Member]:
    """The member whose build failed, from EasyBuild's reason ("Installation of <file> failed"):
    the named module's file is the easyconfig given, a dependant's its copy (``copy_path``).
    None when the reason names no member's file."""
    found = _FAILED_INSTALL.search(easybuild_reason or "")
    if found is None:
        return None
    named = plan_.members[0]
    by_file = {os.path.basename(named.easyconfig): named}
    for member in plan_.members[1:]:
        by_file[os.path.basename(copy_path("", member))] = member
    return by_file.get(found.group(1))


def take_copies(plan_: Plan, run_dir: str, software: str) -> List[str]:
    """Copy each dependant's own easyconfig into the run's directory (once: a resumed build
    reads the copies its first attempt took); return the copies in build order.

    Read as discovery reads it (no link followed, a regular file, at most
    ``easyconfig.MAX_BYTES``): the build hides the live install, and its easyconfig with it."""
    copies_dir = os.path.join(run_dir, _COPIES_DIR)
    try:
        os.mkdir(copies_dir, 0o700)
    except FileExistsError:
        info = os.lstat(copies_dir)
        if not stat.S_ISDIR(info.st_mode):
            raise errors.UsageError(f"{copies_dir} is not a directory") from None
    taken = []
    for member in plan_.members[1:]:
        target = copy_path(run_dir, member)
        if fsutil.lstat_below(target, run_dir) is None:
            data = fsutil.read_regular(
                member.easyconfig, "easyconfig copy", root=software, limit=easyconfig.MAX_BYTES
            )
            fsutil.atomic_write(target, data, mode=0o600, root=run_dir)
        taken.append(target)
    return taken
