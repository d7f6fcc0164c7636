"""The outputs of a task's nodes and its result in GetTask and WatchTask answers, read from
the executor (``dispo.libs.outputs``, ADR-0093). A view none of whose nodes recorded an
output costs no call; an executor that does not answer leaves the view answered, with
``outputs_unavailable`` set."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from dispo.gateway.convert import stored_status
from dispo.gateway.store import TERMINAL
from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.logging import get_logger
from dispo.libs.outputs import OutputsReader, OutputsUnavailable, TaskOutputs, fill, has_outputs

log = get_logger(__name__)


def _sizes(view: task_pb2.Task) -> tuple[int, ...]:
    return tuple(node.output_bytes for node in view.nodes)


class ViewOutputs:
    """Fills views with what ``reader`` reads (None: no executor to ask; every view with
    outputs is then answered ``outputs_unavailable``)."""

    def __init__(self, reader: OutputsReader | None) -> None:
        self.reader = reader

    async def _read(self, view: task_pb2.Task) -> TaskOutputs | None:
        """The outputs of ``view``'s task, or None (and the view marked) when unavailable."""
        try:
            if self.reader is None:
                raise OutputsUnavailable("the gateway has no executor address")
            read = await self.reader.read(view.task_id)
        except OutputsUnavailable as error:
            metrics.output_read("unavailable")
            log.warning("outputs unavailable", task_id=view.task_id, error=str(error))
            view.outputs_unavailable = True
            return None
        metrics.output_read("answered")
        return read

    async def complete(self, view: task_pb2.Task) -> task_pb2.Task:
        """``view`` (GetTask's) with its outputs and result."""
        if not has_outputs(view):
            return fill(view, None)
        read = await self._read(view)
        return fill(view, read) if read is not None else view

    async def follow(
        self, views: AsyncIterator[task_pb2.Task]
    ) -> AsyncGenerator[task_pb2.Task, None]:
        """``views`` (WatchTask's versions) with their outputs: read again only for a
        version whose nodes' output sizes changed since the last read, and for the terminal
        one (its result); a version in between shows the outputs read last."""
        read: TaskOutputs | None = None
        sizes: tuple[int, ...] | None = None
        async for view in views:
            if not has_outputs(view):
                yield fill(view, None)
                continue
            now = _sizes(view)
            if read is None or now != sizes or stored_status(view.status) in TERMINAL:
                fresh = await self._read(view)
                if fresh is not None:
                    read, sizes = fresh, now
                else:
                    read, sizes = None, None  # ask again with the next version
            if read is not None:
                fill(view, read)
            yield view
