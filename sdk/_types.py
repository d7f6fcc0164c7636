"""Plain types of the SDK, converted from the gateway's protos at the edge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import grpc
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.payload import canonical_json, payload_value
from dispo.libs.proto_enums import node_status_name, task_status_name
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass
class CellSpec:
    """One cell of a submission. ``ref`` names it within the submission (default: the cell
    name); ``after`` makes it wait for other cells."""

    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    ref: str = ""
    depends_on: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.ref or self.name

    def named(self, ref: str) -> CellSpec:
        self.ref = ref
        return self

    def after(self, *others: CellSpec | str) -> CellSpec:
        self.depends_on.extend(o if isinstance(o, str) else o.key for o in others)
        return self

    def to_proto(self) -> gateway_pb2.CellRequest:
        """The payload goes as exact JSON bytes (``payload_json``): integers stay integers.
        A NaN or infinite number raises ValueError here, before anything is sent."""
        return gateway_pb2.CellRequest(
            cell=self.name,
            ref=self.ref,
            payload_json=canonical_json(self.payload),
            depends_on=self.depends_on,
        )


def cell(name: str, /, *, ref: str = "", **payload: Any) -> CellSpec:
    """Any catalogue cell by name (for cells without a typed builder)."""
    return CellSpec(name, {k: v for k, v in payload.items() if v is not None}, ref)


@dataclass(frozen=True)
class TaskRequest:
    """One task of a ``submit_many``: what ``submit`` takes as its arguments."""

    business: str
    cells: Sequence[CellSpec]
    idempotency_key: str = ""
    callback_url: str = ""
    # A delayed start and a deadline (None: none).
    not_before: datetime | None = None
    deadline: datetime | None = None
    # What the task is about, to find it by (at most 16; docs/labels.md).
    labels: Mapping[str, str] | None = None
    # 1 (highest) to 5 within its business's share; 0: 3.
    priority: int = 0


@dataclass(frozen=True)
class Submitted:
    task_id: str
    status: str
    duplicate: bool


@dataclass(frozen=True)
class Signalled:
    """What ``signal`` answers: the task, the signal's id, and whether that id was
    recorded before (then nothing changed)."""

    task_id: str
    signal_id: str
    duplicate: bool


def signal_request(
    task_id: str,
    signal: str,
    payload: dict[str, Any] | None,
    signal_id: str,
    business: str,
    idempotency_key: str,
) -> gateway_pb2.SignalTaskRequest:
    """A SignalTask: the task by id, or by business and idempotency key; the payload as
    exact JSON bytes."""
    return gateway_pb2.SignalTaskRequest(
        task_id=task_id,
        business=business,
        idempotency_key=idempotency_key,
        signal=signal,
        payload_json=canonical_json(payload or {}),
        signal_id=signal_id,
    )


def signalled(reply: gateway_pb2.SignalTaskResponse) -> Signalled:
    return Signalled(reply.task_id, reply.signal_id, reply.duplicate)


def _time(message: Any, name: str) -> datetime | None:
    return getattr(message, name).ToDatetime(tzinfo=UTC) if message.HasField(name) else None


def _json(message: Any, name: str) -> Any:
    """A Payload field's JSON value (None when unset)."""
    return payload_value(getattr(message, name)) if message.HasField(name) else None


@dataclass(frozen=True)
class NodeView:
    node_id: str
    cell: str
    action: str
    status: str
    attempts: int
    last_error: str
    depends_on: tuple[str, ...]
    started_at: datetime | None
    finished_at: datetime | None
    # What its action returned, parsed from JSON (None: no output, or not read: see
    # TaskView.outputs_unavailable); output_bytes says whether it recorded one.
    output: Any = None
    output_bytes: int = 0

    @classmethod
    def from_proto(cls, node: task_pb2.Node) -> NodeView:
        return cls(
            node.node_id,
            node.cell,
            node.action,
            node_status_name(node.status),
            node.retry.attempts,
            node.last_error,
            tuple(node.depends_on),
            _time(node, "started_at"),
            _time(node, "finished_at"),
            _json(node, "output"),
            node.output_bytes,
        )


@dataclass(frozen=True)
class Completion:
    """The gateway's completion fact: when the task finished (caller-notified and reconciled
    are the reconciler's facts)."""

    finished_at: datetime | None
    callback_url: str

    @classmethod
    def from_proto(cls, c: gateway_pb2.Completion) -> Completion:
        return cls(_time(c, "finished_at"), c.callback_url)


