# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an install's own easyconfig copy says it is and what it was built with, read, never run.

EasyBuild writes the easyconfig an install was built from into ``<install>/easybuild/``. That
copy is content of the live tree that its owner can edit, so it is parsed (``ast``) and its
top-level assignments evaluated as literals only: strings, numbers, tuples, lists, dicts,
names assigned before (``local_*`` variables and any other), ``SYSTEM``, ``+`` of strings,
lists and tuples, and ``%`` of a string. Nothing is called, imported or looked up elsewhere;
an assignment of anything else is unknown, which matters only when a field read here uses it.
EasyBuild's templates (``%(version)s``, ``%(pyshortver)s``, ...) are then filled in as
EasyBuild fills them for the names, versions and suffixes of the package and its dependencies.

``parse`` returns an ``Easyconfig``: ``name``, ``version``, ``versionsuffix``, ``toolchain``
and its ``dependencies`` and ``builddependencies`` as ``Dependency`` records (a dependency's
toolchain is None when it inherits the package's, as EasyBuild resolves it then). What cannot
be read raises ``EasyconfigError`` with one line saying why.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

# EasyBuild's easyconfigs stay well below this (the largest, with long checksum lists, are a
# few hundred kB); a larger copy is refused rather than parsed.
MAX_BYTES = 1 << 20
SYSTEM_NAME = "system"
# The toolchain that means "no toolchain": SYSTEM, and its older name.
_SYSTEM_NAMES = ("system", "dummy")
_TEMPLATE = re.compile(r"%\((\w+)\)s")
# The templates of a dependency's version: %(pyver)s is the Python dependency's, and so on.
_DEPENDENCY_TEMPLATES = {"py": "Python", "perl": "Perl", "r": "R", "java": "Java", "cuda": "CUDA"}


class EasyconfigError(ValueError):
    """An easyconfig copy that cannot be read without running it; ``str()`` is one line."""


Toolchain = Tuple[str, str]  # (name, version); ("system", "system") for SYSTEM


@dataclasses.dataclass(frozen=True)
class Dependency:
    """One entry of ``dependencies`` or ``builddependencies``."""

    name: str
    version: str
    versionsuffix: str = ""
    # None: inherited from the package (EasyBuild then takes it, or a subtoolchain of it).
    toolchain: Optional[Toolchain] = None

    def install_dir(self, toolchain: Toolchain) -> str:
        """The install directory's version part under ``toolchain``, as EasyBuild names it."""
        return install_dir(self.version, toolchain, self.versionsuffix)

    def __str__(self) -> str:
        toolchain = "" if self.toolchain is None else f" ({'/'.join(self.toolchain)})"
        return f"{self.name} {self.version}{self.versionsuffix}{toolchain}"


@dataclasses.dataclass(frozen=True)
class Easyconfig:
    name: str
    version: str
    versionsuffix: str
    toolchain: Toolchain
    dependencies: List[Dependency]
    builddependencies: List[Dependency]

    @property
    def install_dir(self) -> str:
        return install_dir(self.version, self.toolchain, self.versionsuffix)


def is_system(toolchain: Toolchain) -> bool:
    return toolchain[0].lower() in _SYSTEM_NAMES


def install_dir(version: str, toolchain: Toolchain, versionsuffix: str) -> str:
    """``<version>[-<toolchain>-<toolchain version>]<versionsuffix>``: EasyBuild's directory name."""
    middle = "" if is_system(toolchain) else f"-{toolchain[0]}-{toolchain[1]}"
    return f"{version}{middle}{versionsuffix}"


class _Unknown:
    """The value of an assignment that is not a literal (a call, a comprehension, ...)."""

    def __init__(self, why: str) -> None:
        self.why = why


_SYSTEM = {"name": SYSTEM_NAME, "version": SYSTEM_NAME}
# Names EasyBuild's easyconfigs use as constants; any other free name is unknown.
# EXTERNAL_MODULE: a dependency on a module of the system, loaded by name, not an install.
_EXTERNAL_MODULE = ("EXTERNAL_MODULE",)
_CONSTANTS: Dict[str, Any] = {"SYSTEM": _SYSTEM, "EXTERNAL_MODULE": _EXTERNAL_MODULE}


# The value a name holds where it is used (``assignments``).
Lookup = Callable[[str], Any]


def _evaluate(node: ast.AST, names: Lookup) -> Any:
    """The literal value of ``node``; ``_Unknown`` for anything that would have to run."""
    evaluate = _EVALUATORS.get(type(node))
    if evaluate is None:
        return _Unknown(f"a {type(node).__name__} expression")
    return evaluate(node, names)


def _first_unknown(values: Iterable[Any]) -> Optional[_Unknown]:
    return next((value for value in values if isinstance(value, _Unknown)), None)


_LARGEST_INT = 2**63  # larger is no version or count EasyBuild reads, and slow to print


def _constant(node: Any, names: Lookup) -> Any:
    if isinstance(node.value, int) and not -_LARGEST_INT < node.value < _LARGEST_INT:
        return _Unknown("an integer too large")
    if isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    return _Unknown(f"a {type(node.value).__name__} constant")


def _sequence(node: Any, names: Lookup) -> Any:
    items = [_evaluate(item, names) for item in node.elts]
    unknown = _first_unknown(items)
    if unknown is not None:
        return unknown
    return tuple(items) if isinstance(node, ast.Tuple) else items


def _mapping(node: Any, names: Lookup) -> Any:
    keys = [_evaluate(key, names) if key is not None else _Unknown("**") for key in node.keys]
    values = [_evaluate(value, names) for value in node.values]
    unknown = _first_unknown([*keys, *values])
    if unknown is not None:
        return unknown
    try:
        return dict(zip(keys, values))
    except TypeError:  # an unhashable key: a list
        return _Unknown("a dict with a list as a key")


def _name(node: Any, names: Lookup) -> Any:
    return names(node.id)


# The % directives evaluated: %s, %d, %(name)s, %(name)d and %%; no width or precision, which could make a
# short file evaluate to a string of any length ("%0999999999d" % 1).
_PLAIN_FORMAT = re.compile(r"%(?:\(\w+\))?[sd]|%%")


def _binary(node: Any, names: Lookup) -> Any:
    """``+`` of two strings, lists or tuples; ``%`` of a string with plain directives. Every
    result is at most ``MAX_BYTES`` long: ``a = a + a`` repeated would otherwise double it."""
    left, right = _evaluate(node.left, names), _evaluate(node.right, names)
    unknown = _first_unknown((left, right))
    if unknown is not None:
        return unknown
    result: Any = _Unknown(f"a {type(node.op).__name__} of {type(left).__name__} and {type(right).__name__}")
    if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, (str, list, tuple)):
        result = left + right if len(left) + len(right) <= MAX_BYTES else _Unknown("a value too long")
    elif isinstance(node.op, ast.Mod) and isinstance(left, str) and "%" not in _PLAIN_FORMAT.sub("", left):
        result = _format(left, right)
    return result


