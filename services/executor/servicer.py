"""ExecutorService: the downstream registry and breaker states (operational view), and the
outputs a task's nodes recorded (ADR-0093)."""

from __future__ import annotations

import grpc
from dispo.executor.envelope import task_result
from dispo.executor.runner import Executor
from dispo.executor.states import TaskState
from dispo.executor.store import node_runs, task_runs
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.errors import InvalidArgument, NotFound
from dispo.libs.payload import json_payload
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

    async def GetOutputs(
        self, request: executor_pb2.GetOutputsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.GetOutputsResponse:
        task_id = request.task_id
        if not task_id:
            raise InvalidArgument("task_id", "required")
        if len(task_id) > 64:
            raise InvalidArgument("task_id", "longer than 64 characters")
        async with self.executor.db.connection() as conn:
            rows, _ = await task_runs.tasks_lock_many(conn, [task_id], lock=False, envelopes=True)
            row = rows.get(task_id)
            if row is None or row.envelope is None:
                raise NotFound(f"task {task_id} is not recorded by the executor")
            outputs = (await node_runs.node_outputs_many(conn, [(task_id, None)]))[task_id]
        out = executor_pb2.GetOutputsResponse()
        for node in row.envelope.nodes:  # in topological order
            if node.node_id in outputs:
                out.outputs.add(node_id=node.node_id, output=json_payload(outputs[node.node_id]))
        if row.status is TaskState.SUCCEEDED:
            out.result.CopyFrom(json_payload(task_result(row.envelope, outputs)))
        return out
