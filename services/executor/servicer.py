"""ExecutorService: the downstream registry and breaker states (operational view)."""

from __future__ import annotations

import grpc
from dispo.executor.runner import Executor
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.proto_enums import from_short_name
from dispo.libs.timestamps import to_timestamp


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def ListDownstreams(
        self, request: executor_pb2.ListDownstreamsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListDownstreamsResponse:
        now = self.executor.clock.now()
        out = executor_pb2.ListDownstreamsResponse()
        for name, d in sorted(self.executor.registry.items()):
            breaker = self.executor.breakers[name]
            item = out.downstreams.add(
                name=name,
                base_url=d.base_url,
                timeout_ms=d.timeout_ms,
                max_concurrency=d.max_concurrency,
                health_url=d.health_url,
                breaker_state=from_short_name(executor_pb2.BreakerState, breaker.state.name),
                recent_failures=breaker.recent_failures(now),
            )
            if breaker.open_until is not None:
                item.open_until.CopyFrom(to_timestamp(breaker.open_until))
        return out
