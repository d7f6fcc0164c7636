"""``dispo.quarantine.v1.QuarantineService``: a service's quarantine over gRPC (list, get,
replay, discard), served by every service with a JetStream consumer beside its own API, and
the rows its outbox relay set aside (list, replay, discard: :mod:`dispo.libs.outbox`'s
``outbox_quarantined``, ``outbox_replay``, ``outbox_discard``) where it has an outbox.

A replay publishes the message again as the service's bus user: a subject that user may not
publish (another service consumes it too) is refused with FAILED_PRECONDITION."""

from __future__ import annotations

from typing import Any

import grpc
from dispo.libs import contracts
from dispo.libs.api.quarantine.v1 import quarantine_pb2 as pb
from dispo.libs.api.quarantine.v1 import quarantine_pb2_grpc
from dispo.libs.bus import Bus
from dispo.libs.db.driver import Database
from dispo.libs.errors import FailedPrecondition, InvalidArgument
from dispo.libs.outbox import QuarantinedRow, outbox_discard, outbox_quarantined, outbox_replay
from dispo.libs.paging import decode_page_token, encode_page_token, page_size
from dispo.libs.quarantine.store import Held, QuarantineStore
from dispo.libs.timestamps import to_timestamp
from sqlalchemy import Table

SERVICE_NAME = "dispo.quarantine.v1.QuarantineService"
Context = grpc.aio.ServicerContext[Any, Any]
MAX_PAGE_SIZE = 200
# Outbox rows one ReplayOutboxRows or DiscardOutboxRows takes at most.
MAX_OUTBOX_IDS = 100


def to_proto(held: Held) -> pb.QuarantinedMessage:
    return pb.QuarantinedMessage(
        id=held.id,
        consumer=held.consumer,
        stream=held.stream,
        subject=held.subject,
        stream_sequence=held.stream_sequence,
        payload=held.payload,
        error=held.error,
        deliveries=held.deliveries,
        replays=held.replays,
        first_seen=to_timestamp(held.first_seen),
        last_seen=to_timestamp(held.last_seen),
    )


def outbox_row_proto(row: QuarantinedRow) -> pb.QuarantinedOutboxRow:
    return pb.QuarantinedOutboxRow(
        id=row.id,
        subject=row.subject,
        msg_id=row.msg_id,
        size=row.size,
        attempts=row.attempts,
        last_error=row.last_error,
        created_at=to_timestamp(row.created_at),
        quarantined_at=to_timestamp(row.quarantined_at),
    )


def _outbox_ids(ids: Any) -> list[int]:
    if not ids:
        raise InvalidArgument("ids", "required: the ids of set-aside outbox rows")
    if len(ids) > MAX_OUTBOX_IDS:
        raise InvalidArgument("ids", f"at most {MAX_OUTBOX_IDS} at once, got {len(ids)}")
    for i, value in enumerate(ids):
        if value <= 0:
            raise InvalidArgument(f"ids[{i}]", f"must be a row id (positive), got {value}")
    return sorted(set(ids))


def _message_id(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("id", "required: the id of a quarantined message")
    return value


class QuarantineServicer(quarantine_pb2_grpc.QuarantineServiceServicer):
    def __init__(self, store: QuarantineStore, bus: Bus, service: str | None = None) -> None:
        self.store = store
        self.bus = bus
        # The service whose bus user replays (None: a user allowed every subject).
        self.service = service
        # The service's outbox and its database (None: the service has no outbox).
        self.outbox: tuple[Database, Table] | None = None

    def _outbox(self) -> tuple[Database, Table]:
        if self.outbox is None:
            raise FailedPrecondition(f"the {self.service or 'service'} has no outbox")
        return self.outbox

    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: Context
    ) -> pb.ListMessagesResponse:
        limit = page_size(request.page, maximum=MAX_PAGE_SIZE)
        after = decode_page_token(request.page.page_token, int)
        rows, total = await self.store.page(
            consumer=request.consumer, after_id=after[0] if after else None, limit=limit + 1
        )
        out = pb.ListMessagesResponse(total=total)
        out.messages.extend(to_proto(h) for h in rows[:limit])
        if len(rows) > limit:
            out.page.next_page_token = encode_page_token(rows[limit - 1].id)
        return out

    async def GetMessage(
        self, request: pb.GetMessageRequest, context: Context
    ) -> pb.QuarantinedMessage:
        return to_proto(await self.store.get(_message_id(request.id)))

    async def ReplayMessage(
        self, request: pb.ReplayMessageRequest, context: Context
    ) -> pb.ReplayMessageResponse:
        message_id = _message_id(request.id)
        if self.service is not None:
            held = await self.store.get(message_id)
            if not contracts.may_publish(self.service, held.subject):
                raise FailedPrecondition(
                    f"message {message_id} is on {held.subject}, which the {self.service}'s"
                    " bus user may not publish (another service consumes it too): only its"
                    " publishers put it on the bus; discard it here"
                )
        held, sequence = await self.store.replay(message_id, self.bus)
        return pb.ReplayMessageResponse(message=to_proto(held), new_stream_sequence=sequence)

    async def DiscardMessage(
        self, request: pb.DiscardMessageRequest, context: Context
    ) -> pb.DiscardMessageResponse:
        held = await self.store.discard(_message_id(request.id))
        return pb.DiscardMessageResponse(message=to_proto(held))

    async def ListOutboxRows(
        self, request: pb.ListOutboxRowsRequest, context: Context
    ) -> pb.ListOutboxRowsResponse:
        db, table = self._outbox()
        limit = page_size(request.page, maximum=MAX_PAGE_SIZE)
        after = decode_page_token(request.page.page_token, int)
        async with db.connection() as conn:
            rows = await outbox_quarantined(
                conn, table, after_id=after[0] if after else 0, limit=limit + 1
            )
        out = pb.ListOutboxRowsResponse()
        out.rows.extend(outbox_row_proto(r) for r in rows[:limit])
        if len(rows) > limit:
            out.page.next_page_token = encode_page_token(rows[limit - 1].id)
        return out

    async def ReplayOutboxRows(
        self, request: pb.OutboxRowsRequest, context: Context
    ) -> pb.OutboxRowsResponse:
        ids = _outbox_ids(request.ids)
        db, table = self._outbox()
        async with db.transaction() as conn:
            return pb.OutboxRowsResponse(changed=await outbox_replay(conn, table, ids))

    async def DiscardOutboxRows(
        self, request: pb.OutboxRowsRequest, context: Context
    ) -> pb.OutboxRowsResponse:
        ids = _outbox_ids(request.ids)
        db, table = self._outbox()
        async with db.transaction() as conn:
            return pb.OutboxRowsResponse(changed=await outbox_discard(conn, table, ids))


def add_to_server(servicer: QuarantineServicer, server: grpc.aio.Server) -> None:
    quarantine_pb2_grpc.add_QuarantineServiceServicer_to_server(servicer, server)
