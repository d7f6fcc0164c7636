"""Rows with their ``jsonb`` columns read as JSON: the driver port
(:mod:`dispo.libs.db.driver`) has no codec for ``jsonb`` and hands it back as text, so a
store that returns such a column loads it here (and writes it as text, with
``CAST(:x AS jsonb)``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


class JsonRow(dict[str, Any]):
    """A row read by key or as an attribute, its ``jsonb`` columns loaded."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def with_json(rows: Iterable[Mapping[str, Any]], *columns: str) -> list[JsonRow]:
    """Each of ``rows`` as a :class:`JsonRow`, ``columns`` loaded from their JSON text."""
    loaded = []
    for row in rows:
        out = JsonRow(row.items())
        for column in columns:
            if out.get(column) is not None:
                out[column] = json.loads(out[column])
        loaded.append(out)
    return loaded
