"""The reconciler's consumers: task.fail and task.demote (recovery), task.create
(arbitration claims), task.erase (ADR-0113), the terminal task.status.<task_id>.<status> snapshots (the "finished"
fact; the server filters the others out, and the snapshots are recorded in batches, one
transaction per flush). Each decodes the envelope, refuses a malformed one for good, and
hands it to the domain."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.batcher import Batcher
from dispo.libs.bus import ACK, Bus, Consumer, Disposition, Handler, Nak, Term
from dispo.libs.contracts import tasks
from dispo.libs.erasure import erase_request
from dispo.libs.logging import bind_ids
from dispo.libs.tracing import current
from dispo.reconciler.arbitration import arbiter
from dispo.reconciler.completion import facts
from dispo.reconciler.context import Context
from dispo.reconciler.erasure import handle_erase
from dispo.reconciler.recovery import redrive
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg


def _decode(msg: Msg) -> task_pb2.Task | Term:
    try:
        env = task_pb2.Task.FromString(msg.data)
    except DecodeError:
        return Term("malformed task envelope")
    if not env.task_id:
        return Term("task envelope without task_id")
    return env


def handler(
    work: Callable[[task_pb2.Task], Awaitable[bool | None | int]],
) -> Callable[[Msg], Awaitable[Disposition]]:
    async def handle(msg: Msg) -> Disposition:
        env = _decode(msg)
        if isinstance(env, Term):
            return env
        bind_ids(task_id=env.task_id, business=env.business)
        outcome = await work(env)
        return Nak(0.2) if outcome is False else ACK

    return handle


# Terminal snapshots handled at once by the status consumer, and recorded by one flush.
FINISHED_BATCH = 256


def consumers(
    ctx: Context,
    bus: Bus,
    durable: str,
    guard: Callable[[Handler], Handler] = lambda h: h,
    ack_wait: float = 5.0,
    gather: float = 0.0,
) -> list[tuple[str, Consumer]]:
    """The five consumers, each handler wrapped by ``guard`` (the service's quarantine),
    each durable with ``ack_wait``, gathering messages for ``gather`` seconds once they keep
    up (:class:`~dispo.libs.bus.Consumer`: none of them is on a caller's path)."""

    def park(kind: str) -> Callable[[task_pb2.Task], Awaitable[bool]]:
        async def work(env: task_pb2.Task) -> bool:
            return not env.nodes or await redrive.intake(ctx, env, kind)

        return work

    finished: Batcher[tuple[task_pb2.Task, str | None], bool] = Batcher(
        "finished facts",
        lambda items: facts.on_statuses(ctx, [e for e, _ in items], [t for _, t in items]),
        max_items=FINISHED_BATCH,
        isolate=True,  # a terminal snapshot that cannot be recorded fails alone
        observe=metrics.group_commit_flushes("finished facts"),
    )

    async def finish(env: task_pb2.Task) -> None:  # recorded now or before: acked either way
        await finished.submit((env, current()))  # the trace the callback continues

    async def erase(msg: Msg) -> Disposition:
        request = erase_request(msg.data)
        if isinstance(request, str):
            return Term(request)
        bind_ids(task_id=request.task_id)
        return await handle_erase(ctx, request.task_id)

    return [
        (
            f"{tasks.TASK_ERASE} consumer",
            bus.consumer(
                tasks.TASKS.name,
                durable=f"{durable}-erase",
                subject=tasks.TASK_ERASE,
                ack_wait=ack_wait,
                handler=guard(erase),
            ),
        ),
        (
            f"{tasks.TASK_FAIL} consumer",
            bus.consumer(
                tasks.TASKS.name,
                durable=f"{durable}-fail",
                subject=tasks.TASK_FAIL,
                ack_wait=ack_wait,
                gather=gather,
                handler=guard(handler(park("fail"))),
            ),
        ),
        (
            f"{tasks.TASK_DEMOTE} consumer",
            bus.consumer(
                tasks.TASKS.name,
                durable=f"{durable}-demote",
                subject=tasks.TASK_DEMOTE,
                ack_wait=ack_wait,
                gather=gather,
                handler=guard(handler(park("demote"))),
            ),
        ),
        (
            "claims consumer",
            bus.consumer(
                tasks.TASKS.name,
                durable=f"{durable}-claims",
                subject=tasks.TASK_CREATE,
                ack_wait=ack_wait,
                gather=gather,
                handler=guard(handler(lambda env: arbiter.on_create(ctx, env))),
            ),
        ),
        (
            "status consumer",
            bus.consumer(
                tasks.TASK_STATUS.name,
                durable=f"{durable}-status",
                subject=tasks.TASK_STATUS_TERMINAL,
                ack_wait=ack_wait,
                gather=gather,
                handler=guard(handler(finish)),
                batch=FINISHED_BATCH,
            ),
        ),
    ]
