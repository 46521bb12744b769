"""The typed records: ``records.load`` checks a parsed JSON value against a dataclass's field
types and says where a bad value is; ``records.dump`` writes the record back; ``depth``.

The records here are small ones of this test, with a field of every kind the journal uses.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Dict, List, Optional

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import records
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.records import (
    AbsPath,
    RecordError,
    Sha256,
    Timestamp,
)

DIGEST = "0123456789abcdef" * 4


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Word:
    """A type that reads and writes itself, as a journal's step name does."""

    text: str

    def to_json(self):
        return self.text.upper()

    @classmethod
    def from_json(cls, value, where):
        if not isinstance(value, str) or not value.isupper():
            raise RecordError(f"{where} is {value!r}, not an upper-case word")
        return cls(value.lower())


@dataclasses.dataclass
class Inner:
    size: int
    path: AbsPath
    note: Optional[str] = None


@dataclasses.dataclass
class Outer:
    name: str
    colour: Colour
    inner: Inner
    items: List[Inner]
    labels: Dict[str, str]
    at: Timestamp
    ratio: float
    enabled: bool
    # Required, but may be null: written as null, not left out.
    maybe: Optional[int]
    digest: Optional[Sha256] = None
    level: Optional[Level] = None
    word: Optional[Word] = None
    tags: List[str] = dataclasses.field(default_factory=list)
    previous: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)


def _document(**changes):
    document = {
        "name": "run1",
        "colour": "red",
        "inner": {"size": 3, "path": "/apps/software"},
        "items": [{"size": 1, "path": "/a", "note": "first"}, {"size": 2, "path": "/b"}],
        "labels": {"site": "hpc1"},
        "at": "2026-01-01T12:00:00+00:00",
        "ratio": 0.5,
        "enabled": True,
        "maybe": None,
        "digest": DIGEST,
        "level": 2,
        "word": "TOOLS",
        "tags": ["x", "y"],
        "previous": {"tools": "/m/x.lua", "bio": None},
    }
    document.update(changes)
    return document


def _refusal(value, cls=Outer):
    with pytest.raises(RecordError) as raised:
        records.load(cls, value)
    message = str(raised.value)
    assert "\n" not in message
    return message


# load and dump


def test_load_gives_the_record_with_every_field_typed():
    record = records.load(Outer, _document())

    assert record == Outer(
        name="run1",
        colour=Colour.RED,
        inner=Inner(3, "/apps/software"),
        items=[Inner(1, "/a", "first"), Inner(2, "/b")],
        labels={"site": "hpc1"},
        at="2026-01-01T12:00:00+00:00",
        ratio=0.5,
        enabled=True,
        maybe=None,
        digest=DIGEST,
        level=Level.HIGH,
        word=Word("tools"),
        tags=["x", "y"],
        previous={"tools": "/m/x.lua", "bio": None},
    )


def test_dump_is_the_inverse_of_load():
    document = _document(
        inner={"size": 3, "path": "/apps/software", "note": None},
        items=[{"size": 1, "path": "/a", "note": "first"}, {"size": 2, "path": "/b", "note": None}],
    )

    assert records.dump(records.load(Outer, document)) == document


def test_dump_writes_every_field_a_none_as_null():
    record = records.load(Outer, _document(digest=None, level=None, word=None))

    dumped = records.dump(record)

    assert (dumped["digest"], dumped["level"], dumped["word"], dumped["maybe"]) == (None, None, None, None)
    assert dumped["inner"] == {"size": 3, "path": "/apps/software", "note": None}
    assert records.load(Outer, dumped) == record


def test_a_missing_field_with_a_default_takes_the_default():
    document = _document()
    for name in ("digest", "level", "word", "tags", "previous"):
        del document[name]

    record = records.load(Outer, document)

    assert (record.digest, record.level, record.word, record.tags, record.previous) == (
        None,
        None,
        None,
        [],
        {},
    )


def test_an_integer_is_a_float_field_s_value():
    assert records.load(Outer, _document(ratio=2)).ratio == 2.0


