"""JetStream behaviour the services rely on: de-duplication, ack / nak / term, redelivery."""

import asyncio

from dispo.libs.bus import ACK, Nak, Term
from support import eventually


async def run_until(consumer, condition, timeout=15.0):
    task = asyncio.create_task(consumer.run())
    try:
        await eventually(condition, timeout=timeout, interval=0.02)
    finally:
        consumer.stop()
        await task


async def test_same_message_id_is_stored_once(bus):
    await bus.ensure_stream("TASKS", ["task.create"])

    first = await bus.publish("task.create", b"a", msg_id="t-1")
    second = await bus.publish("task.create", b"a", msg_id="t-1")
    third = await bus.publish("task.create", b"b", msg_id="t-2")

    assert not first.duplicate and second.duplicate and not third.duplicate
    assert (await bus.js.stream_info("TASKS")).state.messages == 2


async def test_ensure_stream_is_idempotent_and_adds_subjects(bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    await bus.ensure_stream("TASKS", ["task.create"])
    await bus.ensure_stream("TASKS", ["task.fail"])

    subjects = (await bus.js.stream_info("TASKS")).config.subjects
    assert sorted(subjects) == ["task.create", "task.fail"]


async def test_nak_redelivers_term_drops_and_errors_retry(bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    for body in (b"nak-once", b"term", b"raise-once"):
        await bus.publish("task.create", body, msg_id=body.decode())
    seen: list[bytes] = []

    async def handler(message):
        seen.append(message.data)
        if message.data == b"term":
            return Term("meaningless")
        first_time = seen.count(message.data) == 1
        if message.data == b"nak-once" and first_time:
            return Nak(0.05)
        if message.data == b"raise-once" and first_time:
            raise RuntimeError("boom")
        return ACK

    consumer = bus.consumer(
        "TASKS", durable="worker", subject="task.create", handler=handler, error_delay=0.05
    )
    await run_until(
        consumer, lambda: seen.count(b"nak-once") == 2 and seen.count(b"raise-once") == 2
    )

    assert seen.count(b"term") == 1
    info = await bus.js.consumer_info("TASKS", "worker")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_durable_consumers_share_work_without_duplicates(bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    for i in range(40):
        await bus.publish("task.create", str(i).encode(), msg_id=f"m{i}")
    handled: list[tuple[str, bytes]] = []

    def handler_for(name):
        async def handle(message):
            handled.append((name, message.data))
            await asyncio.sleep(0)
            return ACK

        return handle

    consumers = [
        bus.consumer(
            "TASKS", durable="shared", subject="task.create", handler=handler_for(n), batch=4
        )
        for n in ("a", "b")
    ]
    tasks = [asyncio.create_task(c.run()) for c in consumers]
    await eventually(lambda: len(handled) >= 40, timeout=15, interval=0.02, wanted="40 handled")
    for c in consumers:
        c.stop()
    await asyncio.gather(*tasks)

    bodies = [body for _, body in handled]
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(40)]


async def test_consumer_survives_a_nats_restart(infra, bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    seen: list[bytes] = []

    async def handler(message):
        seen.append(message.data)
        return ACK

    consumer = bus.consumer("TASKS", durable="worker", subject="task.create", handler=handler)
    task = asyncio.create_task(consumer.run())
    await bus.publish("task.create", b"before", msg_id="before")
    await eventually(lambda: b"before" in seen, timeout=15, interval=0.02, wanted="'before' seen")

    infra.nats.stop()
    infra.restart_nats()

    async def published() -> bool:
        try:
            await bus.publish("task.create", b"after", msg_id="after")
        except Exception:
            return False
        return True

    await eventually(published, timeout=20, interval=0.2, wanted="a publication after the restart")
    await eventually(lambda: b"after" in seen, timeout=20, wanted="'after' seen")
    consumer.stop()
    await task
    assert seen == [b"before", b"after"]
