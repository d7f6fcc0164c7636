"""Input hygiene: what every request of every service satisfies before a servicer sees it.

:func:`request_violations` walks a request message by its descriptor, so every field of
every RPC is covered, including fields added later. It refuses, naming the field as the
rest of Dispo does (``cells[0].payload.level``, ``page.page_size``, ``filter.states[1]``):

- in every string (map keys and ``Struct`` members too): NUL, which PostgreSQL text cannot
  hold, and unpaired surrogates, which UTF-8 cannot encode;
- in every single-line string (all but :data:`MULTILINE_FIELDS`): any control character,
  so an identifier with a trailing newline is refused rather than stored beside the one
  without it;
- NaN and ±Infinity in ``float`` / ``double`` fields and in ``Struct`` numbers;
- negative numbers: every numeric field of a Dispo request is a count, size, limit,
  duration, index, score or rate (:data:`SIGNED_FIELDS` would list the exceptions);
- enum numbers the enum does not declare (proto3 keeps an unknown number as it came);
- ``Timestamp`` values outside 0001-01-01..9999-12-31 (or with nanos outside a second),
  which no datetime can hold.

The gRPC layer (:mod:`dispo.libs.grpcserver`) applies it to every request; what a field
means (required, its pattern, its upper bound) stays with the servicer, which uses
:func:`identifier` and :func:`bounded` for it::

    evaluation_id = identifier(request.evaluation_id, "evaluation_id", ID_PATTERN)
    min_age = bounded(f.min_age_seconds, "filter.min_age_seconds", 0, MAX_AGE_SECONDS)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispo.libs.errors import FieldViolation, InvalidArgument
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

# String fields that may hold line breaks and tabs: free text and documents, never an id.
MULTILINE_FIELDS = frozenset(
    # definition, document: a catalogue entry or a whole catalogue as YAML (ADR-0111).
    {"reason", "failure_reason", "body", "configuration_json", "value", "definition", "document"}
)
# Numeric request fields that may be negative, by full name (none so far).
SIGNED_FIELDS: frozenset[str] = frozenset()

# The Timestamp range (RFC 3339: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z).
MIN_TIMESTAMP_SECONDS = -62_135_596_800
MAX_TIMESTAMP_SECONDS = 253_402_300_799
NANOS_PER_SECOND = 1_000_000_000

# A task label's key (ADR-0110), matched with fullmatch: the catalogue's label fields and
# every Submit's and filter's labels.
LABEL_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_ANY_BAD_TEXT = re.compile(r"[\x00\ud800-\udfff]")
_ANY_BAD_LINE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_INTEGER_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
_NUMBER_TYPES = _INTEGER_TYPES | _FLOAT_TYPES


def text_problem(value: str, *, multiline: bool = True) -> str | None:
    """Why ``value`` cannot be stored as text (None when it can)."""
    if (_ANY_BAD_TEXT if multiline else _ANY_BAD_LINE).search(value) is None:
        return None  # the common case, in one scan
    if "\x00" in value:
        return "must not contain NUL characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired surrogates"
    return "must be one line without control characters"


def number_problem(value: float, *, signed: bool = False) -> str | None:
    """Why ``value`` is not a number a request may carry (None when it is)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if value < 0 and not signed:
        return "must not be negative"
    return None


def enum_rule(enum: EnumDescriptor) -> str:
    """``must be LINE_FORMAL or LINE_TRIAL``: the values a caller names (not UNSPECIFIED)."""
    names = [v.name for v in enum.values if not v.name.endswith("_UNSPECIFIED")]
    listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
    return f"must be {listed}"


# A business's name, one rule wherever a request names one (Submit, CreateToken, the signing
# secrets' calls): letters, digits, '_' and '-', at most 64. No '.': a business's nats:
# callbacks are the subjects under ``callbacks.<business>.``, and a dotted name's would lie
# inside another business's (``tenant-a.evil``'s inside ``tenant-a``'s).
BUSINESS_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
BUSINESS_RULE = (
    "required; letters, digits, '_' or '-' (no '.'), at most 64, not starting with '_' or '-'"
)


def business_problem(value: str) -> str | None:
    """Why ``value`` is not a business's name (:data:`BUSINESS_PATTERN`); None when it is."""
    return None if BUSINESS_PATTERN.fullmatch(value) else BUSINESS_RULE


def business_name(value: str, field: str = "business") -> str:
    """``value`` when it is a business's name; else InvalidArgument naming ``field``."""
    return identifier(value, field, BUSINESS_PATTERN, BUSINESS_RULE)


def identifier(value: str, field: str, pattern: re.Pattern[str], rule: str = "") -> str:
    """``value`` when the whole of it matches ``pattern`` (``fullmatch``: ``$`` would let a
    trailing newline through); else InvalidArgument naming ``field``."""
    if pattern.fullmatch(value) is None:
        raise InvalidArgument(field, rule or f"must match {pattern.pattern}")
    return value


def bounded(value: int, field: str, low: int, high: int) -> int:
    """``value`` when ``low <= value <= high``; else InvalidArgument naming ``field``."""
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be in {low}..{high}")
    return value