def _format(template: str, values: Any) -> Any:
    """``template % values`` of plain values, refused unasked when the result could be longer
    than ``MAX_BYTES`` (each directive at most as long as the longest value)."""
    items = list(values.values()) if isinstance(values, dict) else values
    items = items if isinstance(items, (list, tuple)) else [items]
    if not all(isinstance(item, (str, int, float)) for item in items):
        return _Unknown("a % of values that are not plain")
    longest = max((len(str(item)) for item in items), default=0)
    if len(template) + len(_PLAIN_FORMAT.findall(template)) * longest > MAX_BYTES:
        return _Unknown("a value too long")
    try:
        return template % values
    except (TypeError, ValueError, KeyError):
        return _Unknown("a % that does not format")


_EVALUATORS: Dict[type, Callable[[Any, Lookup], Any]] = {
    ast.Constant: _constant,
    ast.Tuple: _sequence,
    ast.List: _sequence,
    ast.Dict: _mapping,
    ast.Name: _name,
    ast.BinOp: _binary,
}


# The assignments ``parse`` reads; any other is evaluated only when one of these uses it.
FIELDS = (
    "name",
    "version",
    "versionsuffix",
    "toolchain",
    "dependencies",
    "builddependencies",
    "hiddendependencies",
)


def assignments(text: str, wanted: Iterable[str] = FIELDS) -> Dict[str, Any]:
    """The values the top-level assignments of ``text`` give the names ``wanted`` (those it
    assigns), as far as literals go. Evaluated lazily, each assignment at most once: a name
    used in a value is the value of its last assignment before that one (``local_x = local_x
    + ...`` included); what nothing wanted uses is never evaluated."""
    try:
        tree = ast.parse(text, mode="exec")
    except (SyntaxError, ValueError) as err:  # ValueError: a NUL byte
        line = err.lineno if isinstance(err, SyntaxError) else None
        where = "" if line is None else f" (line {line})"
        raise EasyconfigError(f"it is not Python{where}") from None
    except (RecursionError, MemoryError):
        raise EasyconfigError("it nests too deeply to parse") from None
    history: Dict[str, List[Tuple[int, ast.AST]]] = {}
    for index, statement in enumerate(tree.body):
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                history.setdefault(target.id, []).append((index, value))
    done: Dict[Tuple[str, int], Any] = {}

    def value_before(name: str, before: int) -> Any:
        earlier = [(index, node) for index, node in history.get(name, ()) if index < before]
        if not earlier:
            return _CONSTANTS[name] if name in _CONSTANTS else _Unknown(f"the name {name}")
        index, node = earlier[-1]
        if (name, index) not in done:
            done[(name, index)] = _Unknown(f"the name {name}, used in its own value")
            done[(name, index)] = _evaluate(node, lambda used: value_before(used, index))
        return done[(name, index)]

    found = {}
    for name in wanted:
        if name in history:
            try:
                found[name] = value_before(name, len(tree.body))
            except RecursionError:
                found[name] = _Unknown("names that refer to each other too deeply")
    return found


