"""Conversion between the reconciler's rows and its protobuf messages (the edge only)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.errors import InvalidArgument
from dispo.libs.paging import decode_page_token, encode_page_token, invalid_page_token, page_size
from dispo.libs.proto_enums import from_short_name, short_name
from dispo.libs.timestamps import set_timestamp
from dispo.libs.validation import bounded
from dispo.reconciler import envelope as E
from dispo.reconciler.recovery.store import Filter, RecoveryRow
from dispo.reconciler.states import WORK_KIND_OF, WORK_KIND_STATES, RecoveryState, WorkKind

if TYPE_CHECKING:  # the stubs' generic wrapper; at run time protobuf's EnumTypeWrapper
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

V = TypeVar("V", bound=int)

MAX_PAGE = 500
# A filter's age reaches back at most a century (a larger one is no age a row can have).
MAX_AGE_SECONDS = 100 * 365 * 86400


def set_ts(message: Any, name: str, value: datetime | None) -> None:
    if value is not None:
        set_timestamp(getattr(message, name), value)


def state_to_proto(state: RecoveryState) -> pb.RecoveryState.ValueType:
    return from_short_name(pb.RecoveryState, state.name)


def _declared(enum_type: Any, value: int, field: str, what: str) -> str:
    """The short name of a value a request names: a declared one, not UNSPECIFIED."""
    try:
        name = short_name(enum_type, value)
    except ValueError:
        raise InvalidArgument(field, f"unknown {what} {value}") from None
    if name == "UNSPECIFIED":
        raise InvalidArgument(field, f"{enum_type.Name(value)} is not a {what}")
    return name


def state_from_proto(value: pb.RecoveryState.ValueType, field: str) -> RecoveryState:
    return RecoveryState[_declared(pb.RecoveryState, value, field, "recovery state")]


def _enum(enum_type: _EnumTypeWrapper[V], value: str) -> V:
    """The proto value of a domain value stored as its name, in either case (``fail``,
    ``PROBE``)."""
    return from_short_name(enum_type, value.upper())


def node_status(name: str) -> common_pb2.NodeStatus.ValueType:
    return _enum(common_pb2.NodeStatus, name)


def redrive_trigger(trigger: str) -> pb.RedriveTrigger.ValueType:
    return _enum(pb.RedriveTrigger, trigger)


def sweep_name(value: int) -> str:
    """The sweep a RunSweep request names (``all`` when unspecified)."""
    if value == pb.SWEEP_UNSPECIFIED:
        return "all"
    try:
        return short_name(pb.Sweep, value).lower()
    except ValueError:
        raise InvalidArgument("sweep", f"unknown sweep {value}") from None


def filter_from_proto(f: pb.RecoveryFilter) -> Filter:
    bounded(f.min_age_seconds, "filter.min_age_seconds", 0, MAX_AGE_SECONDS)
    if f.error_class and f.error_class not in E.ERROR_CLASSES:
        raise InvalidArgument("filter.error_class", f"one of {', '.join(E.ERROR_CLASSES)}")
    states = tuple(state_from_proto(s, f"filter.states[{i}]") for i, s in enumerate(f.states))
    return Filter(f.business, f.cell, f.downstream, f.error_class, f.min_age_seconds, states)


def work_kind_from_proto(value: pb.WorkKind.ValueType, field: str) -> WorkKind:
    return WorkKind[_declared(pb.WorkKind, value, field, "work kind")]


def work_filter_from_proto(f: pb.FailedWorkFilter) -> Filter:
    """The recovery filter of a ListFailedWork request: its kinds as recovery states."""
    bounded(f.min_age_seconds, "filter.min_age_seconds", 0, MAX_AGE_SECONDS)
    bounded(f.max_age_seconds, "filter.max_age_seconds", 0, MAX_AGE_SECONDS)
    if f.max_age_seconds and f.max_age_seconds < f.min_age_seconds:
        raise InvalidArgument(
            "filter.max_age_seconds",
            f"at least filter.min_age_seconds ({f.min_age_seconds}), or 0 for no bound",
        )
    kinds = [work_kind_from_proto(k, f"filter.kinds[{i}]") for i, k in enumerate(f.kinds)]
    states = tuple(s for k in (kinds or list(WorkKind)) for s in WORK_KIND_STATES[k])
    return Filter(
        business=f.business,
        downstream=f.downstream,
        min_age_seconds=f.min_age_seconds,
        max_age_seconds=f.max_age_seconds,
        states=states,
    )


def work_page(request: common_pb2.PageRequest) -> tuple[int, tuple[datetime, str] | None]:
    """(limit, key after which the page starts) of a keyset page of failed work."""
    size = page_size(request, maximum=MAX_PAGE)
    after = decode_page_token(request.page_token, datetime, str)
    return size, (after[0], after[1]) if after is not None else None


def work_to_proto(row: RecoveryRow, now: datetime) -> pb.FailedWork:
    return pb.FailedWork(
        kind=from_short_name(pb.WorkKind, WORK_KIND_OF[row.state].name),
        task=task_to_proto(row),
        age_seconds=max(0, int((now - row.parked_at).total_seconds())),
    )


def work_next_page(rows: list[RecoveryRow], limit: int) -> common_pb2.PageResponse:
    last = rows[-1] if rows and len(rows) == limit else None
    token = encode_page_token(last.parked_at, last.task_id) if last is not None else ""
    return common_pb2.PageResponse(next_page_token=token)


def page(request: common_pb2.PageRequest) -> tuple[int, int]:
    """(limit, offset) from a page request; the token is the offset of the next page."""
    size = page_size(request, maximum=MAX_PAGE)
    after = decode_page_token(request.page_token, int)
    offset = 0 if after is None else after[0]
    if offset < 0:
        raise invalid_page_token()
    return size, offset


def next_page(limit: int, offset: int, got: int) -> common_pb2.PageResponse:
    return common_pb2.PageResponse(
        next_page_token=encode_page_token(offset + got) if got == limit else ""
    )


def task_to_proto(row: RecoveryRow) -> pb.RecoveryTask:
    out = pb.RecoveryTask(
        task_id=row.task_id,
        business=row.business,
        state=state_to_proto(row.state),
        kind=_enum(pb.RecoveryKind, row.kind),
        cells=row.cells,
        downstreams=row.downstreams,
        error_class=row.error_class,
        reason=row.reason,
        generation=row.generation,
        redrives=row.redrives,
        releases=row.releases,
        undecided_nodes=[n.node_id for n in E.unknown(row.envelope)]
        if row.state is RecoveryState.AWAITING_DECISION
        else [],
    )
    for name in (
        "task_created_at",
        "first_parked_at",
        "parked_at",
        "next_redrive_at",
        "last_redrive_at",
    ):
        set_ts(out, name, getattr(row, name))
    return out


def history_to_proto(r: Any) -> pb.FailureRecord:
    out = pb.FailureRecord(
        kind=_enum(pb.RecoveryKind, r.kind),
        generation=r.generation,
        reason=r.reason,
        error_class=r.error_class,
        nodes=[pb.NodeFailure(**{**n, "status": node_status(n["status"])}) for n in r.nodes],
    )
    set_ts(out, "received_at", r.received_at)
    return out


def redrive_to_proto(r: Any) -> pb.RedriveRecord:
    out = pb.RedriveRecord(
        generation=r.generation,
        trigger=redrive_trigger(r.trigger),
        actor=r.actor,
        reason=r.reason,
        downstream=r.downstream,
        nodes_reset=list(r.nodes_reset),
    )
    set_ts(out, "at", r.at)
    return out


def settlement_to_proto(r: Any) -> pb.Settlement:
    out = pb.Settlement(
        node_id=r.node_id,
        generation=r.generation,
        method=_enum(pb.SettlementMethod, r.method),
        outcome=node_status(r.outcome),
        reason=r.reason,
        actor=r.actor,
    )
    set_ts(out, "at", r.at)
    return out


def downstream_to_proto(
    name: str, state: Any, depth: Any, rate: float, now: datetime
) -> pb.DownstreamState:
    out = pb.DownstreamState(name=name, release_rate_per_second=rate)
    if state is not None:
        out.healthy = bool(state.healthy)
        out.probed = state.healthy is not None
        out.probe_error = state.probe_error
        out.paused, out.paused_reason, out.paused_by = (
            state.paused,
            state.paused_reason,
            state.paused_by,
        )
        set_ts(out, "last_probe_at", state.last_probe_at)
    if depth is not None:
        out.demoted_depth, out.failed_depth = depth.demoted, depth.failed
        set_ts(out, "oldest_demoted_at", depth.oldest_demoted)
        set_ts(out, "oldest_failed_at", depth.oldest_failed)
        if depth.oldest_demoted is not None:
            out.oldest_demoted_age_seconds = int((now - depth.oldest_demoted).total_seconds())
        if depth.oldest_failed is not None:
            out.oldest_failed_age_seconds = int((now - depth.oldest_failed).total_seconds())
    return out


def completion_to_proto(r: Any) -> pb.Completion:
    out = pb.Completion(
        task_id=r.task_id,
        business=r.business,
        status=common_pb2.TaskStatus.Value(f"TASK_STATUS_{r.status.upper()}"),
        status_reason=r.status_reason,
        callback_url=r.callback_url,
        notify_state=_enum(pb.NotifyState, r.notify_state),
        notify_attempts=r.notify_attempts,
        notify_last_error=r.notify_last_error,
        reconcile_state=_enum(pb.ReconcileState, r.reconcile_state),
    )
    for name in ("finished_at", "notified_at", "reconciled_at"):
        set_ts(out, name, getattr(r, name))
    return out


def delivery_to_proto(r: Any) -> pb.Delivery:
    out = pb.Delivery(
        attempt=r.attempt, target=r.target, ok=r.ok, status_code=r.status_code or 0, error=r.error
    )
    set_ts(out, "at", r.at)
    return out


def finding_to_proto(r: Any) -> pb.Finding:
    out = pb.Finding(
        id=r.id,
        task_id=r.task_id,
        node_id=r.node_id,
        downstream=r.downstream,
        recorded_status=node_status(r.recorded_status),
        observed=r.observed,
        detail=r.detail,
    )
    set_ts(out, "found_at", r.found_at)
    return out


def verdict_to_proto(r: Any, compensations: list[Any]) -> pb.Verdict:
    out = pb.Verdict(
        id=r.id,
        target=r.target,
        effect=r.effect,
        winner_task_id=r.winner_task_id,
        loser_task_ids=list(r.loser_task_ids),
        reason=r.reason,
        compensations=[
            pb.Compensation(
                task_id=c.task_id,
                cell=c.cell,
                state=_enum(pb.CompensationState, c.state),
                submitted_task_id=c.submitted_task_id,
                error=c.error,
                attempts=c.attempts,
            )
            for c in compensations
            if c.verdict_id == r.id
        ],
    )
    set_ts(out, "decided_at", r.decided_at)
    return out
