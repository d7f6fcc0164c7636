"""A task's node outputs and result, read from the executor's record
(``ExecutorService.GetOutputs``, ADR-0093): the gateway fills them into its task views, the
reconciler puts the result in a completion callback's body.

    reader = OutputsReader(rt.channel(settings.executor_address), timeout=2.0)
    read = await reader.read(view.task_id) if has_outputs(view) else None  # OutputsUnavailable
    fill(view, read)

Only a task one of whose nodes recorded an output (``Node.output_bytes``) costs a call: a
SUCCEEDED task without any has the empty result, known without asking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.payload import json_payload

# The result of a SUCCEEDED task none of whose nodes recorded an output.
EMPTY_RESULT = b"{}"


class OutputsUnavailable(Exception):
    """The executor did not answer GetOutputs (unreachable, too slow, or refusing)."""


@dataclass(frozen=True)
class TaskOutputs:
    """What GetOutputs answered: each output by node id, and the result (None unless the
    task SUCCEEDED in the executor's record)."""

    outputs: dict[str, common_pb2.Payload] = field(default_factory=dict)
    result: common_pb2.Payload | None = None


def has_outputs(task: task_pb2.Task) -> bool:
    """One of ``task``'s nodes recorded an output (only then is the executor asked)."""
    return any(node.output_bytes > 0 for node in task.nodes)


def succeeded(task: task_pb2.Task) -> bool:
    return task.status == common_pb2.TASK_STATUS_SUCCEEDED


class OutputsReader:
    """GetOutputs on ``channel`` (carrying the caller's service token), each call within
    ``timeout`` seconds."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float) -> None:
        self.stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        self.timeout = timeout

    async def read(self, task_id: str) -> TaskOutputs:
        try:
            reply = await self.stub.GetOutputs(
                executor_pb2.GetOutputsRequest(task_id=task_id), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as error:
            raise OutputsUnavailable(
                f"the executor's GetOutputs answered {error.code().name}: {error.details()}"
            ) from None
        return TaskOutputs(
            {o.node_id: o.output for o in reply.outputs},
            reply.result if reply.HasField("result") else None,
        )

    async def result(self, task: task_pb2.Task) -> common_pb2.Payload | None:
        """The result of ``task`` as its snapshot stands: None unless it SUCCEEDED; the
        empty result without a call when none of its nodes recorded an output."""
        if not succeeded(task):
            return None
        if not has_outputs(task):
            return json_payload(EMPTY_RESULT)
        read = await self.read(task.task_id)
        if read.result is None:  # the executor's record is behind the snapshot: ask again
            raise OutputsUnavailable(f"the executor has no result of task {task.task_id} yet")
        return read.result


def fill(view: task_pb2.Task, read: TaskOutputs | None) -> task_pb2.Task:
    """``view`` with each node's ``output`` and its ``result`` as ``read`` has them (None:
    none of its nodes recorded an output, so a SUCCEEDED task has the empty result)."""
    if read is None:
        if succeeded(view):
            view.result.CopyFrom(json_payload(EMPTY_RESULT))
        return view
    for node in view.nodes:
        output = read.outputs.get(node.node_id)
        if output is not None:
            node.output.CopyFrom(output)
    if read.result is not None and succeeded(view):
        view.result.CopyFrom(read.result)
    return view
