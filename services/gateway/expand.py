"""Validate a submission against the catalogue and expand its cells into one DAG.

Pure domain: no I/O. Every refusal names the offending field; nothing is written when
this raises.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dispo.libs.catalogue import ActionDef, Catalogue, topological
from dispo.libs.egress import AllowList, EgressRefused, check_callback
from dispo.libs.errors import FieldViolation, InvalidArgument, ResourceExhausted
from dispo.libs.payload import canonical_json
from dispo.libs.settings import DEMO_DOWNSTREAM_ORIGIN
from dispo.libs.validation import business_problem

# A cell's ref; matched with fullmatch: ``$`` would let a trailing newline through.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
# The embedded default's allow-list (the demo downstream); services pass the configured one.
DEFAULT_EGRESS = AllowList.parse(DEMO_DOWNSTREAM_ORIGIN)
# Payload values that would be a path segment of their own meaning (RFC 3986 dot segments).
_DOT_SEGMENTS = frozenset({".", ".."})


@dataclass(frozen=True)
class Limits:
    max_cells: int = 50
    max_nodes: int = 200
    max_payload_bytes: int = 64 * 1024
    max_key_length: int = 128


@dataclass
class CellRequest:
    cell: str
    ref: str = ""
    # The payload as parsed once at the edge (JSON values; integers are ints).
    payload: dict[str, Any] = field(default_factory=dict)
    depends_on: list[str] = field(default_factory=list)

    @cached_property
    def body(self) -> bytes:
        """The payload as canonical JSON: what is stored and sent downstream."""
        return canonical_json(self.payload)


@dataclass
class Submission:
    business: str
    cells: list[CellRequest]
    idempotency_key: str = ""
    callback_url: str = ""


@dataclass(frozen=True)
class PlannedNode:
    node_id: str
    cell_ref: str
    cell: str
    action: ActionDef
    depends_on: tuple[str, ...]
    path: str
    probe_path: str
    idempotency_key: str


def node_idempotency_key(task_id: str, node_id: str) -> str:
    return f"{task_id}/{node_id}"


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    return isinstance(value, list)


def validate(
    sub: Submission, catalogue: Catalogue, limits: Limits, egress: AllowList = DEFAULT_EGRESS
) -> None:
    """Raise InvalidArgument / ResourceExhausted for the first class of problem found. A
    ``callback_url`` must be on the ``egress`` allow-list, or a ``nats:`` subject of the
    business's own (:func:`dispo.libs.egress.check_callback`)."""
    bad: list[FieldViolation] = []
    if (problem := business_problem(sub.business or "")) is not None:
        bad.append(FieldViolation("business", problem))
    if len(sub.idempotency_key) > limits.max_key_length:
        bad.append(
            FieldViolation("idempotency_key", f"longer than {limits.max_key_length} characters")
        )
    if sub.callback_url:
        try:
            check_callback(sub.callback_url, sub.business, egress)
        except EgressRefused as refused:
            bad.append(FieldViolation("callback_url", str(refused)))
    if not sub.cells:
        bad.append(FieldViolation("cells", "at least one cell is required"))
    if len(sub.cells) > limits.max_cells:
        raise ResourceExhausted(f"at most {limits.max_cells} cells per task", field="cells")
    for i, req in enumerate(sub.cells):
        size = len(req.body)
        if size > limits.max_payload_bytes:
            raise ResourceExhausted(
                f"payload is {size} bytes, the limit is {limits.max_payload_bytes}",
                field=f"cells[{i}].payload",
            )
    refs: dict[str, int] = {}
    for i, req in enumerate(sub.cells):
        cell = catalogue.get(req.cell)
        if cell is None:
            bad.append(FieldViolation(f"cells[{i}].cell", f"unknown cell {req.cell!r}"))
            continue
        ref = req.ref or req.cell
        if not _NAME.fullmatch(ref) or "." in ref:
            bad.append(FieldViolation(f"cells[{i}].ref", "letters, digits, '_' and '-' only"))
        elif ref in refs:
            bad.append(
                FieldViolation(
                    f"cells[{i}].ref", f"duplicate ref {ref!r}; give each use of a cell its own ref"
                )
            )
        refs.setdefault(ref, i)
        declared = {f.name: f for f in cell.fields}
        for spec in cell.fields:
            if spec.name not in req.payload:
                if spec.required:
                    bad.append(FieldViolation(f"cells[{i}].payload.{spec.name}", "required"))
            elif not _type_ok(spec.type, req.payload[spec.name]):
                bad.append(
                    FieldViolation(f"cells[{i}].payload.{spec.name}", f"must be {spec.type}")
                )
        for name in req.payload:
            if name not in declared:
                bad.append(
                    FieldViolation(
                        f"cells[{i}].payload.{name}", f"not a field of cell {cell.name!r}"
                    )
                )
    if bad:
        raise InvalidArgument(violations=bad)
    for i, req in enumerate(sub.cells):
        for j, dep in enumerate(req.depends_on):
            if dep not in refs:
                bad.append(
                    FieldViolation(f"cells[{i}].depends_on[{j}]", f"no cell with ref {dep!r}")
                )
            elif dep == (req.ref or req.cell):
                bad.append(
                    FieldViolation(f"cells[{i}].depends_on[{j}]", "a cell cannot depend on itself")
                )
    if bad:
        raise InvalidArgument(violations=bad)
    names = [r.ref or r.cell for r in sub.cells]
    if topological(names, {r.ref or r.cell: r.depends_on for r in sub.cells}) is None:
        raise InvalidArgument("cells", "the cells' depends_on form a cycle")


