# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every setting of eb-staged-rebuild: its name, where it comes from, and its one check.

A setting is known by its module option name (``grace_hours``); the command line spells it
as a flag (``--grace-hours``). The command line and the Ansible modules both hand their
values, keyed by that name, to the resolvers here; each resolver takes the value given,
else the host's environment variable, else the default, checks it once, and raises an
error that names the setting rather than spelling it, so that each front end says it in
its own words (``errors.HpcstackError.render``). The rebuild's own options are the fields
of ``request.RebuildRequest``, declared there with ``option()``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import typing
from typing import Any, Dict, Mapping, Optional, Tuple

from ..common import errors
from ..common.errors import setting
from .records import AbsPath

STATE_ROOT_VARIABLE = "EB_STAGED_REBUILD_STATE_ROOT"
EB_VARIABLE = "EB_STAGED_REBUILD_EB"
GRACE_HOURS_VARIABLE = "EB_STAGED_REBUILD_GRACE_HOURS"
BACKEND_VARIABLE = "EB_STAGED_REBUILD_BACKEND"
DEFAULT_GRACE_HOURS = 144.0
MAX_GRACE_HOURS = 876000  # 100 years
# Flags whose spelling is not the option's name with dashes.
_FLAGS = {"modules": "--module", "eb_args": "EasyBuild's arguments after --"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """How a setting is offered: the help, the default, the variable, the front ends."""

    help: str
    default: Any = None
    variable: Optional[str] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    # False: only the command line offers it (the modules use check mode, not --dry-run).
    module: bool = True


def flag(name: str) -> str:
    """The command line's spelling of the setting ``name``."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def option(default: Any = None, **setting: Any) -> Any:
    """A request field that is also an option of the command line and the module."""
    # Called in a dataclass body, where field() belongs; pylint sees only this function.
    metadata = {"setting": Setting(default=default, **setting)}
    if isinstance(default, list):  # a list option (repeatable flag): each record its own list
        return dataclasses.field(  # pylint: disable=invalid-field-call
            default_factory=lambda: list(default), metadata=metadata
        )
    return dataclasses.field(default=default, metadata=metadata)  # pylint: disable=invalid-field-call


def options(record: type) -> Dict[str, Tuple[Setting, Any]]:
    """The options among ``record``'s fields: name -> (setting, type)."""
    hints = typing.get_type_hints(record)
    return {
        field.name: (field.metadata["setting"], hints[field.name])
        for field in dataclasses.fields(record)
        if "setting" in field.metadata
    }


def _base_type(hint: Any) -> Any:
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union else hint


def argument_spec(record: type) -> Dict[str, Dict[str, Any]]:
    """The Ansible argument spec of ``record``'s options (the module takes them as they are)."""
    spec = {}
    for name, (offered, hint) in options(record).items():
        if not offered.module:
            continue
        base = _base_type(hint)
        if typing.get_origin(base) is list:
            spec[name] = {"type": "list", "elements": "str", "default": []}
            continue
        entry: Dict[str, Any] = {
            "type": {bool: "bool", float: "float", int: "int", AbsPath: "path"}.get(base, "str")
        }
        if offered.choices:
            entry["choices"] = list(offered.choices)
        if base is bool:
            entry["default"] = offered.default
        spec[name] = entry
    return spec


def add_arguments(parser: Any, record: type) -> None:
    """Add ``record``'s options to an argparse parser as flags (``None``: not given)."""
    for name, (offered, hint) in options(record).items():
        base = _base_type(hint)
        if base is bool:
            parser.add_argument(flag(name), dest=name, action="store_true", default=None, help=offered.help)
            continue
        if typing.get_origin(base) is list:  # repeatable: each flag adds one value
            parser.add_argument(
                flag(name),
                dest=name,
                action="append",
                default=None,
                metavar=offered.metavar,
                help=offered.help,
            )
            continue
        # No argparse choices: the request checks the value, with the same words for a
        # flag, a module option and a variable.
        parser.add_argument(
            flag(name),
            dest=name,
            type=float if base is float else str,
            metavar=offered.metavar,
            help=offered.help,
        )


def from_option_or_environment(
    name: str, values: Mapping[str, Any], environ: Mapping[str, str], setting: Setting
) -> Any:
    """The value given for ``name``, else the setting's variable, else its default."""
    value = values.get(name)
    if value is None and setting.variable:
        value = environ.get(setting.variable) or None
    if value is None:
        return list(setting.default) if isinstance(setting.default, list) else setting.default
    return value


def number(name: str, value: Any, variable: Optional[str] = None) -> float:
    """``value`` as a float; a variable's text that is not a number names the variable."""
    try:
        return float(value)
    except (TypeError, ValueError):
        source = f"{variable}={value!r}" if variable else f"{setting(name)} {value!r}"
        raise errors.UsageError(f"{source} is not a number") from None


def lock_timeout(values: Mapping[str, Any]) -> float:
    """Seconds to wait for the state-root lock: 0 refuses at once."""
    timeout = number("lock_timeout", values.get("lock_timeout") or 0.0)
    if timeout < 0 or math.isnan(timeout):
        raise errors.UsageError(f"{setting('lock_timeout')} must be 0 or more seconds, not {timeout}")
    return timeout


def state_root(values: Mapping[str, Any], environ: Mapping[str, str]) -> AbsPath:
    """The state root, absolute: the option, else EB_STAGED_REBUILD_STATE_ROOT."""
    given = values.get("state_root") or environ.get(STATE_ROOT_VARIABLE)
    if not given:
        raise errors.UsageError(
            f"no state root: give {setting('state_root')} DIR or set {STATE_ROOT_VARIABLE}"
        )
    return AbsPath(os.path.abspath(given))


def grace_hours(values: Mapping[str, Any], environ: Mapping[str, str]) -> float:
    """Hours a retired tree is kept: the option, else EB_STAGED_REBUILD_GRACE_HOURS, else 144."""
    given = values.get("grace_hours")
    if given is None and environ.get(GRACE_HOURS_VARIABLE):
        hours = number("grace_hours", environ[GRACE_HOURS_VARIABLE], GRACE_HOURS_VARIABLE)
    else:
        hours = DEFAULT_GRACE_HOURS if given is None else number("grace_hours", given)
    if not math.isfinite(hours):
        raise errors.UsageError(f"{setting('grace_hours')} must be a finite number of hours, not {hours}")
    if hours < 0:
        raise errors.UsageError(f"{setting('grace_hours')} must not be negative")
    if hours > MAX_GRACE_HOURS:
        # Past this the end of the grace period is no date a clock reaches (nor one Python holds).
        raise errors.UsageError(
            f"{setting('grace_hours')} must be at most {MAX_GRACE_HOURS} hours (100 years), not {hours:g}"
        )
    return hours


def eb(values: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """The EasyBuild command, absolute when it names a file or is found on PATH."""
    given = values.get("eb") or environ.get(EB_VARIABLE) or "eb"
    return os.path.abspath(given) if os.sep in given else (shutil.which(given) or given)
