"""Whether a worker queue has a live worker, asked of the executor
(``ExecutorService.ListQueues``, ADR-0101): the health of a queue its demoted work waits
for, as a health URL is a downstream's."""

from __future__ import annotations

import grpc
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc


class QueueHealth:
    """ListQueues on ``channel`` (carrying the reconciler's service token), each call within
    ``timeout`` seconds."""

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
