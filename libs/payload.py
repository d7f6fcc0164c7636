"""Cell payloads on the wire: canonical JSON bytes with their encoding named.

A payload is parsed once, at the gateway (for validation and templating), written once as
canonical JSON in a ``dispo.common.v1.Payload`` (``metadata["encoding"] = "json/plain"``,
as Temporal's payloads name theirs), and sent verbatim as the downstream's HTTP body.
Nothing in between decodes it again, so ``level: 3`` arrives as ``3``.

    body = canonical_json({"level": 3, "content_id": "c"})   # b'{"content_id":"c","level":3}'
    value = parse_json_object(request_bytes)                 # PayloadError names the bad field
    value = parse_json_value(text.encode())                  # any JSON value, same checks
    value = from_struct(struct)                              # grpcurl's plain JSON, integers restored
    message = json_payload(body)                             # common_pb2.Payload
    body = payload_data(message)                             # the bytes, checked for their encoding
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.validation import text_problem
from google.protobuf import struct_pb2

ENCODING = "encoding"
JSON_PLAIN = b"json/plain"
# Integral doubles within this bound are exact integers; beyond it a double is not.
MAX_EXACT_INTEGER = 2**53


class PayloadError(ValueError):
    """A payload that is not a JSON object Dispo carries. ``path`` names the offending
    member inside the payload ("" for the payload itself), e.g. ``level`` or ``tags[2]``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path, self.reason = path, reason


# Built once: ``json.dumps`` with options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """The one canonical JSON form: sorted keys, no whitespace, UTF-8, NaN and Infinity
    refused (ValueError)."""
    return _CANONICAL.encode(value).encode("utf-8")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _clean(value: Any, path: str) -> Any:
    """Walk a parsed JSON value and refuse what no store or bus carries, naming where it is:
    non-finite numbers, and NUL characters or unpaired surrogates (a ``\\u0000`` or
    ``\\ud800`` escape) in strings and member names."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PayloadError(path, "NaN and Infinity are not JSON")
    if isinstance(value, str):
        if (problem := text_problem(value)) is not None:
            raise PayloadError(path, problem)
    elif isinstance(value, dict):
        for k, v in value.items():
            if (problem := text_problem(k)) is not None:
                raise PayloadError(_join(path, k), f"member name {problem}")
            _clean(v, _join(path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _clean(v, _join(path, i))
    return value


def _no_constant(name: str) -> Any:
    return float("nan")  # refused by _clean with its path


def parse_json_value(data: bytes) -> Any:
    """A JSON value from UTF-8 bytes, exactly as written (integers stay integers), checked
    by the rules of :func:`parse_json_object`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError("", "not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise PayloadError("", f"not JSON: {error.msg} at character {error.pos}") from None
    except ValueError as error:  # e.g. an integer of more digits than Python converts
        raise PayloadError("", f"not JSON Dispo carries: {error}") from None
    except RecursionError:
        raise PayloadError("", "nested too deeply") from None
    return _clean(value, "")


def parse_json_object(data: bytes) -> dict[str, Any]:
    """A JSON object from UTF-8 bytes, exactly as written (integers stay integers); NaN,
    Infinity, NUL characters and unpaired surrogates refused with their path."""
    value = parse_json_value(data)
    if not isinstance(value, dict):
        raise PayloadError("", "must be a JSON object")
    return value


def parse_json_text(text: str) -> Any:
    """:func:`parse_json_value` of a JSON document held in a string field."""
    return parse_json_value(text.encode("utf-8", "surrogatepass"))


def _from_value(value: struct_pb2.Value, path: str) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise PayloadError(path, "NaN and Infinity are not JSON")
        if number.is_integer() and abs(number) <= MAX_EXACT_INTEGER:
            return int(number)
        return number
    if kind == "string_value":
        if (problem := text_problem(value.string_value)) is not None:
            raise PayloadError(path, problem)
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return _from_fields(value.struct_value, path)
    if kind == "list_value":
        return [_from_value(v, _join(path, i)) for i, v in enumerate(value.list_value.values)]
    return None  # null_value (or unset)


def _from_fields(struct: struct_pb2.Struct, path: str) -> dict[str, Any]:
    out = {}
    for k, v in struct.fields.items():
        if (problem := text_problem(k)) is not None:
            raise PayloadError(_join(path, k), f"member name {problem}")
        out[k] = _from_value(v, _join(path, k))
    return out


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct (plain JSON as grpcurl writes it) as a JSON object: Struct numbers are
    doubles, so an integral one within ±2^53 becomes an integer again."""
    return _from_fields(struct, "")


def fits_type(kind: str, value: Any) -> bool:
    """Whether a JSON value is of a catalogue field type (string, integer, number,
    boolean, object, list)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    return isinstance(value, list)


def fields_problem(value: Any, fields: Sequence[tuple[str, str, bool]]) -> str | None:
    """Why a JSON value does not have the declared ``(name, type, required)`` fields (None
    when it does, or when none are declared): an object, each declared field that is there
    of its type, each required one there."""
    if not fields:
        return None
    if not isinstance(value, dict):
        return "must be a JSON object with the declared fields"
    for name, kind, required in fields:
        if name not in value:
            if required:
                return f"{name}: required"
        elif not fits_type(kind, value[name]):
            return f"{name}: must be {kind}"
    return None


def json_payload(body: bytes) -> common_pb2.Payload:
    """Canonical JSON bytes (from :func:`canonical_json`) as a Payload."""
    return common_pb2.Payload(metadata={ENCODING: JSON_PLAIN}, data=body)


def payload_problem(payload: common_pb2.Payload) -> str | None:
    """Why a Payload cannot be sent as a JSON body (None when it can)."""
    encoding = payload.metadata.get(ENCODING, b"")
    if encoding != JSON_PLAIN:
        return f"payload encoding {encoding.decode(errors='replace')!r} is not json/plain"
    return None


def payload_data(payload: common_pb2.Payload) -> bytes:
    """The JSON bytes of a Payload, verbatim (ValueError for another encoding)."""
    problem = payload_problem(payload)
    if problem is not None:
        raise ValueError(problem)
    return payload.data


def payload_value(payload: common_pb2.Payload) -> Any:
    """The decoded value, for the few readers that look inside (e.g. a conflict key)."""
    return json.loads(payload_data(payload))
