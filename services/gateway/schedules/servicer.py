"""ScheduleService: thin; scopes the caller to its business, converts at the edge and calls
:class:`dispo.gateway.schedules.operations.Schedules`."""

from __future__ import annotations

import grpc
from dispo.gateway.schedules.operations import Schedules
from dispo.gateway.schedules.policy import check_schedule_id
from dispo.libs.api.gateway.v1 import schedule_pb2, schedule_pb2_grpc
from dispo.libs.auth import business_filter, require_visible
from dispo.libs.errors import InvalidArgument
from dispo.libs.paging import decode_page_token, encode_page_token, page_size

SERVICE_NAME = "dispo.gateway.v1.ScheduleService"


class ScheduleServicer(schedule_pb2_grpc.ScheduleServiceServicer):
    def __init__(self, schedules: Schedules, max_page_size: int) -> None:
        self.schedules = schedules
        self.max_page_size = max_page_size

    async def _visible(self, schedule_id: str) -> str:
        """``schedule_id`` if the caller may manage it: another business's schedule is
        NOT_FOUND, as one that does not exist."""
        check_schedule_id(schedule_id)
        row = await self.schedules.get_row(schedule_id)
        require_visible(row.business, f"no schedule {schedule_id!r}")
        return schedule_id

    async def CreateSchedule(
        self, request: schedule_pb2.CreateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.CreateScheduleResponse:
        check_schedule_id(request.schedule_id)
        if not request.HasField("definition"):
            raise InvalidArgument("definition", "required")
        business = business_filter(
            request.definition.template.business, "definition.template.business"
        )
        if not business:
            raise InvalidArgument("definition.template.business", "required")
        schedule = await self.schedules.create(
            request.schedule_id, business, request.definition, paused=request.paused
        )
        return schedule_pb2.CreateScheduleResponse(schedule=schedule)

    async def GetSchedule(
        self, request: schedule_pb2.GetScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.GetScheduleResponse:
        check_schedule_id(request.schedule_id)
        row = await self.schedules.get_row(request.schedule_id)
        require_visible(row.business, f"no schedule {request.schedule_id!r}")
        return schedule_pb2.GetScheduleResponse(schedule=await self.schedules.get(row))

    async def ListSchedules(
        self, request: schedule_pb2.ListSchedulesRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ListSchedulesResponse:
        size = page_size(request.page, maximum=self.max_page_size)
        business = business_filter(request.business, "business")
        decoded = decode_page_token(request.page.page_token, str)
        after = decoded[0] if decoded is not None else ""
        found = await self.schedules.list_schedules(business, after, size + 1)
        out = schedule_pb2.ListSchedulesResponse(schedules=found[:size])
        if len(found) > size:
            out.page.next_page_token = encode_page_token(found[size - 1].schedule_id)
        return out

    async def UpdateSchedule(
        self, request: schedule_pb2.UpdateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.UpdateScheduleResponse:
        schedule_id = await self._visible(request.schedule_id)
        if not request.HasField("definition"):
            raise InvalidArgument("definition", "required")
        schedule = await self.schedules.update(schedule_id, request.definition)
        return schedule_pb2.UpdateScheduleResponse(schedule=schedule)

    async def PauseSchedule(
        self, request: schedule_pb2.PauseScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.PauseScheduleResponse:
        schedule_id = await self._visible(request.schedule_id)
        return schedule_pb2.PauseScheduleResponse(schedule=await self.schedules.pause(schedule_id))

    async def ResumeSchedule(
        self, request: schedule_pb2.ResumeScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.ResumeScheduleResponse:
        schedule_id = await self._visible(request.schedule_id)
        return schedule_pb2.ResumeScheduleResponse(
            schedule=await self.schedules.resume(schedule_id)
        )

    async def DeleteSchedule(
        self, request: schedule_pb2.DeleteScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.DeleteScheduleResponse:
        await self.schedules.delete(await self._visible(request.schedule_id))
        return schedule_pb2.DeleteScheduleResponse()

    async def TriggerSchedule(
        self, request: schedule_pb2.TriggerScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedule_pb2.TriggerScheduleResponse:
        schedule_id = await self._visible(request.schedule_id)
        return schedule_pb2.TriggerScheduleResponse(
            firing=await self.schedules.trigger(schedule_id)
        )


def add_to_server(servicer: ScheduleServicer, server: grpc.aio.Server) -> None:
    schedule_pb2_grpc.add_ScheduleServiceServicer_to_server(servicer, server)