@dataclass(frozen=True)
class TaskView:
    task_id: str
    business: str
    status: str
    status_reason: str
    cancel_requested: bool
    version: int
    nodes: tuple[NodeView, ...]
    raw: task_pb2.Task = field(repr=False, compare=False)
    # From GetTask only (None on WatchTask updates).
    completion: Completion | None = None
    # A SUCCEEDED task's result, parsed from JSON: the outputs of its result nodes by node
    # id (None while it runs, and when it ended otherwise).
    result: Any = None
    # The gateway could not read the outputs from the executor for this view: the nodes'
    # ``output`` and the ``result`` are missing; ask again.
    outputs_unavailable: bool = False
    # Its delayed start and its deadline (None: none).
    not_before: datetime | None = None
    deadline: datetime | None = None
    # Its labels (from GetTask only: empty on WatchTask updates).
    labels: Mapping[str, str] = field(default_factory=dict)
    # 1 (highest) to 5 within its business's share.
    priority: int = 3
    # When its payloads and outputs were erased, and by whom (None: not erased; from
    # GetTask and EraseTask only).
    erased_at: datetime | None = None
    erased_by: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def node(self, node_id: str) -> NodeView:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def node_statuses(self) -> dict[str, str]:
        return {n.node_id: n.status for n in self.nodes}

    @classmethod
    def from_proto(
        cls,
        task: task_pb2.Task,
        completion: gateway_pb2.Completion | None = None,
        labels: Mapping[str, str] | None = None,
        erasure: gateway_pb2.Erasure | None = None,
    ) -> TaskView:
        erased = erasure is not None and erasure.HasField("erased_at")
        return cls(
            task.task_id,
            task.business,
            task_status_name(task.status),
            task.status_reason,
            task.cancel_requested,
            task.version,
            tuple(NodeView.from_proto(n) for n in task.nodes),
            task,
            Completion.from_proto(completion) if completion is not None else None,
            _json(task, "result"),
            task.outputs_unavailable,
            _time(task, "not_before"),
            _time(task, "deadline"),
            dict(labels or {}),
            task.priority or 3,
            _time(erasure, "erased_at") if erased else None,
            erasure.erased_by if erasure is not None and erased else "",
        )


