"""Conversion between the task envelope (dispo.task.v1.Task) and executor domain objects."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from dispo.executor.domain import ActionSpec, NodeRun
from dispo.executor.states import NodeState
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.catalogue import DEFAULT_MAX_OUTPUT_BYTES
from dispo.libs.payload import canonical_json, payload_data, payload_problem
from dispo.libs.timestamps import from_timestamp, set_timestamp


def spec_from_proto(spec: task_pb2.ActionSpec) -> ActionSpec:
    return ActionSpec(
        spec.kind,
        spec.downstream,
        spec.method or "POST",
        spec.path,
        spec.probe_path,
        spec.idempotent,
        spec.timeout_ms,
        spec.max_output_bytes or DEFAULT_MAX_OUTPUT_BYTES,
        tuple((f.name, f.type, f.required) for f in spec.output_fields),
        tuple(spec.inputs),
        spec.queue,
        spec.signal,
        spec.timeout_seconds,
        spec.on_timeout,
        spec.default_output,
    )


def node_from_proto(node: task_pb2.Node) -> NodeRun:
    return NodeRun(
        node_id=node.node_id,
        depends_on=tuple(node.depends_on),
        spec=spec_from_proto(node.spec),
        idempotency_key=node.idempotency_key,
        status=NodeState.from_proto(node.status),
        attempts=node.retry.attempts,
        round_attempts=node.retry.round_attempts,
        not_before=from_timestamp(node.retry.not_before, node.retry.HasField("not_before")),
        retryable=node.retry.retryable,
        last_error=node.last_error,
        started_at=from_timestamp(node.started_at, node.HasField("started_at")),
        finished_at=from_timestamp(node.finished_at, node.HasField("finished_at")),
        cell_ref=node.cell_ref,
        cell=node.cell,
        action=node.action,
    )


def overlay(node: task_pb2.Node, run: NodeRun) -> None:
    """Write ``run``'s mutable state onto the envelope's node."""
    _overlay(node, run.status, run)


def overlay_row(node: task_pb2.Node, row: Any) -> None:
    """Write a ``node_runs`` row's state onto the envelope's node (as :func:`overlay`, without
    making a :class:`NodeRun` of it: a status snapshot needs no action spec)."""
    _overlay(node, NodeState(row.status), row)


def _overlay(node: task_pb2.Node, status: NodeState, run: Any) -> None:
    """``run``: a NodeRun or a node_runs row (the same attribute names)."""
    node.status = status.to_proto()
    node.retry.attempts = run.attempts
    node.retry.round_attempts = run.round_attempts
    node.retry.retryable = run.retryable
    if run.not_before is not None:
        set_timestamp(node.retry.not_before, run.not_before)
    else:
        node.retry.ClearField("not_before")
    node.last_error = run.last_error
    node.output_bytes = run.output_bytes or 0
    stamps: tuple[tuple[Literal["started_at", "finished_at"], datetime | None], ...] = (
        ("started_at", run.started_at),
        ("finished_at", run.finished_at),
    )
    for name, value in stamps:
        if value is not None:
            set_timestamp(getattr(node, name), value)
        else:
            node.ClearField(name)


EMPTY_BODY = b"{}"


def task_result(env: task_pb2.Task, outputs: Mapping[str, bytes]) -> bytes:
    """The task's result (ADR-0093): a JSON object of the outputs of its result nodes
    (``in_result``) by node id, as canonical JSON; a node without an output is left out."""
    members = [
        f"{canonical_json(node.node_id).decode()}:{outputs[node.node_id].decode()}"
        for node in sorted(env.nodes, key=lambda n: n.node_id)
        if node.in_result and node.node_id in outputs
    ]
    return ("{" + ",".join(members) + "}").encode()


def payload_of(task: task_pb2.Task, cell_ref: str) -> bytes:
    """The cell's payload as the JSON body to send, verbatim (``{}`` for none)."""
    if cell_ref in task.payloads:
        return payload_data(task.payloads[cell_ref])
    return EMPTY_BODY


KINDS = ("http", "noop", "worker", "wait")


def envelope_problem(env: task_pb2.Task) -> str | None:
    """Why a task.create envelope cannot be executed (None when it can): it is then
    terminated, never retried."""
    if not env.task_id or not env.nodes:
        return "envelope without task_id or nodes"
    ids = [n.node_id for n in env.nodes]
    if len(set(ids)) != len(ids) or not all(ids):
        return "node ids missing or repeated"
    known: set[str] = set()
    for node in env.nodes:  # topological order: dependencies come first
        missing = [d for d in node.depends_on if d not in known]
        if missing:
            return f"node {node.node_id} depends on {missing[0]!r}, not an earlier node"
        if node.spec.kind not in KINDS:
            return f"node {node.node_id} has unknown action kind {node.spec.kind!r}"
        if node.spec.kind == "http" and not node.spec.downstream:
            return f"node {node.node_id} has no downstream"
        if node.spec.kind == "worker" and not node.spec.queue:
            return f"node {node.node_id} has no queue"
        if node.spec.kind == "wait" and not (node.spec.signal and node.spec.timeout_seconds > 0):
            return f"node {node.node_id} has no signal or no timeout"
        known.add(node.node_id)
    for ref, payload in sorted(env.payloads.items()):
        problem = payload_problem(payload)
        if problem is not None:
            return f"cell {ref}: {problem}"
    return None