def request_violations(message: Message) -> list[FieldViolation]:
    """Every field of ``message`` (recursively) that breaks the rules above."""
    found: list[FieldViolation] = []
    _walk(message, "", found)
    return found


def check_request(message: Message) -> None:
    """Raise InvalidArgument listing every violation of ``message``, if there is one."""
    found = request_violations(message)
    if found:
        raise InvalidArgument(violations=found)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@dataclass(frozen=True)
class _Field:
    """What the walk needs of one field descriptor, read once (descriptor attributes are
    slow to read: some build their answer anew each time)."""

    name: str
    kind: int
    repeated: bool
    map_value: _Field | None  # a map field: its entries' value field
    multiline: bool
    signed: bool
    enum: EnumDescriptor | None


_FIELDS: dict[FieldDescriptor, _Field] = {}
_SPECIALS: dict[type, Callable[[Any, str, list[FieldViolation]], None] | None] = {}


def _field(descriptor: FieldDescriptor) -> _Field:
    try:
        return _FIELDS[descriptor]
    except KeyError:
        entry = descriptor.message_type
        is_map = entry is not None and entry.GetOptions().map_entry
        plan = _Field(
            name=descriptor.name,
            kind=descriptor.type,
            repeated=descriptor.is_repeated,
            map_value=_field(entry.fields_by_name["value"]) if entry and is_map else None,
            multiline=descriptor.name in MULTILINE_FIELDS,
            signed=descriptor.full_name in SIGNED_FIELDS,
            enum=descriptor.enum_type,
        )
        _FIELDS[descriptor] = plan
        return plan


def _walk(message: Message, path: str, found: list[FieldViolation]) -> None:
    kind = type(message)
    try:
        special = _SPECIALS[kind]
    except KeyError:
        special = _SPECIALS[kind] = _SPECIAL.get(message.DESCRIPTOR.full_name)
    if special is not None:
        special(message, path, found)
        return
    for descriptor, value in message.ListFields():
        field = _field(descriptor)
        where = f"{path}.{field.name}" if path else field.name
        if field.map_value is not None:
            for key, item in value.items():
                if isinstance(key, str) and (problem := text_problem(key)) is not None:
                    found.append(FieldViolation(f"{where}[{key!r}]", f"key {problem}"))
                _check(field.map_value, item, f"{where}[{key!r}]", found)
        elif field.repeated:
            for i, item in enumerate(value):
                _check(field, item, f"{where}[{i}]", found)
        else:
            _check(field, value, where, found)


def _check(field: _Field, value: Any, where: str, found: list[FieldViolation]) -> None:
    kind = field.kind
    problem: str | None = None
    if kind == FieldDescriptor.TYPE_STRING:
        problem = text_problem(value, multiline=field.multiline)
    elif kind == FieldDescriptor.TYPE_MESSAGE:
        _walk(value, where, found)
    elif kind in _NUMBER_TYPES:
        problem = number_problem(value, signed=field.signed)
    elif kind == FieldDescriptor.TYPE_ENUM and field.enum is not None:
        if value not in field.enum.values_by_number:
            problem = enum_rule(field.enum)
    if problem is not None:
        found.append(FieldViolation(where, problem))


def _timestamp(message: Any, path: str, found: list[FieldViolation]) -> None:
    if not (
        MIN_TIMESTAMP_SECONDS <= message.seconds <= MAX_TIMESTAMP_SECONDS
        and 0 <= message.nanos < NANOS_PER_SECOND
    ):
        found.append(FieldViolation(path, "must be a time between 0001-01-01 and 9999-12-31"))


def _struct(message: Any, path: str, found: list[FieldViolation]) -> None:
    for key, item in message.fields.items():
        where = _join(path, key)
        if (problem := text_problem(key)) is not None:
            found.append(FieldViolation(where, f"name {problem}"))
        _value(item, where, found)


def _list_value(message: Any, path: str, found: list[FieldViolation]) -> None:
    for i, item in enumerate(message.values):
        _value(item, f"{path}[{i}]", found)


def _value(message: Any, path: str, found: list[FieldViolation]) -> None:
    kind = message.WhichOneof("kind")
    problem: str | None = None
    if kind == "number_value":
        problem = number_problem(message.number_value, signed=True)
    elif kind == "string_value":
        problem = text_problem(message.string_value)
    elif kind == "struct_value":
        _struct(message.struct_value, path, found)
    elif kind == "list_value":
        _list_value(message.list_value, path, found)
    if problem is not None:
        found.append(FieldViolation(path, problem))


_SPECIAL: dict[str, Callable[[Any, str, list[FieldViolation]], None]] = {
    "google.protobuf.Timestamp": _timestamp,
    "google.protobuf.Struct": _struct,
    "google.protobuf.ListValue": _list_value,
    "google.protobuf.Value": _value,
}


__all__ = [
    "BUSINESS_PATTERN",
    "BUSINESS_RULE",
    "MULTILINE_FIELDS",
    "SIGNED_FIELDS",
    "bounded",
    "business_name",
    "business_problem",
    "enum_rule",
    "check_request",
    "identifier",
    "number_problem",
    "request_violations",
    "text_problem",
]
