"""What the executor says about the things demoted work waits for: whether a worker queue
has a live worker (``ExecutorService.ListQueues``, ADR-0101) and which downstreams its
circuit breaker holds OPEN (``ExecutorService.ListDownstreams``, ADR-0115). The first is a
queue's health, as a health URL is a downstream's; the second keeps a release from going
into a breaker that would demote it again at once."""

from __future__ import annotations

from datetime import datetime

import grpc
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.logging import get_logger
from dispo.libs.timestamps import from_timestamp

log = get_logger(__name__)


class ExecutorHealth:
    """ListQueues and ListDownstreams on ``channel`` (carrying the reconciler's service
    token), each call within ``timeout`` seconds."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float) -> None:
        self.stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        self.timeout = timeout

    async def check(self, queues: list[str]) -> list[tuple[bool, str]]:
        """Each queue's ``(healthy, why not)``: healthy while it has a live worker; none is
        when the executor cannot say."""
        if not queues:
            return []
        try:
            reply = await self.stub.ListQueues(
                executor_pb2.ListQueuesRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as error:
            why = f"the executor's ListQueues answered {error.code().name}: {error.details()}"
            return [(False, why)] * len(queues)
        live = {q.name for q in reply.queues if q.live}
        return [(True, "") if q in live else (False, "no live worker") for q in queues]

    async def open_breakers(self) -> dict[str, datetime | None]:
        """The downstreams whose breaker the executor holds OPEN, each with the end of its
        cooldown (None: not said). Empty when the executor cannot say: its breakers are then
        not known to be open, and the health URL alone decides."""
        try:
            reply = await self.stub.ListDownstreams(
                executor_pb2.ListDownstreamsRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as error:
            log.debug("executor breakers not known", code=error.code().name)
            return {}
        return {
            d.name: from_timestamp(d.open_until, d.HasField("open_until"))
            for d in reply.downstreams
            if d.breaker_state == executor_pb2.BREAKER_STATE_OPEN
        }
