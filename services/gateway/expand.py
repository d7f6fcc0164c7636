"""Validate a submission against the catalogue and expand its cells into one DAG.

Pure domain: no I/O. Every refusal names the offending field; nothing is written when
this raises.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from dispo.libs import references
from dispo.libs.catalogue import ActionDef, Catalogue, topological
from dispo.libs.contracts.tasks import DEFAULT_PRIORITY
from dispo.libs.egress import AllowList, EgressRefused, check_callback
from dispo.libs.errors import FieldViolation, InvalidArgument, ResourceExhausted
from dispo.libs.payload import canonical_json, fits_type
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
    # A delayed start and a deadline as asked (None: not asked; ADR-0103).
    not_before: datetime | None = None
    deadline: datetime | None = None
    # The labels the Submit gave (its cells' label fields add theirs; ADR-0110).
    labels: dict[str, str] = field(default_factory=dict)
    # 1 (highest) to 5 within its business's share (ADR-0109).
    priority: int = DEFAULT_PRIORITY


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
    # The nodes whose outputs its call reads (ADR-0093), and whether its output is part
    # of the task's result.
    inputs: tuple[str, ...] = ()
    in_result: bool = False


def node_idempotency_key(task_id: str, node_id: str) -> str:
    return f"{task_id}/{node_id}"


_type_ok = fits_type


def _whole_reference(value: Any) -> bool:
    """A payload value that is one output reference and nothing else: it takes the
    referred value's type when resolved (checked against a declared output field in
    :func:`_check_references`)."""
    if not isinstance(value, str):
        return False
    try:
        found = references.find(value)
    except references.ReferenceError:
        return False
    return len(found) == 1 and found[0].text == value


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
            elif not _type_ok(spec.type, req.payload[spec.name]) and not _whole_reference(
                req.payload[spec.name]
            ):
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
    cell_inputs = _payload_inputs(sub, catalogue)
    order = topological(list(by_ref), {ref: r.depends_on for ref, (_, r) in by_ref.items()}) or []
    for ref in order:
        i, req = by_ref[ref]
        cell = catalogue.cells[req.cell]
        upstream = tuple(s for dep in req.depends_on for s in sinks[dep])
        own = {a.name: f"{ref}.{a.name}" for a in cell.actions}

        def full_id(node: str, own: dict[str, str] = own) -> str:
            return own.get(node, node)

        for action in cell.actions:
            node_id = f"{ref}.{action.name}"
            key = node_idempotency_key(task_id, node_id)
            values = {"task_id": task_id, "node_id": node_id, "idempotency_key": key}
            deps = tuple(f"{ref}.{d}" for d in action.depends_on) or upstream
            path = references.rewrite(
                _expand_template(action.path, values, req.payload, f"cells[{i}]"), full_id
            )
            reads = {full_id(r.node) for r in references.find(path)}
            nodes.append(
                PlannedNode(
                    node_id=node_id,
                    cell_ref=ref,
                    cell=cell.name,
                    action=action,
                    depends_on=deps,
                    path=path,
                    probe_path=_expand_template(
                        action.probe_path, values, req.payload, f"cells[{i}]"
                    ),
                    idempotency_key=key,
                    inputs=tuple(sorted(reads | {n for _, n in cell_inputs.get(ref, ())})),
                    in_result=action.name in cell.result_actions,
                )
            )
        sinks[ref] = [f"{ref}.{s}" for s in cell.sinks] if cell.actions else []
    if len(nodes) > limits.max_nodes:
        raise ResourceExhausted(
            f"the cells expand to {len(nodes)} steps, the limit is {limits.max_nodes}",
            field="cells",
        )
    _check_references(sub, catalogue, nodes, cell_inputs)
    return nodes


def _payload_inputs(sub: Submission, catalogue: Catalogue) -> dict[str, list[tuple[str, str]]]:
    """The output references in each cell's payload, by cell ref: ``(where, node id)``,
    the payload rewritten with full node ids (ADR-0093). A malformed one is refused,
    named."""
    found: dict[str, list[tuple[str, str]]] = {}
    for i, req in enumerate(sub.cells):
        ref = req.ref or req.cell
        cell = catalogue.cells[req.cell]
        own = {a.name: f"{ref}.{a.name}" for a in cell.actions}
        try:
            located = list(references.in_value(req.payload))
        except references.ReferenceError as error:
            where, _, reason = str(error).partition(": ")
            raise InvalidArgument(f"cells[{i}].payload.{where}", reason) from None
        if not located:
            continue
        found[ref] = [(where, own.get(r.node, r.node)) for where, r in located]

        def full_id(node: str, own: dict[str, str] = own) -> str:
            return own.get(node, node)

        req.payload = references.rewrite_value(req.payload, full_id)
        req.__dict__.pop("body", None)  # the cached canonical body: made again
    return found


def _check_references(
    sub: Submission,
    catalogue: Catalogue,
    nodes: list[PlannedNode],
    cell_inputs: dict[str, list[tuple[str, str]]],
) -> None:
    """Every node a cell's payload reads is upstream of every node of the cell, and, when
    its action declares its output fields, the field read is one of them (ADR-0093)."""
    by_id = {n.node_id: n for n in nodes}
    ancestors: dict[str, set[str]] = {}
    for node in nodes:  # topological: a node's dependencies come first
        ancestors[node.node_id] = set(node.depends_on).union(
            *(ancestors[d] for d in node.depends_on)
        )
    bad: list[FieldViolation] = []
    for i, req in enumerate(sub.cells):
        ref = req.ref or req.cell
        mine = [n for n in nodes if n.cell_ref == ref]
        for (where, node_id), (_, written) in zip(
            cell_inputs.get(ref, ()), references.in_value(req.payload), strict=True
        ):
            field = f"cells[{i}].payload.{where}"
            if node_id not in by_id:
                bad.append(FieldViolation(field, f"{written.text}: no node {node_id} in this task"))
                continue
            if any(node_id not in ancestors[n.node_id] for n in mine):
                bad.append(
                    FieldViolation(
                        field,
                        f"{written.text}: node {node_id} must run before every action of cell"
                        f" {ref!r} (make the cell depend on {by_id[node_id].cell_ref!r})",
                    )
                )
                continue
            declared = by_id[node_id].action.output_names
            if declared and written.field is not None and written.field not in declared:
                bad.append(
                    FieldViolation(
                        field, f"{written.text}: node {node_id} declares no output field"
                        f" {written.field!r}",
                    )
                )  # fmt: skip
    if bad:
        raise InvalidArgument(violations=bad)
