"""What the Schedules pages show of a schedule: plain values from the gateway's
ScheduleService replies, for the templates."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from dispo.libs.api.gateway.v1 import schedule_pb2 as spb
from google.protobuf.timestamp_pb2 import Timestamp


def _at(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


@dataclass(frozen=True)
class FiringRow:
    fire_time: datetime
    fired_at: datetime
    outcome: str  # "SUBMITTED" or "REFUSED"
    task_id: str
    reason: str
    manual: bool


@dataclass(frozen=True)
class ScheduleRow:
    schedule_id: str
    business: str
    when: str  # "0 2 * * * (Europe/Berlin)" or "every 900 s"
    jitter_seconds: int
    overlap: str
    catchup_window_seconds: int
    cells: str
    description: str
    paused: bool
    next_fire_times: list[datetime]
    buffered_fire_time: datetime | None
    skipped_overlap: int
    skipped_catchup: int
    firings: list[FiringRow]


def schedule_row(s: spb.Schedule) -> ScheduleRow:
    d = s.definition
    if d.spec.WhichOneof("when") == "interval_seconds":
        when = f"every {d.spec.interval_seconds} s"
    else:
        when = f"{d.spec.cron} ({d.spec.time_zone or 'UTC'})"
    return ScheduleRow(
        s.schedule_id,
        s.business,
        when,
        d.spec.jitter_seconds,
        spb.OverlapPolicy.Name(d.overlap).removeprefix("OVERLAP_POLICY_").lower(),
        d.catchup_window_seconds,
        ", ".join(c.ref or c.cell for c in d.template.cells),
        d.description,
        s.paused,
        [_at(t) for t in s.next_fire_times],
        _at(s.buffered_fire_time) if s.HasField("buffered_fire_time") else None,
        s.skipped_overlap,
        s.skipped_catchup,
        [
            FiringRow(
                _at(f.fire_time),
                _at(f.fired_at),
                spb.FiringOutcome.Name(f.outcome).removeprefix("FIRING_OUTCOME_"),
                f.task_id,
                f.reason,
                f.manual,
            )
            for f in s.recent_firings
        ],
    )