@dataclass(frozen=True)
class BulkAction:
    """A bulk action (:meth:`Client.cancel_by_filter`): who asked, what it matched, how far
    it is. A dry run's has no ``action_id`` and only ``matched``."""

    action_id: str
    kind: str
    actor: str
    reason: str
    state: str  # RUNNING, DONE ("" for a dry run)
    matched: int
    processed: int
    acted: int
    skipped: int
    created_at: datetime | None
    finished_at: datetime | None
    raw: gateway_pb2.BulkAction = field(repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.state == "DONE"

    @classmethod
    def from_proto(cls, action: gateway_pb2.BulkAction, matched: int | None = None) -> BulkAction:
        state = gateway_pb2.BulkActionState.Name(action.state).removeprefix("BULK_ACTION_STATE_")
        return cls(
            action.action_id,
            action.kind,
            action.actor,
            action.reason,
            "" if state == "UNSPECIFIED" else state,
            action.matched if matched is None else matched,
            action.processed,
            action.acted,
            action.skipped,
            _time(action, "created_at"),
            _time(action, "finished_at"),
            action,
        )


@dataclass(frozen=True)
class TaskSummary:
    """A row of :meth:`Client.list`: a task without its nodes, its fields named and typed
    as :class:`TaskView`'s (``status`` is the status name)."""

    task_id: str
    business: str
    status: str
    cancel_requested: bool
    node_count: int
    created_at: datetime | None
    updated_at: datetime | None
    raw: gateway_pb2.TaskSummary = field(repr=False, compare=False)
    # Its delayed start and its deadline (None: none).
    not_before: datetime | None = None
    deadline: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # 1 (highest) to 5 within its business's share.
    priority: int = 3

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def scheduled(self, now: datetime) -> bool:
        """ACCEPTED with a delayed start still ahead of ``now``."""
        return self.status == "ACCEPTED" and self.not_before is not None and self.not_before > now

    @classmethod
    def from_proto(cls, summary: gateway_pb2.TaskSummary) -> TaskSummary:
        return cls(
            summary.task_id,
            summary.business,
            task_status_name(summary.status),
            summary.cancel_requested,
            summary.node_count,
            _time(summary, "created_at"),
            _time(summary, "updated_at"),
            summary,
            _time(summary, "not_before"),
            _time(summary, "deadline"),
            dict(summary.labels),
            summary.priority or 3,
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of ListTasks: ``more`` when another follows, from ``next_page_token``."""

    tasks: tuple[TaskSummary, ...]
    next_page_token: str
    more: bool

    @classmethod
    def from_proto(cls, reply: gateway_pb2.ListTasksResponse) -> TaskPage:
        return cls(
            tuple(TaskSummary.from_proto(t) for t in reply.tasks),
            reply.page.next_page_token,
            reply.more,
        )


@dataclass(frozen=True)
class NodeChange:
    """How one node differs from the snapshot before (status names; ``old_status`` is ""
    in a task's first event)."""

    node_id: str
    old_status: str
    new_status: str
    old_attempts: int
    new_attempts: int
    last_error: str

    def describe(self) -> str:
        """In a line: ``step.call RUNNING → PENDING, attempts 1: refused: HTTP 503``."""
        moved = f"{self.old_status} → {self.new_status}" if self.old_status else self.new_status
        tried = f", attempts {self.new_attempts}" if self.new_attempts != self.old_attempts else ""
        error = f": {self.last_error}" if self.last_error else ""
        return f"{self.node_id} {moved}{tried}{error}"

    @classmethod
    def from_proto(cls, change: gateway_pb2.NodeChange) -> NodeChange:
        return cls(
            change.node_id,
            node_status_name(change.old_status) if change.old_status else "",
            node_status_name(change.new_status),
            change.old_attempts,
            change.new_attempts,
            change.last_error,
        )


@dataclass(frozen=True)
class TaskEvent:
    """One status snapshot of a task's history (ListTaskEvents): when the stream stored it,
    who published it, the task's status (``previous_status`` "" for the first) and the
    nodes that changed."""

    sequence: int
    time: datetime | None
    version: int
    publisher: str
    status: str
    status_reason: str
    previous_status: str
    changes: tuple[NodeChange, ...]
    raw: gateway_pb2.TaskEvent = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, event: gateway_pb2.TaskEvent) -> TaskEvent:
        return cls(
            event.sequence,
            _time(event, "time"),
            event.version,
            event.publisher,
            task_status_name(event.status),
            event.status_reason,
            task_status_name(event.previous_status) if event.previous_status else "",
            tuple(NodeChange.from_proto(c) for c in event.changes),
            event,
        )


@dataclass(frozen=True)
class TaskEventPage:
    """One page of a task's history: ``more`` when another was already stored;
    ``next_page_token`` continues after its last event (set on the last page too, for the
    events a running task publishes later)."""

    events: tuple[TaskEvent, ...]
    next_page_token: str
    more: bool

    @classmethod
    def from_proto(cls, reply: gateway_pb2.ListTaskEventsResponse) -> TaskEventPage:
        return cls(
            tuple(TaskEvent.from_proto(e) for e in reply.events),
            reply.page.next_page_token,
            reply.more,
        )


class DispoError(Exception):
    """A call the gateway refused: ``code`` (grpc.StatusCode) and per-field ``violations``."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        violations: dict[str, str],
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.violations = violations
        # Seconds after which the call may succeed, as its google.rpc.RetryInfo says (a
        # business over its Submit rate); None when it says nothing.
        self.retry_after = retry_after

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> DispoError:
        # A sync client's error is a grpc.Call; an AioRpcError has the same methods.
        call = cast(grpc.Call, error)
        status = rpc_status.from_call(call) if hasattr(error, "trailing_metadata") else None
        return cls(error.code(), error.details() or "", _violations(status), _retry_after(status))

    @classmethod
    def from_status(cls, status: status_pb2.Status) -> DispoError:
        """The error a call failing with ``status`` raises (an item SubmitEach refused)."""
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        return cls(code, status.message, _violations(status), _retry_after(status))


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _retry_after(status: status_pb2.Status | None) -> float | None:
    """The delay a status's ``google.rpc.RetryInfo`` asks for, in seconds."""
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay: float = info.retry_delay.ToTimedelta().total_seconds()
            return delay
    return None


def _violations(status: status_pb2.Status | None) -> dict[str, str]:
    """The fields a status's ``google.rpc.BadRequest`` names, with what is wrong with each."""
    violations: dict[str, str] = {}
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.update({v.field: v.description for v in bad.field_violations})
    return violations
