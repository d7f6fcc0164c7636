"""The seal a FAILED task's erasure asks first (ADR-0114): the reconciler, which alone runs
a FAILED task again, refuses from then on to resume it. EraseTask asks it, inside the
transaction that holds the task's row, before it writes anything: without the seal nothing
is erased.

    seals = ReconcilerSeals(rt.channel(settings.reconciler_address), timeout=5.0)
    await seals.seal(task_id, erased_by)  # FailedPrecondition (being resumed), Unavailable
"""

from __future__ import annotations

from typing import Protocol

import grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2, reconciler_pb2_grpc
from dispo.libs.errors import FailedPrecondition, FieldViolation, Unavailable


class Seals(Protocol):
    async def seal(self, task_id: str, erased_by: str) -> None:
        """Seal ``task_id``; FailedPrecondition naming ``task_id`` while it is being
        resumed, Unavailable when the seal could not be asked."""


def _not_sealed(task_id: str, why: str) -> Unavailable:
    return Unavailable(
        f"task {task_id} was not erased: {why}; nothing changed, erase it again once the"
        " reconciler answers"
    )


class ReconcilerSeals:
    """SealTask on ``channel`` (carrying the gateway's service token), within ``timeout``."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float) -> None:
        self.stub = reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        self.timeout = timeout

    async def seal(self, task_id: str, erased_by: str) -> None:
        try:
            await self.stub.SealTask(
                reconciler_pb2.SealTaskRequest(task_id=task_id, erased_by=erased_by),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                message = error.details() or f"task {task_id} is being resumed"
                raise FailedPrecondition(message, [FieldViolation("task_id", message)]) from None
            raise _not_sealed(
                task_id,
                f"the reconciler did not seal it against a resume"
                f" ({error.code().name}: {error.details()})",
            ) from None


class NoSeals:
    """A gateway with no reconciler to ask: a FAILED task is not erased."""

    async def seal(self, task_id: str, erased_by: str) -> None:
        raise _not_sealed(task_id, "no reconciler was given to seal it against a resume")
