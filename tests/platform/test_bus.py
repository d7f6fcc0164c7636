"""JetStream behaviour the services rely on: de-duplication, ack / nak / term, redelivery."""

import asyncio
import json
import subprocess

import pytest
from dispo.libs.bus import ACK, Bus, Nak, StreamUnavailable, Term
from dispo.libs.process import free_port, wait_tcp
from dispo.tools.stack.nats import nats_server_binary
from nats.aio.subscription import Subscription
from nats.js.errors import NoStreamResponseError
from support import eventually


def recording():
    """A handler that acknowledges every message, and the list of what it was given."""
    seen: list[bytes] = []

    async def handler(message):
        seen.append(message.data)
        return ACK

    return seen, handler


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


@pytest.mark.parametrize("gather", [0.0, 0.1], ids=["standing", "gathering"])
async def test_consumer_survives_a_nats_restart(infra, bus, gather):
    await bus.ensure_stream("TASKS", ["task.create"])
    seen, handler = recording()

    consumer = bus.consumer(
        "TASKS", durable="worker", subject="task.create", handler=handler, gather=gather
    )
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


async def test_a_consumer_keeping_up_leaves_a_pull_request_standing(bus):
    """Messages that come one at a time to a consumer that keeps up are delivered on a
    standing pull request, not one request each; once that request expires it is asked
    again, and nothing is missed or delivered twice."""
    await bus.ensure_stream("TASKS", ["task.create"])
    seen, handler = recording()

    consumer = bus.consumer(
        "TASKS", durable="worker", subject="task.create", handler=handler, batch=8
    )
    task = asyncio.create_task(consumer.run())
    requests: list[bytes] = []

    async def counted(message):
        requests.append(message.data)

    watch = await bus.nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.TASKS.worker", cb=counted)
    try:
        await bus.publish("task.create", b"m0", msg_id="m0")
        await eventually(lambda: b"m0" in seen, timeout=15, interval=0.01, wanted="m0 seen")
        requests.clear()
        for i in range(1, 31):
            await bus.publish("task.create", f"m{i}".encode(), msg_id=f"m{i}")
            await eventually(lambda i=i: len(seen) > i, timeout=15, interval=0.005)
        await bus.nc.flush()
        assert len(requests) < 15, requests  # asked for each message, it would be 30 or more
        await asyncio.sleep(1.5)  # the standing request expires
        await bus.publish("task.create", b"late", msg_id="late")
        await eventually(lambda: b"late" in seen, timeout=15, wanted="'late' seen")
    finally:
        await watch.unsubscribe()
        consumer.stop()
        await task
    assert seen == [f"m{i}".encode() for i in range(31)] + [b"late"]


async def test_a_busy_consumer_reads_its_backlog_without_a_wait_per_message(bus, monkeypatch):
    """A consumer behind its stream takes what is stored with requests that do not wait and
    reads each answer off the subscription's queue: it waits on the queue (nats-py's
    ``next_msg``, a task each) at most once per request, not once per message."""
    await bus.ensure_stream("TASKS", ["task.create"])
    expected = [f"m{i}".encode() for i in range(200)]
    for i, data in enumerate(expected):
        await bus.publish("task.create", data, msg_id=f"m{i}")
    seen, handler = recording()
    waits = 0
    next_msg = Subscription.next_msg

    async def counted_wait(self, timeout=1.0):
        nonlocal waits
        waits += 1
        return await next_msg(self, timeout)

    monkeypatch.setattr(Subscription, "next_msg", counted_wait)
    requests: list[dict] = []

    async def counted(message):
        requests.append(json.loads(message.data))

    watch = await bus.nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.TASKS.busy", cb=counted)
    consumer = bus.consumer(
        "TASKS", durable="busy", subject="task.create", handler=handler, batch=16
    )
    try:
        await run_until(consumer, lambda: len(seen) >= 200)
        await bus.nc.flush()
    finally:
        await watch.unsubscribe()
    assert sorted(seen) == sorted(expected)  # each once
    backlog = [r for r in requests if r.get("no_wait")]
    assert len(backlog) >= 200 // 16, requests
    # One wait per message would be 200 or more. The last request may still be on its way
    # to the watching subscription when it is closed: one wait more than requests seen.
    assert waits <= len(requests) + 1 and len(requests) < 100, (waits, requests)
    info = await bus.js.consumer_info("TASKS", "busy")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_gathering_consumer_takes_what_came_during_its_wait_with_one_pull(bus):
    """With ``gather``, a consumer that keeps up leaves no request standing: idle, it asks
    for the next message alone; once a pull brought fewer than it asked for, it waits
    ``gather`` seconds and takes everything stored meanwhile with one request that does not
    wait. Nothing is missed or delivered twice, and every message is acknowledged."""
    await bus.ensure_stream("TASKS", ["task.create"])
    seen, handler = recording()

    consumer = bus.consumer(
        "TASKS", durable="gatherer", subject="task.create", handler=handler, batch=64, gather=2.0
    )
    requests: list[dict] = []

    async def counted(message):
        requests.append(json.loads(message.data))

    watch = await bus.nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.TASKS.gatherer", cb=counted)
    task = asyncio.create_task(consumer.run())
    try:
        # Idle: what is stored now (nothing), then a request for one message that waits.
        await eventually(
            lambda: any(r.get("batch") == 1 and r.get("expires") for r in requests),
            timeout=15,
            wanted="a request for the next message alone",
        )
        await bus.publish("task.create", b"m0", msg_id="m0")
        await eventually(lambda: b"m0" in seen, timeout=15, interval=0.01, wanted="m0 seen")
        requests.clear()
        # The consumer now waits 2 s: what comes meanwhile is stored, nothing is sent.
        for i in range(1, 21):
            await bus.publish("task.create", f"m{i}".encode(), msg_id=f"m{i}")
        await eventually(lambda: len(seen) == 21, timeout=15, interval=0.01, wanted="21 seen")
        await bus.nc.flush()
        assert requests == [{"batch": 64, "no_wait": True}], requests
    finally:
        await watch.unsubscribe()
        consumer.stop()
        await task
    assert seen == [f"m{i}".encode() for i in range(21)]
    info = await bus.js.consumer_info("TASKS", "gatherer")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_consumer_gets_only_what_its_filters_match(bus):
    await bus.ensure_stream("TASK_STATUS", ["task.status.>"])
    for subject in ("a.running", "a.succeeded", "b.failed", "c.running", "c.cancelled"):
        await bus.publish(f"task.status.{subject}", subject.encode(), msg_id=subject)
    seen, handler = recording()

    consumer = bus.consumer(
        "TASK_STATUS",
        durable="finished",
        subject=("task.status.*.succeeded", "task.status.*.failed"),
        handler=handler,
    )
    await run_until(consumer, lambda: len(seen) >= 2)
    info = await bus.js.consumer_info("TASK_STATUS", "finished")
    assert sorted(seen) == [b"a.succeeded", b"b.failed"]
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_durable_started_with_another_configuration_is_brought_to_it(bus):
    await bus.ensure_stream("TASK_STATUS", ["task.status.>"])
    seen, handler = recording()

    await bus.publish("task.status.a.succeeded", b"a.succeeded", msg_id="a")
    old = bus.consumer("TASK_STATUS", durable="view", subject="task.status.>", handler=handler)
    await run_until(old, lambda: seen == [b"a.succeeded"])

    new = bus.consumer(
        "TASK_STATUS",
        durable="view",
        subject=("task.status.*.failed", "task.status.*.cancelled"),
        handler=handler,
        ack_wait=7.0,
        max_deliver=5,
    )
    await bus.publish("task.status.b.running", b"b.running", msg_id="b")
    await bus.publish("task.status.c.failed", b"c.failed", msg_id="c")
    await run_until(new, lambda: b"c.failed" in seen)

    config = (await bus.js.consumer_info("TASK_STATUS", "view")).config
    assert sorted(config.filter_subjects or []) == [
        "task.status.*.cancelled",
        "task.status.*.failed",
    ]
    assert (config.ack_wait, config.max_deliver) == (7.0, 5)
    assert seen == [b"a.succeeded", b"c.failed"]  # acknowledged stays acknowledged