def _string(names: Mapping[str, Any], key: str, default: Optional[str] = None) -> str:
    value = names.get(key, default)
    if isinstance(value, _Unknown):
        raise EasyconfigError(f"its {key} is not a literal ({value.why})")
    if not isinstance(value, str):
        raise EasyconfigError(f"its {key} is {'missing' if value is None else 'not a string'}")
    return value


def _toolchain(value: Any, where: str) -> Toolchain:
    if value is True:  # EasyBuild's older spelling of SYSTEM in a dependency tuple
        return (SYSTEM_NAME, SYSTEM_NAME)
    if (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and isinstance(value.get("version"), str)
    ):
        value = (value["name"], value["version"])
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(part, str) for part in value):
        if value[0].lower() in _SYSTEM_NAMES:
            return (SYSTEM_NAME, SYSTEM_NAME)
        return (value[0], value[1])
    raise EasyconfigError(f"{where} is not a toolchain (name, version) or SYSTEM")


def _dependency(value: Any, where: str) -> Optional[Dependency]:
    """One dependency tuple; None for an external module (``EXTERNAL_MODULE``), not EasyBuild's."""
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        value = (value["name"], value.get("version"), value.get("versionsuffix", ""), value.get("toolchain"))
        value = tuple(item for item in value if item is not None)
    if not isinstance(value, tuple) or not 2 <= len(value) <= 4:
        raise EasyconfigError(f"{where} is not a tuple (name, version[, versionsuffix[, toolchain]])")
    name, version = value[0], value[1]
    if version is _EXTERNAL_MODULE:
        return None
    suffix = value[2] if len(value) > 2 else ""
    if not all(isinstance(part, str) for part in (name, version, suffix)):
        raise EasyconfigError(f"{where} has a name, version or versionsuffix that is not a string")
    toolchain = _toolchain(value[3], f"{where}'s toolchain") if len(value) > 3 else None
    return Dependency(name, version, suffix, toolchain)


