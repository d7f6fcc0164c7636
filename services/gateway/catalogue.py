"""The cell catalogue: which cells exist, the fields their payload takes, and the actions
(with dependencies) each one expands into. Loaded once from a YAML file at start.

The same file may carry a ``downstreams`` section; that part belongs to the executor's
downstream registry and is ignored here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ACTION_KINDS = ("http", "noop")
FIELD_TYPES = ("string", "integer", "number", "boolean", "object", "list")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


class CatalogueError(ValueError):
    """The catalogue file itself is wrong (a deployment error, not a caller's)."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    required: bool = False


@dataclass(frozen=True)
class ActionDef:
    name: str
    kind: str
    downstream: str = ""
    method: str = "POST"
    path: str = ""
    probe_path: str = ""
    idempotent: bool = False
    timeout_ms: int = 0
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellDef:
    name: str
    description: str
    fields: tuple[FieldSpec, ...]
    # In topological order.
    actions: tuple[ActionDef, ...]

    @property
    def sinks(self) -> list[str]:
        """Actions nothing else in the cell depends on: the cell is done when these are."""
        needed = {dep for action in self.actions for dep in action.depends_on}
        return [a.name for a in self.actions if a.name not in needed]

    @property
    def roots(self) -> list[str]:
        return [a.name for a in self.actions if not a.depends_on]


@dataclass
class Catalogue:
    cells: dict[str, CellDef] = field(default_factory=dict)

    def get(self, name: str) -> CellDef | None:
        return self.cells.get(name)


def topological(names: list[str], deps: dict[str, tuple[str, ...] | list[str]]) -> list[str] | None:
    """Kahn's order of ``names`` (stable); ``None`` when the dependencies have a cycle."""
    remaining = {n: set(deps.get(n, ())) for n in names}
    order: list[str] = []
    while remaining:
        ready = [n for n in names if n in remaining and not remaining[n]]
        if not ready:
            return None
        for n in ready:
            order.append(n)
            del remaining[n]
        for pending in remaining.values():
            pending.difference_update(ready)
    return order


def _action(cell: str, name: str, raw: dict[str, Any]) -> ActionDef:
    where = f"cells.{cell}.actions.{name}"
    kind = raw.get("kind", "")
    if kind not in ACTION_KINDS:
        raise CatalogueError(f"{where}.kind: must be one of {ACTION_KINDS}, got {kind!r}")
    if kind == "http" and not (raw.get("downstream") and raw.get("path")):
        raise CatalogueError(f"{where}: an http action needs downstream and path")
    return ActionDef(
        name=name,
        kind=kind,
        downstream=str(raw.get("downstream", "")),
        method=str(raw.get("method", "POST")).upper(),
        path=str(raw.get("path", "")),
        probe_path=str(raw.get("probe_path", "")),
        idempotent=bool(raw.get("idempotent", False)),
        timeout_ms=int(raw.get("timeout_ms", 0)),
        depends_on=tuple(raw.get("depends_on", ())),
    )


def _cell(name: str, raw: dict[str, Any]) -> CellDef:
    if not _NAME.match(name):
        raise CatalogueError(f"cells.{name}: bad cell name")
    fields = []
    for fname, fraw in (raw.get("fields") or {}).items():
        ftype = (fraw or {}).get("type", "string")
        if ftype not in FIELD_TYPES:
            raise CatalogueError(f"cells.{name}.fields.{fname}.type: must be one of {FIELD_TYPES}")
        fields.append(FieldSpec(fname, ftype, bool((fraw or {}).get("required", False))))
    actions = {a: _action(name, a, araw or {}) for a, araw in (raw.get("actions") or {}).items()}
    if not actions:
        raise CatalogueError(f"cells.{name}.actions: a cell needs at least one action")
    for action in actions.values():
        for dep in action.depends_on:
            if dep not in actions:
                raise CatalogueError(
                    f"cells.{name}.actions.{action.name}.depends_on: unknown action {dep!r}"
                )
    order = topological(list(actions), {a.name: a.depends_on for a in actions.values()})
    if order is None:
        raise CatalogueError(f"cells.{name}.actions: dependency cycle")
    return CellDef(
        name, str(raw.get("description", "")), tuple(fields), tuple(actions[a] for a in order)
    )


def parse_catalogue(data: dict[str, Any]) -> Catalogue:
    cells = data.get("cells") or {}
    if not isinstance(cells, dict):
        raise CatalogueError("cells: must be a mapping of cell name to definition")
    return Catalogue({name: _cell(name, raw or {}) for name, raw in cells.items()})


def load_catalogue(path: str | Path) -> Catalogue:
    return parse_catalogue(yaml.safe_load(Path(path).read_text()) or {})


DEFAULT_CATALOGUE = Path(__file__).parent / "catalogue" / "content_governance.yaml"
