"""What a catalogue change makes of the current version (ADR-0111): pure decisions, no I/O.

A version's state is its document (the catalogue file's mapping), each cell's owner (a
business, or "" for a shared cell) and the names of the cells retired so far. A change is
checked by the catalogue's own loader (:func:`dispo.libs.catalogue.parse_catalogue`), so a
definition is refused with the same error, naming the same field, as in the file."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from dispo.libs.catalogue import Catalogue, CatalogueError, parse_catalogue
from dispo.libs.errors import (
    AlreadyExists,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)

# The field a loader error names: its text up to the first ':' or space.
_FIELD = re.compile(r"[^:\s]+")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")
SHARED = ""


@dataclass(frozen=True)
class State:
    document: dict[str, Any] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    retired: tuple[str, ...] = ()

    def section(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.document.get(name) or {}
        return found


def checked(document: dict[str, Any]) -> Catalogue:
    """The catalogue ``document`` declares, or INVALID_ARGUMENT naming the field the loader
    names (``cells.x.actions.y.kind``). An http action must call a declared downstream."""
    try:
        catalogue = parse_catalogue(document)
    except CatalogueError as error:
        text = str(error)
        match = _FIELD.match(text)
        where = match.group(0) if match else "document"
        why = text.removeprefix(where).removeprefix(":").strip() or text
        raise InvalidArgument(where, why) from None
    for cell in catalogue.cells.values():
        for action in cell.actions:
            if action.kind == "http" and action.downstream not in catalogue.downstreams:
                where = f"cells.{cell.name}.actions.{action.name}.downstream"
                raise InvalidArgument(where, f"unknown downstream {action.downstream!r}")
    return catalogue


def parsed_text(text: str, where: str) -> dict[str, Any]:
    """A definition or a document given as YAML or JSON text: a mapping."""
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as error:
        raise InvalidArgument(where, f"not YAML or JSON: {error}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(where, "must be a mapping (YAML or JSON object)")
    return data


def _name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(where, "a letter, then letters, digits, '_' or '-' (at most 63)")
    return name


def _with(state: State, section: str, name: str, value: Any | None) -> dict[str, Any]:
    """``state``'s document with ``section.name`` set to ``value`` (removed for None)."""
    document = copy.deepcopy(state.document)
    entries = dict(document.get(section) or {})
    if value is None:
        entries.pop(name, None)
    else:
        entries[name] = value
    document[section] = entries
    return document


def _may_edit(state: State, cell: str, business: str | None) -> None:
    """PERMISSION_DENIED naming ``cell`` unless the caller (``business``: a business token's
    business, None for an admin) owns it."""
    if business is None:
        return
    owner = state.owners.get(cell, SHARED)
    if owner != business:
        whose = f"business {owner!r}" if owner else "the platform (a shared cell)"
        raise PermissionDenied(
            f"cell: {cell!r} belongs to {whose}; a token of business {business!r} changes"
            " only its own cells",
            [FieldViolation("cell", f"belongs to {whose}")],
        )


def register_cell(state: State, cell: str, definition: dict[str, Any], owner: str) -> State:
    _name(cell, "cell")
    if cell in state.section("cells") or cell in state.retired:
        raise AlreadyExists(
            f"cell {cell!r} is taken" + (" (retired)" if cell in state.retired else ""),
            [FieldViolation("cell", "taken")],
        )
    document = _with(state, "cells", cell, definition)
    checked(document)
    return State(document, {**state.owners, cell: owner}, state.retired)


def update_cell(state: State, cell: str, definition: dict[str, Any], business: str | None) -> State:
    if cell not in state.section("cells"):
        raise NotFound(f"no cell {cell!r}", [FieldViolation("cell", "unknown cell")])
    _may_edit(state, cell, business)
    document = _with(state, "cells", cell, definition)
    checked(document)
    return State(document, state.owners, state.retired)


def retire_cell(state: State, cell: str, business: str | None) -> State:
    if cell not in state.section("cells"):
        raise NotFound(f"no cell {cell!r}", [FieldViolation("cell", "unknown cell")])
    _may_edit(state, cell, business)
    document = _with(state, "cells", cell, None)
    checked(document)
    owners = {c: b for c, b in state.owners.items() if c != cell}
    return State(document, owners, (*state.retired, cell))


def put_downstream(state: State, name: str, definition: dict[str, Any]) -> State:
    _name(name, "downstream")
    document = _with(state, "downstreams", name, definition)
    checked(document)
    return State(document, state.owners, state.retired)


def retire_downstream(state: State, name: str) -> State:
    if name not in state.section("downstreams"):
        raise NotFound(f"no downstream {name!r}", [FieldViolation("downstream", "unknown")])
    document = _with(state, "downstreams", name, None)
    checked(document)
    return State(document, state.owners, state.retired)


def apply_document(state: State, document: dict[str, Any]) -> State:
    """The whole catalogue replaced: new cells shared, kept cells keep their owner, the
    cells left out retired (a retired name given again is registered again)."""
    checked(document)
    cells = set(document.get("cells") or {})
    owners = {c: state.owners.get(c, SHARED) for c in sorted(cells)}
    gone = set(state.section("cells")) - cells
    retired = tuple(sorted((set(state.retired) | gone) - cells))
    return State(copy.deepcopy(document), owners, retired)


def seed(document: dict[str, Any]) -> State:
    """Version 1: the catalogue file, every cell shared."""
    checked_doc = copy.deepcopy(document)
    parse_catalogue(checked_doc)  # a broken file stops the start, as before (CatalogueError)
    return State(checked_doc, dict.fromkeys(checked_doc.get("cells") or {}, SHARED))
