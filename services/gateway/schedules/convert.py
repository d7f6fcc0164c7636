"""Schedules: proto <-> domain at the edge."""

from __future__ import annotations

from datetime import datetime, timedelta

from dispo.gateway.schedules.policy import (
    DEFAULT_CATCHUP_SECONDS,
    MAX_CATCHUP_SECONDS,
    MAX_DESCRIPTION,
    Overlap,
    Spec,
)
from dispo.gateway.schedules.store import FiringRow, ScheduleRow
from dispo.libs.api.gateway.v1 import schedule_pb2
from dispo.libs.errors import InvalidArgument
from dispo.libs.timestamps import set_timestamp

_OVERLAP = {
    schedule_pb2.OVERLAP_POLICY_UNSPECIFIED: Overlap.SKIP,
    schedule_pb2.OVERLAP_POLICY_SKIP: Overlap.SKIP,
    schedule_pb2.OVERLAP_POLICY_BUFFER_ONE: Overlap.BUFFER_ONE,
    schedule_pb2.OVERLAP_POLICY_ALLOW: Overlap.ALLOW,
}
_OVERLAP_VALUE = {
    Overlap.SKIP: schedule_pb2.OVERLAP_POLICY_SKIP,
    Overlap.BUFFER_ONE: schedule_pb2.OVERLAP_POLICY_BUFFER_ONE,
    Overlap.ALLOW: schedule_pb2.OVERLAP_POLICY_ALLOW,
}
_OUTCOME = {
    "submitted": schedule_pb2.FIRING_OUTCOME_SUBMITTED,
    "refused": schedule_pb2.FIRING_OUTCOME_REFUSED,
}


def spec_of(spec: schedule_pb2.ScheduleSpec) -> Spec:
    return Spec(
        cron=spec.cron.strip() if spec.WhichOneof("when") == "cron" else "",
        interval_seconds=spec.interval_seconds
        if spec.WhichOneof("when") == "interval_seconds"
        else 0,
        time_zone=spec.time_zone,
        jitter_seconds=spec.jitter_seconds,
    )


def overlap_of(definition: schedule_pb2.ScheduleDefinition) -> Overlap:
    return _OVERLAP[definition.overlap]


def catchup_of(definition: schedule_pb2.ScheduleDefinition) -> timedelta:
    return timedelta(seconds=definition.catchup_window_seconds or DEFAULT_CATCHUP_SECONDS)


def checked_definition(
    definition: schedule_pb2.ScheduleDefinition, business: str, now: datetime
) -> tuple[schedule_pb2.ScheduleDefinition, Spec]:
    """``definition`` as stored (the template's business set, the defaults written out) and
    its spec, once every field but the template's cells is checked (INVALID_ARGUMENT naming
    the first wrong one). The cells are the catalogue's to check, as a Submit's."""
    where = "definition"
    if not definition.HasField("spec"):
        raise InvalidArgument(f"{where}.spec", "required")
    spec = spec_of(definition.spec).check(f"{where}.spec", now)
    if not definition.HasField("template"):
        raise InvalidArgument(f"{where}.template", "required")
    if definition.template.idempotency_key:
        raise InvalidArgument(
            f"{where}.template.idempotency_key",
            "must be empty: each firing's is schedule:<id>:<fire time>",
        )
    if definition.overlap not in _OVERLAP:
        raise InvalidArgument(f"{where}.overlap", "not an overlap policy")
    if not 0 <= definition.catchup_window_seconds <= MAX_CATCHUP_SECONDS:
        raise InvalidArgument(
            f"{where}.catchup_window_seconds", f"0 to {MAX_CATCHUP_SECONDS} seconds"
        )
    if len(definition.description) > MAX_DESCRIPTION:
        raise InvalidArgument(f"{where}.description", f"at most {MAX_DESCRIPTION} characters")
    stored = schedule_pb2.ScheduleDefinition()
    stored.CopyFrom(definition)
    stored.template.business = business
    stored.overlap = _OVERLAP_VALUE[_OVERLAP[definition.overlap]]
    stored.catchup_window_seconds = int(catchup_of(definition).total_seconds())
    if spec.cron:
        stored.spec.cron = spec.cron
    return stored, spec


def firing_to_proto(firing: FiringRow, out: schedule_pb2.Firing) -> schedule_pb2.Firing:
    set_timestamp(out.fire_time, firing.fire_time)
    set_timestamp(out.fired_at, firing.fired_at)
    out.outcome = _OUTCOME[firing.outcome]
    out.task_id = firing.task_id or ""
    out.reason = firing.reason
    out.manual = firing.manual
    return out


def schedule_to_proto(
    row: ScheduleRow, firings: list[FiringRow], next_times: list[datetime]
) -> schedule_pb2.Schedule:
    out = schedule_pb2.Schedule(
        schedule_id=row.schedule_id,
        business=row.business,
        definition=schedule_pb2.ScheduleDefinition.FromString(row.definition),
        paused=row.paused,
        skipped_overlap=row.skipped_overlap,
        skipped_catchup=row.skipped_catchup,
    )
    for moment in next_times:
        set_timestamp(out.next_fire_times.add(), moment)
    if row.buffered_fire_at is not None:
        set_timestamp(out.buffered_fire_time, row.buffered_fire_at)
    for firing in firings:
        firing_to_proto(firing, out.recent_firings.add())
    set_timestamp(out.created_at, row.created_at)
    set_timestamp(out.updated_at, row.updated_at)
    return out
