"""Python SDK for Dispo: state intents as cells, submit them, follow them to the end.

    from dispo.sdk import Client, cells

    with Client("127.0.0.1:50051") as dispo:
        label = cells.update_quality_level(content_id="c-42", level=3)
        notify = cells.notify_owner(owner_id="u-7", message="label raised").after(label)
        task = dispo.submit("ecommerce", [label, notify], idempotency_key="c-42-raise")
        print(dispo.wait(task.task_id).status)       # "SUCCEEDED"

Your own code as a step: a :class:`Worker` serves the queues of ``kind: worker`` actions
(docs/workers.md)::

    worker = Worker("127.0.0.1:50052")

    @worker.action("tickets")
    async def open_ticket(ctx, payload):
        return {"ticket_id": await tracker.open(payload["name"], key=ctx.idempotency_key)}

    asyncio.run(worker.run())

Other languages use the protos (dispo.gateway.v1, dispo.executor.v1.WorkerService) directly.

The names below are the SDK's public surface; the modules whose names start with ``_`` are
its internals and may change between releases.
"""

import dispo.libs  # noqa: F401  (sets gRPC's fork mode before grpc loads)
from dispo.sdk import cells
from dispo.sdk._catalogue import CatalogueVersion
from dispo.sdk._client import AsyncClient, Client
from dispo.sdk._queues import WorkerQueue
from dispo.sdk._schedules import Firing, Schedule
from dispo.sdk._types import (
    TERMINAL,
    BulkAction,
    CellSpec,
    Completion,
    DispoError,
    NodeChange,
    NodeView,
    Signalled,
    Submitted,
    TaskEvent,
    TaskEventPage,
    TaskPage,
    TaskRequest,
    TaskSummary,
    TaskView,
    cell,
)
from dispo.sdk._worker import ProbeAnswer, RetryableError, RunContext, Worker

__all__ = [
    "AsyncClient",
    "BulkAction",
    "Client",
    "CellSpec",
    "Completion",
    "DispoError",
    "Firing",
    "NodeChange",
    "NodeView",
    "CatalogueVersion",
    "ProbeAnswer",
    "RetryableError",
    "RunContext",
    "Schedule",
    "Signalled",
    "Submitted",
    "TaskEvent",
    "TaskEventPage",
    "TaskPage",
    "TaskRequest",
    "TaskSummary",
    "TaskView",
    "TERMINAL",
    "Worker",
    "WorkerQueue",
    "cell",
    "cells",
]
