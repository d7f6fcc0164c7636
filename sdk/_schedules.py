"""Schedules in the SDK: the ScheduleService calls of :class:`AsyncClient` and :class:`Client`
(docs/schedules.md), and what they answer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from dispo.libs.api.gateway.v1 import gateway_pb2, schedule_pb2, schedule_pb2_grpc
from dispo.libs.payload import from_struct
from dispo.sdk._types import CellSpec, TaskRequest, _time
from google.protobuf.message import Message

Reply = TypeVar("Reply")

OVERLAPS = ("skip", "buffer_one", "allow")


def _overlap_value(name: str) -> schedule_pb2.OverlapPolicy.ValueType:
    if name not in OVERLAPS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)}, not {name!r}")
    return schedule_pb2.OverlapPolicy.Value(f"OVERLAP_POLICY_{name.upper()}")


def _overlap_name(value: schedule_pb2.OverlapPolicy.ValueType) -> str:
    name = schedule_pb2.OverlapPolicy.Name(value).removeprefix("OVERLAP_POLICY_").lower()
    return "skip" if name == "unspecified" else name


def schedule_definition(
    business: str,
    cells: Sequence[CellSpec],
    *,
    cron: str = "",
    time_zone: str = "",
    interval_seconds: int = 0,
    jitter_seconds: int = 0,
    overlap: str = "skip",
    catchup_window_seconds: int = 0,
    callback_url: str = "",
    description: str = "",
) -> schedule_pb2.ScheduleDefinition:
    """The ScheduleDefinition of these arguments (a cron expression or an interval)."""
    spec = schedule_pb2.ScheduleSpec(time_zone=time_zone, jitter_seconds=jitter_seconds)
    if cron:
        spec.cron = cron
    if interval_seconds:
        spec.interval_seconds = interval_seconds
    return schedule_pb2.ScheduleDefinition(
        spec=spec,
        template=gateway_pb2.SubmitRequest(
            business=business, cells=[c.to_proto() for c in cells], callback_url=callback_url
        ),
        overlap=_overlap_value(overlap),
        catchup_window_seconds=catchup_window_seconds,
        description=description,
    )


def _cell(request: gateway_pb2.CellRequest) -> CellSpec:
    payload: dict[str, Any] = {}
    if request.WhichOneof("body") == "payload_json":
        payload = json.loads(request.payload_json)
    elif request.WhichOneof("body") == "payload":
        payload = from_struct(request.payload)
    return CellSpec(request.cell, payload, request.ref, list(request.depends_on))


@dataclass(frozen=True)
class Firing:
    """One firing of a schedule: its nominal fire time, and the task it submitted
    (``outcome`` "SUBMITTED") or why the template was refused (``outcome`` "REFUSED")."""

    fire_time: datetime | None
    fired_at: datetime | None
    outcome: str
    task_id: str
    reason: str
    manual: bool

    @classmethod
    def from_proto(cls, message: schedule_pb2.Firing) -> Firing:
        return cls(
            _time(message, "fire_time"),
            _time(message, "fired_at"),
            schedule_pb2.FiringOutcome.Name(message.outcome).removeprefix("FIRING_OUTCOME_"),
            message.task_id,
            message.reason,
            message.manual,
        )


@dataclass(frozen=True)
class Schedule:
    """A schedule as the gateway holds it: its spec, the task it submits, its policies and
    its state (next fire times, the last firings)."""

    schedule_id: str
    business: str
    template: TaskRequest
    cron: str
    time_zone: str
    interval_seconds: int
    jitter_seconds: int
    overlap: str
    catchup_window_seconds: int
    description: str
    paused: bool
    next_fire_times: tuple[datetime, ...]
    buffered_fire_time: datetime | None
    skipped_overlap: int
    skipped_catchup: int
    recent_firings: tuple[Firing, ...]
    created_at: datetime | None
    updated_at: datetime | None

    @classmethod
    def from_proto(cls, message: schedule_pb2.Schedule) -> Schedule:
        d = message.definition
        t = d.template
        return cls(
            schedule_id=message.schedule_id,
            business=message.business,
            template=TaskRequest(t.business, [_cell(c) for c in t.cells], "", t.callback_url),
            cron=d.spec.cron,
            time_zone=d.spec.time_zone,
            interval_seconds=d.spec.interval_seconds,
            jitter_seconds=d.spec.jitter_seconds,
            overlap=_overlap_name(d.overlap),
            catchup_window_seconds=d.catchup_window_seconds,
            description=d.description,
            paused=message.paused,
            next_fire_times=tuple(t.ToDatetime(tzinfo=UTC) for t in message.next_fire_times),
            buffered_fire_time=_time(message, "buffered_fire_time"),
            skipped_overlap=message.skipped_overlap,
            skipped_catchup=message.skipped_catchup,
            recent_firings=tuple(Firing.from_proto(f) for f in message.recent_firings),
            created_at=_time(message, "created_at"),
            updated_at=_time(message, "updated_at"),
        )


class AsyncScheduleCalls:
    """The ScheduleService calls of :class:`~dispo.sdk.AsyncClient`."""

    _call: Callable[..., Awaitable[Any]]
    _channel: Any

    async def _schedule(self, method: str, request: Message, timeout: float) -> Any:
        stub = schedule_pb2_grpc.ScheduleServiceStub(self._channel)
        return await self._call(getattr(stub, method), request, timeout)

    async def create_schedule(
        self,
        schedule_id: str,
        business: str,
        cells: Sequence[CellSpec],
        *,
        paused: bool = False,
        timeout: float = 10.0,
        **spec: Any,
    ) -> Schedule:
        """Create a schedule submitting ``cells`` for ``business``: ``cron`` (with
        ``time_zone``) or ``interval_seconds``; ``jitter_seconds``, ``overlap`` ("skip",
        "buffer_one", "allow"), ``catchup_window_seconds``, ``callback_url``,
        ``description``. The same call again answers the same schedule."""
        request = schedule_pb2.CreateScheduleRequest(
            schedule_id=schedule_id,
            definition=schedule_definition(business, cells, **spec),
            paused=paused,
        )
        reply = await self._schedule("CreateSchedule", request, timeout)
        return Schedule.from_proto(reply.schedule)

    async def update_schedule(
        self,
        schedule_id: str,
        business: str,
        cells: Sequence[CellSpec],
        *,
        timeout: float = 10.0,
        **spec: Any,
    ) -> Schedule:
        """Replace a schedule's definition, whole (the arguments of :meth:`create_schedule`)."""
        request = schedule_pb2.UpdateScheduleRequest(
            schedule_id=schedule_id, definition=schedule_definition(business, cells, **spec)
        )
        reply = await self._schedule("UpdateSchedule", request, timeout)
        return Schedule.from_proto(reply.schedule)

    async def get_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.GetScheduleRequest(schedule_id=schedule_id)
        return Schedule.from_proto((await self._schedule("GetSchedule", request, timeout)).schedule)

    async def list_schedules(
        self, *, business: str = "", page_size: int = 100, timeout: float = 10.0
    ) -> list[Schedule]:
        """Every schedule the token may see (of ``business`` when given), by id."""
        out: list[Schedule] = []
        token = ""
        while True:
            request = schedule_pb2.ListSchedulesRequest(business=business)
            request.page.page_size, request.page.page_token = page_size, token
            reply = await self._schedule("ListSchedules", request, timeout)
            out += [Schedule.from_proto(s) for s in reply.schedules]
            token = reply.page.next_page_token
            if not token:
                return out

    async def pause_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.PauseScheduleRequest(schedule_id=schedule_id)
        return Schedule.from_proto(
            (await self._schedule("PauseSchedule", request, timeout)).schedule
        )

    async def resume_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.ResumeScheduleRequest(schedule_id=schedule_id)
        reply = await self._schedule("ResumeSchedule", request, timeout)
        return Schedule.from_proto(reply.schedule)

    async def delete_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> None:
        request = schedule_pb2.DeleteScheduleRequest(schedule_id=schedule_id)
        await self._schedule("DeleteSchedule", request, timeout)

    async def trigger_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Firing:
        """Fire now: the firing, with its task."""
        request = schedule_pb2.TriggerScheduleRequest(schedule_id=schedule_id)
        return Firing.from_proto((await self._schedule("TriggerSchedule", request, timeout)).firing)


