"""Worker queues in the SDK: what :meth:`AsyncClient.list_queues` and
:meth:`Client.list_queues` answer (the executor's ListQueues; docs/workers.md, "Queue health
and limits")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispo.libs.api.executor.v1 import executor_pb2
from dispo.sdk._types import _time

# Where `dispo up` serves the executor, whose ListQueues answers.
EXECUTOR_ADDRESS = "127.0.0.1:50052"


@dataclass(frozen=True)
class WorkerQueue:
    """One queue of worker actions: its workers seen within a run lease (``live_workers``;
    ``live`` while there is one), when one was last seen, its runs ``offered`` (waiting for
    a worker) and ``taken``, its ``max_concurrency`` and ``max_calls_per_second`` (0: no
    limit), and its runs taken in the last whole second (``taken_last_second``, counted
    when it has a ``max_calls_per_second``)."""

    name: str
    live_workers: int
    live: bool
    last_seen: datetime | None
    offered: int
    taken: int
    max_concurrency: int
    max_calls_per_second: int = 0
    taken_last_second: int = 0

    @classmethod
    def from_proto(cls, queue: executor_pb2.Queue) -> WorkerQueue:
        return cls(
            queue.name,
            queue.live_workers,
            queue.live,
            _time(queue, "last_seen"),
            queue.offered,
            queue.taken,
            queue.max_concurrency,
            queue.max_calls_per_second,
            queue.taken_last_second,
        )


def queues_of(reply: executor_pb2.ListQueuesResponse) -> list[WorkerQueue]:
    return [WorkerQueue.from_proto(queue) for queue in reply.queues]
