"""References to an upstream node's output, ``{nodes.<node>.output.<key>...}``, in a cell's
payload values and in its actions' paths (ADR-0093). Pure: no I/O.

    {nodes.open_ticket.output.ticket_id}                 an action of the same cell
    {nodes.review.open_ticket.output.ticket_id}          <cell ref>.<action>: any cell
    {nodes.review.open_ticket.output.labels.0}           a key path; a number indexes a list
    {nodes.review.open_ticket.output}                    the whole output

The gateway checks them at Submit (well formed, naming an ancestor of every node that reads
them, a declared output field when the action declares its fields), writes each with the
node's full id and lists the nodes a node reads in its ``ActionSpec.inputs``. The executor
resolves them when the node is called, from the outputs recorded for those nodes:

- a payload value that is one reference and nothing else becomes the referred value, typed
  (``"{nodes.a.x.output.count}"`` → ``3``); references inside a longer string are replaced
  by their text (a string as it is, any other value as canonical JSON);
- in a path each reference becomes its text, percent-encoded as one path segment.

A reference whose node recorded no output, or whose key the output lacks, is a
:class:`MissingOutput`: the node fails, definitely, with the reference named.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dispo.libs.payload import canonical_json

# A node id (``<cell ref>.<action>``, or an action's name within its cell), then the key
# path. The node part is the shortest that is followed by ``.output``.
_REFERENCE = re.compile(r"\{nodes\.([A-Za-z0-9_.-]+?)\.output((?:\.[A-Za-z0-9_-]+)*)\}")
_START = "{nodes."
# Values that would be a path segment of their own meaning (RFC 3986 dot segments).
_DOT_SEGMENTS = frozenset({".", ".."})


class ReferenceError(ValueError):
    """A reference that is not well formed."""


class MissingOutput(LookupError):
    """A reference the recorded outputs cannot answer."""

    def __init__(self, reference: Reference, reason: str) -> None:
        super().__init__(f"{reference.text}: {reason}")
        self.reference, self.reason = reference, reason


@dataclass(frozen=True)
class Reference:
    """One reference: the node as written, its key path, and its text."""

    node: str
    keys: tuple[str | int, ...]
    text: str

    @property
    def field(self) -> str | None:
        """The output field it reads first, if any."""
        return str(self.keys[0]) if self.keys else None


def find(text: str) -> list[Reference]:
    """The references in ``text``; ReferenceError for a ``{nodes.`` that is not one."""
    found = [_reference(m) for m in _REFERENCE.finditer(text)]
    if text.count(_START) != len(found):
        raise ReferenceError(
            "a reference is written {nodes.<node>.output} or {nodes.<node>.output.<key>...}"
        )
    return found


def _reference(match: re.Match[str]) -> Reference:
    keys = tuple(int(k) if k.isdigit() else k for k in match.group(2).split(".")[1:])  # "" → ()
    return Reference(match.group(1), keys, match.group(0))


def in_value(value: Any, path: str = "") -> Iterator[tuple[str, Reference]]:
    """Each reference in a JSON value's strings, with where it is (``ticket``,
    ``tags[2]``); ReferenceError names the place of a malformed one."""
    if isinstance(value, str):
        try:
            for reference in find(value):
                yield path, reference
        except ReferenceError as error:
            raise ReferenceError(f"{path}: {error}" if path else str(error)) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from in_value(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from in_value(item, f"{path}[{i}]")


def rewrite(text: str, full_id: Callable[[str], str]) -> str:
    """``text`` with each reference's node written as ``full_id`` says."""
    return _REFERENCE.sub(
        lambda m: "{nodes." + full_id(m.group(1)) + ".output" + m.group(2) + "}", text
    )


def rewrite_value(value: Any, full_id: Callable[[str], str]) -> Any:
    """A JSON value with :func:`rewrite` applied to every string in it."""
    if isinstance(value, str):
        return rewrite(value, full_id) if _START in value else value
    if isinstance(value, dict):
        return {k: rewrite_value(v, full_id) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite_value(v, full_id) for v in value]
    return value


def lookup(outputs: Mapping[str, Any], reference: Reference) -> Any:
    """The value ``reference`` names in ``outputs`` (parsed outputs by full node id)."""
    if reference.node not in outputs:
        raise MissingOutput(reference, f"node {reference.node} recorded no output")
    value = outputs[reference.node]
    walked = "output"
    for key in reference.keys:
        if isinstance(key, int) and isinstance(value, list) and key < len(value):
            value = value[key]
        elif isinstance(value, dict) and str(key) in value:
            value = value[str(key)]
        else:
            raise MissingOutput(reference, f"the {walked} of node {reference.node} has no {key!r}")
        walked = f"{walked}.{key}"
    return value


def text_of(value: Any) -> str:
    """A value as it stands inside a longer string: a string as it is, else canonical JSON."""
    return value if isinstance(value, str) else canonical_json(value).decode("utf-8")


def resolve_value(value: Any, outputs: Mapping[str, Any]) -> Any:
    """A JSON value with its references resolved (see the module)."""
    if isinstance(value, str):
        if _START not in value:
            return value
        whole = _REFERENCE.fullmatch(value)
        if whole is not None:
            return lookup(outputs, _reference(whole))
        return _REFERENCE.sub(lambda m: text_of(lookup(outputs, _reference(m))), value)
    if isinstance(value, dict):
        return {k: resolve_value(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_value(v, outputs) for v in value]
    return value


def resolve_path(path: str, outputs: Mapping[str, Any]) -> str:
    """A path with each reference replaced by its text as one percent-encoded segment."""

    def segment(match: re.Match[str]) -> str:
        reference = _reference(match)
        text = text_of(lookup(outputs, reference))
        if text in _DOT_SEGMENTS:
            raise MissingOutput(reference, f"{text!r} cannot stand in the action's path")
        return urllib.parse.quote(text, safe="")

    return _REFERENCE.sub(segment, path) if _START in path else path