class ScheduleCalls:
    """The ScheduleService calls of :class:`~dispo.sdk.Client` (as :class:`AsyncScheduleCalls`)."""

    _call: Callable[..., Any]
    _channel: Any

    def _schedule(self, method: str, request: Message, timeout: float) -> Any:
        stub = schedule_pb2_grpc.ScheduleServiceStub(self._channel)
        return self._call(getattr(stub, method), request, timeout)

    def create_schedule(
        self,
        schedule_id: str,
        business: str,
        cells: Sequence[CellSpec],
        *,
        paused: bool = False,
        timeout: float = 10.0,
        **spec: Any,
    ) -> Schedule:
        request = schedule_pb2.CreateScheduleRequest(
            schedule_id=schedule_id,
            definition=schedule_definition(business, cells, **spec),
            paused=paused,
        )
        return Schedule.from_proto(self._schedule("CreateSchedule", request, timeout).schedule)

    def update_schedule(
        self,
        schedule_id: str,
        business: str,
        cells: Sequence[CellSpec],
        *,
        timeout: float = 10.0,
        **spec: Any,
    ) -> Schedule:
        request = schedule_pb2.UpdateScheduleRequest(
            schedule_id=schedule_id, definition=schedule_definition(business, cells, **spec)
        )
        return Schedule.from_proto(self._schedule("UpdateSchedule", request, timeout).schedule)

    def get_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.GetScheduleRequest(schedule_id=schedule_id)
        return Schedule.from_proto(self._schedule("GetSchedule", request, timeout).schedule)

    def list_schedules(
        self, *, business: str = "", page_size: int = 100, timeout: float = 10.0
    ) -> list[Schedule]:
        out: list[Schedule] = []
        token = ""
        while True:
            request = schedule_pb2.ListSchedulesRequest(business=business)
            request.page.page_size, request.page.page_token = page_size, token
            reply = self._schedule("ListSchedules", request, timeout)
            out += [Schedule.from_proto(s) for s in reply.schedules]
            token = reply.page.next_page_token
            if not token:
                return out

    def pause_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.PauseScheduleRequest(schedule_id=schedule_id)
        return Schedule.from_proto(self._schedule("PauseSchedule", request, timeout).schedule)

    def resume_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Schedule:
        request = schedule_pb2.ResumeScheduleRequest(schedule_id=schedule_id)
        return Schedule.from_proto(self._schedule("ResumeSchedule", request, timeout).schedule)

    def delete_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> None:
        self._schedule(
            "DeleteSchedule", schedule_pb2.DeleteScheduleRequest(schedule_id=schedule_id), timeout
        )

    def trigger_schedule(self, schedule_id: str, *, timeout: float = 10.0) -> Firing:
        request = schedule_pb2.TriggerScheduleRequest(schedule_id=schedule_id)
        return Firing.from_proto(self._schedule("TriggerSchedule", request, timeout).firing)
