# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Typed records read from JSON and written back: one loader, driven by the records' types.

A record is a dataclass; each field's type says what the JSON value must be, and the loader
checks every one: presence (a field without a default is required), JSON type (JSON ``true``
is not an integer), and the shape of the value types below (an absolute path, a time with
its zone, a SHA-256). What no command could compute with is refused as well, whatever the
field: a string holding a surrogate that no bytes encode (``"\\ud800"``: a path of it cannot
be named, a line of it cannot be written), an integer outside 0 to 2**64 - 1 (an inode, a
file offset, a count), a time outside 1970 to 9000 UTC (its offset could carry it past
``datetime``'s range when it is shown in local time or given gc's grace period). An
unknown key is refused too: a journal written by a newer release is not silently rewritten
without what it knew. ``RecordError`` says where the value is (``modules[1].stage_ino``)
and what is wrong with it; the journal turns it into its one-line refusal.

``dump`` is the inverse: every field under its own name (``None`` as null), enums as their
values, nested records as objects. A type that is not one of
these (a step name) provides ``from_json(value, where)`` and ``to_json()``.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import math
import re
import typing
from typing import Any, Dict, List, NewType

# A path that starts at / and has no ".." component and no NUL byte.
AbsPath = NewType("AbsPath", str)
# An ISO 8601 time with its UTC offset, as ``journal.now()`` writes it.
Timestamp = NewType("Timestamp", str)
Sha256 = NewType("Sha256", str)

_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


class RecordError(ValueError):
    """A value that is not what its record's type says; ``str()`` is one line."""


def where_of(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def wrong_type(where: str, expected: str, value: Any) -> RecordError:
    return RecordError(f"{where} must be {expected}, not {_json_type(value)}")


def _check_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise wrong_type(where, "a string", value)
    if "\0" in value:
        raise RecordError(f"{where} contains a NUL byte")
    try:
        # UTF-8 with surrogateescape is how Python names a path's bytes (an undecodable byte is
        # U+DC80..U+DCFF, which the tool writes for a path that holds one); any other surrogate
        # is no bytes at all, and fails wherever the string is used as a name or printed.
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        raise RecordError(
            f"{where} holds U+{ord(value[err.start]):04X}, a lone surrogate that encodes no bytes"
        ) from None
    return value


def _check_abs_path(value: Any, where: str) -> str:
    path = _check_str(value, where)
    if not path.startswith("/") or ".." in path.split("/"):
        raise RecordError(f"{where} must be an absolute path without '..', not {path!r}")
    return path


# The times a journal may hold: from the Unix epoch (no clock the tool ran under was set
# earlier) to the year 9000, far enough inside ``datetime``'s range (years 1 to 9999) that
# a time shown in local time, or given gc's longest grace period (100 years), stays in it.
EARLIEST = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
LATEST = datetime.datetime(9000, 1, 1, tzinfo=datetime.timezone.utc)


def _check_timestamp(value: Any, where: str) -> str:
    stamp = _check_str(value, where)
    try:
        parsed = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        raise RecordError(f"{where} is not an ISO 8601 time: {stamp!r}") from None
    if parsed.tzinfo is None:
        raise RecordError(f"{where} has no UTC offset: {stamp!r}")
    try:
        in_range = EARLIEST <= parsed.astimezone(datetime.timezone.utc) < LATEST
    except OverflowError:  # year 1 with an offset east of UTC, year 9999 west of it
        in_range = False
    if not in_range:
        raise RecordError(f"{where} is not between 1970 and 9000 UTC: {stamp!r}")
    return stamp


def _check_sha256(value: Any, where: str) -> str:
    digest = _check_str(value, where)
    if not _SHA256.match(digest):
        raise RecordError(f"{where} is not a SHA-256 in hex: {digest!r}")
    return digest


# Every integer of a record is an inode number, a file offset or a count: 64 bits, unsigned.
_INT_LIMIT = 2**64


def _check_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise wrong_type(where, "an integer", value)
    if not 0 <= value < _INT_LIMIT:
        raise RecordError(f"{where} is {value}, not an integer from 0 to 2**64 - 1")
    return value


def _check_float(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise wrong_type(where, "a finite number", value)
    return float(value)


def _check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise wrong_type(where, "true or false", value)
    return value


_SCALARS = {
    str: _check_str,
    int: _check_int,
    float: _check_float,
    bool: _check_bool,
    AbsPath: _check_abs_path,
    Timestamp: _check_timestamp,
    Sha256: _check_sha256,
}


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def _load_value(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]: the only union a record declares
        if value is None:
            return None
        hint = args[0]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return _SCALARS[hint](value, where)
    if origin is list:
        if not isinstance(value, list):
            raise wrong_type(where, "a list", value)
        return [_load_value(args[0], item, f"{where}[{index}]") for index, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise wrong_type(where, "an object", value)
        return {
            _check_str(key, where): _load_value(args[1], item, where_of(where, key))
            for key, item in value.items()
        }
    return _load_named(hint, value, where)


def _load_named(hint: Any, value: Any, where: str) -> Any:
    """An enum by its value, a nested record, or a type that reads itself (``from_json``)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        known = [member.value for member in hint]
        if isinstance(value, bool) or value not in known:
            raise RecordError(f"{where} is {value!r}, not one of {', '.join(map(str, known))}")
        return hint(value)
    if hasattr(hint, "from_json"):  # first: a type that reads itself may be a dataclass too
        return hint.from_json(value, where)
    return load(hint, value, where)


def load(cls: Any, value: Any, where: str = "") -> Any:
    """``value`` (parsed JSON) as the record ``cls``; raises RecordError naming the place."""
    if not isinstance(value, dict):
        raise wrong_type(where or "the document", "an object", value)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise RecordError(f"{where_of(where, unknown[0])} is not a field this version knows")
    hints = _hints(cls)
    loaded = {}
    for name, field in fields.items():
        if name in value:
            loaded[name] = _load_value(hints[name], value[name], where_of(where, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where_of(where, name)} is missing")
    return cls(**loaded)


def _dump_value(value: Any) -> Any:
    if hasattr(value, "to_json"):  # first: a type that writes itself may be a dataclass too
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return dump(value)
    if isinstance(value, list):
        return [_dump_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _dump_value(item) for key, item in value.items()}
    return value


def dump(record: Any) -> Dict[str, Any]:
    """The record as a JSON object; the inverse of ``load``."""
    result = {}
    for field in dataclasses.fields(record):
        result[field.name] = _dump_value(getattr(record, field.name))
    return result


def depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            children: List[Any] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            deepest = max(deepest, level)
            continue
        deepest = max(deepest, level + 1)
        pending.extend((child, level + 1) for child in children)
    return deepest


def now() -> Timestamp:
    # Microseconds: two runs started in the same second still list in the order they began.
    return Timestamp(datetime.datetime.now(datetime.timezone.utc).isoformat())