async def test_messages_in_hand_longer_than_the_ack_wait_are_not_redelivered(bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    for i in range(12):
        await bus.publish("task.create", str(i).encode(), msg_id=f"long-{i}")
    seen: list[bytes] = []
    release = asyncio.Event()

    async def handler(message):
        seen.append(message.data)
        if message.data != b"0":  # one quick message among long ones
            await release.wait()
        return ACK

    consumer = bus.consumer(
        "TASKS", durable="slow", subject="task.create", handler=handler, batch=16, ack_wait=0.6
    )
    task = asyncio.create_task(consumer.run())
    try:
        await eventually(lambda: len(seen) == 12, timeout=15, interval=0.02, wanted="12 in hand")
        await asyncio.sleep(2.5)  # four ack waits: without extensions all 11 come back
        info = await bus.js.consumer_info("TASKS", "slow")
        assert info.num_redelivered == 0 and consumer.in_hand == 11
    finally:
        release.set()
        consumer.stop()
        await task
    assert sorted(seen, key=int) == [str(i).encode() for i in range(12)]
    info = await bus.js.consumer_info("TASKS", "slow")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_publish_many_acks_each_message_in_order_and_deduplicates(bus):
    await bus.ensure_stream("TASKS", ["task.create"])
    messages = [("task.create", str(i).encode(), f"many-{i}") for i in range(50)]
    acks = await bus.publish_many([*messages, ("task.create", b"again", "many-7")])
    assert [a.seq for a in acks[:50]] == list(range(1, 51))
    assert acks[50].duplicate and acks[50].seq == 8
    assert (await bus.js.stream_info("TASKS")).state.messages == 50
    with pytest.raises(NoStreamResponseError):  # no stream stores it: the whole call fails
        await bus.publish_many([("task.create", b"x", "many-x"), ("nowhere.at.all", b"y", "y")])


async def test_a_read_jetstream_cannot_serve_says_so_before_its_deadline():
    """A server without JetStream answers no one for the read's consumer: that is
    StreamUnavailable (the gateway's UNAVAILABLE, worth another try), not an error of the
    read's own, and it comes as the answer, not as the read's deadline (TimeoutError)."""
    port = free_port()
    server = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_tcp("127.0.0.1", port, timeout=10)
        bus = await Bus.connect(
            [f"nats://127.0.0.1:{port}"], name="test-no-jetstream", max_reconnect_attempts=0
        )
        try:
            with pytest.raises(StreamUnavailable, match="TASK_STATUS"):
                await bus.read_subject("TASK_STATUS", "task.status.t1.*", limit=10, timeout=30)
        finally:
            await bus.close()
    finally:
        server.terminate()
        server.wait(10)
