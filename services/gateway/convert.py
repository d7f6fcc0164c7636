"""Proto <-> domain at the gateway's edge."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispo.gateway.expand import CellRequest, PlannedNode, Submission
from dispo.gateway.timing import Timing
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.catalogue import ActionDef
from dispo.libs.contracts.tasks import LOWEST_PRIORITY, priority_of
from dispo.libs.errors import FieldViolation, InvalidArgument
from dispo.libs.payload import (
    PayloadError,
    canonical_json,
    from_struct,
    json_payload,
    parse_json_object,
)
from dispo.libs.proto_enums import from_short_name, task_status_name
from dispo.libs.timestamps import from_timestamp, set_timestamp


def payload_from_proto(cell: gateway_pb2.CellRequest, where: str) -> dict[str, Any]:
    """The cell's payload, parsed once: the exact JSON bytes, or a Struct whose integral
    numbers become integers again. PayloadError's path is prefixed with the field."""
    form = cell.WhichOneof("body")
    try:
        if form == "payload_json":
            return parse_json_object(cell.payload_json)
        if form == "payload":
            return from_struct(cell.payload)
    except PayloadError as error:
        field = f"{where}.{form}" + (f".{error.path}" if error.path else "")
        raise PayloadError(field, error.reason) from None
    return {}


def signal_payload_from_proto(request: gateway_pb2.SignalTaskRequest) -> dict[str, Any]:
    """A SignalTask's payload, parsed once as a cell's is (a JSON object; none: ``{}``);
    INVALID_ARGUMENT naming ``payload`` (or ``payload_json``) and the member."""
    form = request.WhichOneof("body")
    try:
        if form == "payload_json":
            return parse_json_object(request.payload_json)
        if form == "payload":
            return from_struct(request.payload)
    except PayloadError as error:
        field = f"{form}" + (f".{error.path}" if error.path else "")
        raise InvalidArgument(field, error.reason) from None
    return {}


def submission_from_proto(
    request: gateway_pb2.SubmitRequest, business: str | None = None
) -> Submission:
    """The submission ``request`` states, for ``business`` when given (the business the
    caller's token acts for, which an empty ``request.business`` leaves to it)."""
    cells, bad = [], []
    for i, c in enumerate(request.cells):
        try:
            payload = payload_from_proto(c, f"cells[{i}]")
        except PayloadError as error:
            bad.append(FieldViolation(error.path, error.reason))
            payload = {}
        cells.append(CellRequest(c.cell, c.ref, payload, list(c.depends_on)))
    if not 0 <= request.priority <= LOWEST_PRIORITY:
        bad.append(FieldViolation("priority", "1 (highest) to 5 (lowest), or 0 for 3"))
    if bad:
        raise InvalidArgument(violations=bad)
    return Submission(
        business=request.business if business is None else business,
        cells=cells,
        idempotency_key=request.idempotency_key,
        callback_url=request.callback_url,
        not_before=_instant(request, "not_before"),
        deadline=_instant(request, "deadline"),
        labels=dict(request.labels),
        priority=priority_of(request.priority),
    )


# The instants a Timestamp may hold (0001-01-01 to 9999-12-31, as google.protobuf says).
_FIRST_SECOND, _LAST_SECOND = -62_135_596_800, 253_402_300_799


def _instant(request: gateway_pb2.SubmitRequest, field: str) -> datetime | None:
    """A Timestamp field of a Submit as an instant (None: unset); one outside the range a
    Timestamp may hold is INVALID_ARGUMENT naming the field."""
    if not request.HasField(field):  # type: ignore[arg-type]
        return None
    stamp = getattr(request, field)
    if not _FIRST_SECOND <= stamp.seconds <= _LAST_SECOND or not 0 <= stamp.nanos < 10**9:
        raise InvalidArgument(field, "not a valid timestamp")
    return from_timestamp(stamp, True)


def task_envelope(
    task_id: str,
    sub: Submission,
    nodes: list[PlannedNode],
    now: datetime,
    when: Timing | None = None,
) -> task_pb2.Task:
    """The task.create envelope of an accepted task (``when``: its delayed start and its
    deadline, ADR-0103)."""
    env = task_pb2.Task(
        task_id=task_id,
        business=sub.business,
        idempotency_key=sub.idempotency_key,
        callback_url=sub.callback_url,
        generation=0,
        status=common_pb2.TASK_STATUS_ACCEPTED,
        priority=sub.priority,
    )
    set_timestamp(env.created_at, now)
    set_timestamp(env.updated_at, now)
    when = when or Timing()
    if when.not_before is not None:
        set_timestamp(env.not_before, when.not_before)
    if when.deadline is not None:
        set_timestamp(env.deadline, when.deadline)
    for req in sub.cells:
        env.payloads[req.ref or req.cell].CopyFrom(json_payload(req.body))
    for node in nodes:
        a = node.action
        env.nodes.add(
            node_id=node.node_id,
            cell_ref=node.cell_ref,
            cell=node.cell,
            action=a.name,
            depends_on=list(node.depends_on),
            status=common_pb2.NODE_STATUS_PENDING,
            spec=task_pb2.ActionSpec(
                kind=a.kind,
                downstream=a.downstream,
                method=a.method,
                path=node.path,
                probe_path=node.probe_path,
                idempotent=a.idempotent,
                timeout_ms=a.timeout_ms,
                max_effect_seconds=a.max_effect_seconds,
                max_output_bytes=a.max_output_bytes,
                output_fields=output_fields(a),
                inputs=list(node.inputs),
                queue=a.queue,
                signal=a.signal,
                timeout_seconds=a.timeout_seconds,
                on_timeout=a.on_timeout,
                default_output=canonical_json(a.default_output)
                if a.default_output is not None
                else b"",
            ),
            idempotency_key=node.idempotency_key,
            in_result=node.in_result,
        )
    return env


def output_fields(action: ActionDef) -> list[task_pb2.OutputField]:
    """The output fields ``action`` declares, as the protos carry them."""
    return [
        task_pb2.OutputField(name=f.name, type=f.type, required=f.required) for f in action.output
    ]


def stored_status(value: common_pb2.TaskStatus.ValueType) -> str:
    """The stored form of a task status: its name without the prefix, lower-case (ADR 0017)."""
    return task_status_name(value).lower()


def status_value(name: str) -> common_pb2.TaskStatus.ValueType:
    return from_short_name(common_pb2.TaskStatus, name.upper())