# refusals: each says where the value is and what is wrong with it


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": 7}, "name must be a string, not a number"),
        ({"name": None}, "name must be a string, not null"),
        ({"name": "run\x001"}, "name contains a NUL byte"),
        ({"colour": "blue"}, "colour is 'blue', not one of red, green"),
        ({"colour": 1}, "colour is 1, not one of red, green"),
        ({"level": True}, "level is True, not one of 1, 2"),
        ({"level": 3}, "level is 3, not one of 1, 2"),
        ({"inner": [3]}, "inner must be an object, not a list"),
        ({"inner": {"size": 3}}, "inner.path is missing"),
        ({"inner": {"size": True, "path": "/a"}}, "inner.size must be an integer, not true/false"),
        ({"inner": {"size": 1.5, "path": "/a"}}, "inner.size must be an integer, not a number"),
        ({"inner": {"size": "3", "path": "/a"}}, "inner.size must be an integer, not a string"),
        (
            {"inner": {"size": 3, "path": "/a", "colour": "red"}},
            "inner.colour is not a field this version knows",
        ),
        ({"items": {"size": 1}}, "items must be a list, not an object"),
        ({"items": [{"size": 1, "path": "/a"}, "b"]}, "items[1] must be an object, not a string"),
        (
            {"items": [{"size": 1, "path": "a"}]},
            "items[0].path must be an absolute path without '..', not 'a'",
        ),
        (
            {"items": [{"size": 1, "path": "/a/../b"}]},
            "items[0].path must be an absolute path without '..', not '/a/../b'",
        ),
        ({"items": [{"size": 1, "path": "/a", "note": 5}]}, "items[0].note must be a string, not a number"),
        ({"labels": ["site"]}, "labels must be an object, not a list"),
        ({"labels": {"site": 1}}, "labels.site must be a string, not a number"),
        ({"previous": {"tools": False}}, "previous.tools must be a string, not true/false"),
        ({"at": "yesterday"}, "at is not an ISO 8601 time: 'yesterday'"),
        ({"at": "2026-01-01T12:00:00"}, "at has no UTC offset: '2026-01-01T12:00:00'"),
        ({"at": 1767268800}, "at must be a string, not a number"),
        ({"ratio": True}, "ratio must be a finite number, not true/false"),
        ({"ratio": "0.5"}, "ratio must be a finite number, not a string"),
        ({"ratio": math.inf}, "ratio must be a finite number, not a number"),
        ({"ratio": math.nan}, "ratio must be a finite number, not a number"),
        ({"enabled": 1}, "enabled must be true or false, not a number"),
        ({"enabled": "yes"}, "enabled must be true or false, not a string"),
        ({"maybe": False}, "maybe must be an integer, not true/false"),
        ({"digest": "abc"}, "digest is not a SHA-256 in hex: 'abc'"),
        ({"digest": DIGEST.upper()}, f"digest is not a SHA-256 in hex: {DIGEST.upper()!r}"),
        ({"digest": DIGEST + "0"}, f"digest is not a SHA-256 in hex: {DIGEST + '0'!r}"),
        ({"word": "tools"}, "word is 'tools', not an upper-case word"),
        ({"tags": "x"}, "tags must be a list, not a string"),
        ({"tags": ["x", None]}, "tags[1] must be a string, not null"),
        ({"extra": 1}, "extra is not a field this version knows"),
    ],
)
def test_a_bad_value_is_refused_naming_where_it_is(changes, message):
    assert _refusal(_document(**changes)) == message


def test_a_missing_required_field_is_refused_naming_it():
    document = _document()
    del document["colour"]

    assert _refusal(document) == "colour is missing"


def test_a_required_field_may_not_be_left_out_even_when_it_may_be_null():
    document = _document()
    del document["maybe"]

    assert _refusal(document) == "maybe is missing"


def test_the_first_unknown_key_by_name_is_the_one_named():
    assert _refusal(_document(zeta=1, alpha=2)) == "alpha is not a field this version knows"


@pytest.mark.parametrize(
    ("value", "kind"),
    [([1], "a list"), ("x", "a string"), (None, "null"), (3, "a number"), (True, "true/false")],
)
def test_a_document_that_is_not_an_object_is_refused(value, kind):
    assert _refusal(value) == f"the document must be an object, not {kind}"


def test_where_starts_at_the_place_the_caller_gives():
    with pytest.raises(RecordError) as raised:
        records.load(Inner, {"size": "3", "path": "/a"}, "modules[4]")

    assert str(raised.value) == "modules[4].size must be an integer, not a string"


# the value types on their own


@pytest.mark.parametrize("path", ["/", "/apps", "/apps/software/", "/a/.b/c", "/a/..b", "/a/b..", "/a/./b"])
def test_an_absolute_path_without_dot_dot_is_an_abs_path(path):
    assert records.load(Inner, {"size": 1, "path": path}).path == path


@pytest.mark.parametrize(
    "stamp", ["2026-01-01T12:00:00+00:00", "2026-01-01T12:00:00.123456+00:00", "2026-01-01T14:00:00+02:00"]
)
def test_a_time_with_its_offset_is_a_timestamp(stamp):
    assert records.load(Outer, _document(at=stamp)).at == stamp


def test_now_is_a_timestamp_the_loader_accepts():
    stamp = records.now()

    assert records.load(Outer, _document(at=stamp)).at == stamp


# depth


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 0),
        ("text", 0),
        (None, 0),
        ([], 1),
        ({}, 1),
        ([1, 2], 1),
        ({"a": [1]}, 2),
        ({"a": {"b": {"c": []}}, "d": 1}, 4),
        ([[], [[[]]], []], 4),
    ],
)
def test_depth_counts_how_deeply_lists_and_objects_nest(value, expected):
    assert records.depth(value) == expected


def test_depth_of_a_very_deep_value_is_counted_without_recursion():
    value = []
    for _level in range(100_000):
        value = [value]

    assert records.depth(value) == 100_001