def _expand_template(
    template: str, values: dict[str, str], payload: dict[str, Any], where: str
) -> str:
    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("payload."):
            name = key.removeprefix("payload.")
            if name not in payload:
                raise InvalidArgument(f"{where}.payload.{name}", "required by the cell's action")
            value = str(payload[name])
            if value in _DOT_SEGMENTS:
                raise InvalidArgument(
                    f"{where}.payload.{name}", f"{value!r} cannot stand in the action's path"
                )
            # Every character but the unreserved ones encoded: '/', '?', '#', '@', '%' and
            # control characters cannot change the path's shape, the host or the query.
            return urllib.parse.quote(value, safe="")
        if key in values:
            return urllib.parse.quote(values[key], safe="/")
        return match.group(0)

    return _PLACEHOLDER.sub(sub, template)


def expand(
    task_id: str, sub: Submission, catalogue: Catalogue, limits: Limits
) -> list[PlannedNode]:
    """The task's nodes in topological order (call :func:`validate` first)."""
    sinks: dict[str, list[str]] = {}
    nodes: list[PlannedNode] = []
    by_ref = {r.ref or r.cell: (i, r) for i, r in enumerate(sub.cells)}
    order = topological(list(by_ref), {ref: r.depends_on for ref, (_, r) in by_ref.items()}) or []
    for ref in order:
        i, req = by_ref[ref]
        cell = catalogue.cells[req.cell]
        upstream = tuple(s for dep in req.depends_on for s in sinks[dep])
        for action in cell.actions:
            node_id = f"{ref}.{action.name}"
            key = node_idempotency_key(task_id, node_id)
            values = {"task_id": task_id, "node_id": node_id, "idempotency_key": key}
            deps = tuple(f"{ref}.{d}" for d in action.depends_on) or upstream
            nodes.append(
                PlannedNode(
                    node_id=node_id,
                    cell_ref=ref,
                    cell=cell.name,
                    action=action,
                    depends_on=deps,
                    path=_expand_template(action.path, values, req.payload, f"cells[{i}]"),
                    probe_path=_expand_template(
                        action.probe_path, values, req.payload, f"cells[{i}]"
                    ),
                    idempotency_key=key,
                )
            )
        sinks[ref] = [f"{ref}.{s}" for s in cell.sinks] if cell.actions else []
    if len(nodes) > limits.max_nodes:
        raise ResourceExhausted(
            f"the cells expand to {len(nodes)} steps, the limit is {limits.max_nodes}",
            field="cells",
        )
    return nodes
