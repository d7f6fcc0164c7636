"""The streams keep a message until every consumer that must see it has acknowledged it, and
no longer (ADR-0092): real nats-server, the declared streams as the services ensure them."""

from __future__ import annotations

import pytest
from dispo.libs.bus import Bus
from dispo.libs.contracts import Durable, tasks
from dispo.libs.settings import StreamSettings
from nats.js.api import DiscardPolicy, RetentionPolicy
from nats.js.errors import ServiceUnavailableError
from support import eventually


async def messages(bus: Bus, stream: str = "TASKS") -> int:
    return (await bus.js.stream_info(stream)).state.messages


async def take_and_ack(bus: Bus, durable: str, count: int) -> list[bytes]:
    """Pull ``count`` messages from the durable and acknowledge each, as its service does."""
    sub = await bus.js.pull_subscribe_bind(durable=durable, stream="TASKS")
    taken: list[bytes] = []
    while len(taken) < count:
        for message in await sub.fetch(count - len(taken), timeout=5):
            await message.ack_sync()
            taken.append(message.data)
    await sub.unsubscribe()
    return taken


async def test_tasks_keeps_a_create_until_both_its_consumers_acknowledged_it(bus):
    await tasks.ensure_task_streams(bus, "gateway")  # the durables exist before any publication
    await bus.publish(tasks.TASK_CREATE, b"task-1", msg_id="t-1")
    await bus.publish(tasks.TASK_CREATE, b"task-2", msg_id="t-2")
    await bus.publish(tasks.TASK_FAIL, b"failed-1", msg_id="t-1:fail:g0")
    assert await messages(bus) == 3

    # The executor took both creates: the reconciler's claims consumer has not yet.
    assert await take_and_ack(bus, "executor", 2) == [b"task-1", b"task-2"]
    assert await messages(bus) == 3

    await take_and_ack(bus, "reconciler-claims", 2)
    # Acknowledged by every durable on task.create: gone. The failure nobody took stays.
    await eventually(lambda: messages(bus), lambda n: n == 1, timeout=10)
    info = await bus.js.stream_info("TASKS", subjects_filter=">")
    assert info.state.subjects == {tasks.TASK_FAIL: 1}
    assert await take_and_ack(bus, "reconciler-fail", 1) == [b"failed-1"]
    await eventually(lambda: messages(bus), lambda n: n == 0, timeout=10)


async def test_a_stream_made_before_is_brought_to_its_declaration_without_losing_work(bus):
    # TASKS as an earlier version made it: kept for ever, no limit; the durables it had.
    await bus.ensure_stream("TASKS", list(tasks.TASKS.subjects))
    for durable in tasks.TASK_DURABLES:
        await bus.ensure_durable("TASKS", durable.name, durable.filters)
    for n in range(3):
        await bus.publish(tasks.TASK_CREATE, b"old-%d" % n, msg_id=f"old-{n}")
    await take_and_ack(bus, "executor", 3)
    await take_and_ack(bus, "reconciler-claims", 1)  # the claims consumer is behind
    assert await messages(bus) == 3  # limits retention: nothing leaves

    await tasks.TASKS.ensure(bus, settings=StreamSettings(tasks_max_bytes=1 << 20))

    config = (await bus.js.stream_info("TASKS")).config
    assert config.retention == RetentionPolicy.INTEREST
    assert (config.discard, config.max_bytes) == (DiscardPolicy.NEW, 1 << 20)
    # What every consumer acknowledged is gone; what the claims consumer has not, kept.
    await eventually(lambda: messages(bus), lambda n: n == 2, timeout=10)
    assert await take_and_ack(bus, "reconciler-claims", 2) == [b"old-1", b"old-2"]


async def test_a_full_stream_refuses_new_messages_and_keeps_the_old(bus):
    await tasks.TASKS.ensure(bus, settings=StreamSettings(tasks_max_bytes=4096))
    published = 0
    with pytest.raises(ServiceUnavailableError):  # 503: the outbox keeps the row and retries
        for n in range(100):
            await bus.publish(tasks.TASK_CREATE, b"x" * 500, msg_id=f"t-{n}")
            published += 1
    assert 0 < published < 100
    assert await messages(bus) == published


async def test_a_limit_below_what_the_stream_holds_is_not_applied(bus):
    await tasks.TASKS.ensure(bus, settings=StreamSettings(tasks_max_bytes=1 << 20))
    for n in range(10):
        await bus.publish(tasks.TASK_CREATE, b"x" * 500, msg_id=f"t-{n}")

    # The server would make room by deleting the oldest, unacknowledged, messages.
    await tasks.TASKS.ensure(bus, settings=StreamSettings(tasks_max_bytes=1024))

    info = await bus.js.stream_info("TASKS")
    assert (info.state.messages, info.config.max_bytes) == (10, 1 << 20)


async def test_a_service_that_only_consumes_a_stream_leaves_its_configuration(bus):
    await bus.ensure_stream("TASK_STATUS", [tasks.TASK_STATUS_ALL])  # as made before

    await tasks.ensure_task_streams(bus, "gateway")  # the gateway only consumes TASK_STATUS

    config = (await bus.js.stream_info("TASK_STATUS")).config
    assert (config.discard, config.max_age or 0) == (DiscardPolicy.OLD, 0)
    await tasks.ensure_task_streams(bus, "executor")  # its publisher brings it to 7 days
    config = (await bus.js.stream_info("TASK_STATUS")).config
    assert (config.discard, config.max_age) == (DiscardPolicy.NEW, tasks.STATUS_MAX_AGE)


def test_the_declared_durables_are_those_the_services_consume_by_default():
    from dispo.executor.settings import ExecutorSettings
    from dispo.intelligence.settings import IntelligenceSettings
    from dispo.libs.contracts import evaluations
    from dispo.reconciler.settings import ReconcilerSettings

    executor, reconciler = ExecutorSettings().durable, ReconcilerSettings().durable
    assert {d.name: d.filters for d in tasks.TASKS.durables} == {
        executor: (tasks.TASK_CREATE,),
        f"{executor}-cancel": (tasks.TASK_CANCEL,),
        f"{executor}-close": (tasks.TASK_CLOSE,),
        f"{executor}-signal": (tasks.TASK_SIGNAL,),
        f"{executor}-erase": (tasks.TASK_ERASE,),
        f"{reconciler}-erase": (tasks.TASK_ERASE,),
        f"{reconciler}-claims": (tasks.TASK_CREATE,),
        f"{reconciler}-fail": (tasks.TASK_FAIL,),
        f"{reconciler}-demote": (tasks.TASK_DEMOTE,),
    }
    [durable] = evaluations.EVALUATIONS.durables
    assert durable == Durable(IntelligenceSettings().event_durable, (evaluations.EVALUATION_ALL,))