def _dependencies(names: Mapping[str, Any], key: str) -> List[Dependency]:
    value = names.get(key, [])
    if isinstance(value, _Unknown):
        raise EasyconfigError(f"its {key} are not literals ({value.why})")
    if not isinstance(value, (list, tuple)):
        raise EasyconfigError(f"its {key} are not a list")
    found = []
    for index, item in enumerate(value):
        # A list of lists: EasyBuild's alternatives (multi_deps, iterated builds); each counts.
        group = item if isinstance(item, list) else [item]
        for inner in group:
            dependency = _dependency(inner, f"{key}[{index}]")
            if dependency is not None:
                found.append(dependency)
    return found


def _fill(value: str, templates: Mapping[str, str], where: str) -> str:
    def one(match: re.Match) -> str:
        if match.group(1) not in templates:
            raise EasyconfigError(f"{where} uses the template %({match.group(1)})s, which is not known here")
        return templates[match.group(1)]

    return _TEMPLATE.sub(one, value)


def _version_templates(prefix: str, version: str) -> Dict[str, str]:
    parts = version.split(".")
    return {f"{prefix}ver": version, f"{prefix}shortver": ".".join(parts[:2]), f"{prefix}majver": parts[0]}


def _templates(
    name: str, version: str, toolchain: Toolchain, dependencies: List[Dependency]
) -> Dict[str, str]:
    parts = version.split(".")
    found = {
        "name": name,
        "namelower": name.lower(),
        "nameletter": name[:1],
        "version": version,
        "version_major": parts[0],
        "version_minor": parts[1] if len(parts) > 1 else "",
        "version_major_minor": ".".join(parts[:2]),
        "toolchain_name": toolchain[0],
        "toolchain_version": toolchain[1],
    }
    for prefix, dependency_name in _DEPENDENCY_TEMPLATES.items():
        for dependency in dependencies:
            if dependency.name == dependency_name and "%(" not in dependency.version:
                found.update(_version_templates(prefix, dependency.version))
    return found


def parse(text: str) -> Easyconfig:
    """The easyconfig ``text`` (module docstring); ``EasyconfigError`` when it cannot be read."""
    names = assignments(text)
    raw_name, raw_version = _string(names, "name"), _string(names, "version")
    toolchain_value = names.get("toolchain")
    if isinstance(toolchain_value, _Unknown) or toolchain_value is None:
        raise EasyconfigError("its toolchain is missing or not a literal")
    toolchain = _toolchain(toolchain_value, "its toolchain")
    raw_suffix = _string(names, "versionsuffix", "")
    runtime = _dependencies(names, "dependencies")
    # Hidden dependencies are run time dependencies whose module is hidden (``.version``).
    runtime += [dep for dep in _dependencies(names, "hiddendependencies") if dep not in runtime]
    build = _dependencies(names, "builddependencies")
    # Templates see the raw dependency versions (%(pyver)s is the Python dependency's version).
    templates = _templates(raw_name, raw_version, toolchain, runtime + build)
    name = _fill(raw_name, templates, "its name")
    version = _fill(raw_version, templates, "its version")
    templates = _templates(name, version, toolchain, runtime + build)
    templates["versionsuffix"] = _fill(raw_suffix, templates, "its versionsuffix")

    def filled(dependencies: List[Dependency], key: str) -> List[Dependency]:
        return [
            Dependency(
                _fill(dep.name, templates, key),
                _fill(dep.version, templates, key),
                _fill(dep.versionsuffix, templates, key),
                dep.toolchain,
            )
            for dep in dependencies
        ]

    return Easyconfig(
        name=name,
        version=version,
        versionsuffix=templates["versionsuffix"],
        toolchain=toolchain,
        dependencies=filled(runtime, "its dependencies"),
        builddependencies=filled(build, "its builddependencies"),
    )
