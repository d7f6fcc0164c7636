"""Poison containment (dispo.libs.quarantine) on real NATS JetStream and PostgreSQL: a message
that keeps failing is quarantined after its bounded deliveries and blocks nothing behind it;
the QuarantineService lists, shows, replays and discards over a real gRPC channel.

The quarantine table used is the executor's (every consuming service has one in its schema).
Times in rows are the manual clock's."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.quarantine.v1 import quarantine_pb2 as pb
from dispo.libs.api.quarantine.v1 import quarantine_pb2_grpc
from dispo.libs.bus import ACK, Nak, Term
from dispo.libs.errors import Unavailable
from dispo.libs.grpcserver import create_server
from dispo.libs.quarantine import SERVICE_NAME, Quarantine, RetryBound, add_to_server
from support import eventually
from support.auth import admin_channel

STREAM, SUBJECT = "WORK", "work.item"
# Quick redeliveries: the bound is what the tests are about, not the waiting.
BOUND = RetryBound(max_failures=3, base_seconds=0.05, max_seconds=0.2, jitter=0.0)


@pytest.fixture
async def quarantine(service_db, bus, manual_clock):
    await bus.ensure_stream(STREAM, [f"{STREAM.lower()}.>"])
    db = await service_db("executor")
    return Quarantine(db, bus, manual_clock, BOUND)


@pytest.fixture
async def stub(quarantine, authorizer):
    server = create_server(
        "127.0.0.1:0",
        [lambda s: add_to_server(quarantine.servicer, s)],
        [SERVICE_NAME],
        authorizer(),
    )
    await server.start()
    async with admin_channel(f"127.0.0.1:{server.port}") as channel:
        yield quarantine_pb2_grpc.QuarantineServiceStub(channel)
    await server.stop(0)


class Worker:
    """A consumer whose handler fails on the payloads in ``poison`` (raising) and refuses
    those in ``refuse``; it records every delivery."""

    def __init__(self, bus, quarantine, durable="worker", batch=8) -> None:
        self.poison: set[bytes] = set()
        self.refuse: set[bytes] = set()
        self.unreachable: Counter[bytes] = Counter()  # raises Unavailable this many times
        self.seen: list[bytes] = []
        self.done: list[bytes] = []
        self.consumer = bus.consumer(
            STREAM,
            durable=durable,
            subject=SUBJECT,
            handler=quarantine.wrap(self.handle),
            batch=batch,
        )
        self.task: asyncio.Task | None = None

    async def handle(self, message):
        self.seen.append(message.data)
        if self.unreachable[message.data] > 0:
            self.unreachable[message.data] -= 1
            raise Unavailable("database unavailable")
        if message.data in self.poison:
            raise ValueError(f"cannot store {message.data!r}")
        if message.data in self.refuse:
            return Term("malformed")
        self.done.append(message.data)
        return ACK

    def start(self) -> None:
        self.task = asyncio.create_task(self.consumer.run())

    async def stop(self) -> None:
        self.consumer.stop()
        assert self.task is not None
        await self.task


@pytest.fixture
async def worker(bus, quarantine):
    w = Worker(bus, quarantine)
    w.start()
    yield w
    await w.stop()


async def publish(bus, *bodies: bytes) -> None:
    for body in bodies:
        await bus.publish(SUBJECT, body, msg_id=body.decode())


async def settled(bus, durable="worker"):
    return await eventually(
        lambda: bus.js.consumer_info(STREAM, durable),
        lambda info: info.num_ack_pending == 0 and info.num_pending == 0,
        timeout=20,
        wanted=f"{durable} settled",
    )


async def test_a_failing_message_is_quarantined_after_its_bounded_deliveries(
    bus, quarantine, worker
):
    worker.poison.add(b"poison")
    await publish(bus, b"poison", *(f"later-{i}".encode() for i in range(20)))

    [held] = await eventually(
        quarantine.store.all, lambda rows: len(rows) == 1, timeout=20, wanted="one quarantined"
    )
    await settled(bus)

    assert worker.seen.count(b"poison") == BOUND.max_failures  # bounded, then never again
    assert sorted(worker.done) == sorted(f"later-{i}".encode() for i in range(20))
    assert (held.consumer, held.stream, held.subject) == ("worker", STREAM, SUBJECT)
    assert held.payload == b"poison" and held.stream_sequence == 1
    assert held.deliveries == BOUND.max_failures and held.replays == 0
    assert held.error == "ValueError: cannot store b'poison'"
    assert held.first_seen == held.last_seen == quarantine.store.clock.now()


async def test_later_messages_pass_while_a_poison_message_is_still_failing(bus, quarantine):
    """The poison keeps failing (slowly) while every message behind it is processed."""
    slow = Quarantine(
        quarantine.store.db,
        bus,
        quarantine.store.clock,
        RetryBound(max_failures=3, base_seconds=30.0, max_seconds=30.0, jitter=0.0),
    )
    w = Worker(bus, slow, durable="slow")
    w.poison.add(b"poison")
    w.start()
    try:
        await publish(bus, b"poison", *(f"behind-{i}".encode() for i in range(10)))
        await eventually(lambda: len(w.done) == 10, timeout=20, wanted="the ten behind it")
        assert w.seen.count(b"poison") == 1  # waiting out its backoff, holding nothing up
        assert await slow.store.all() == []
    finally:
        await w.stop()


async def test_a_refused_message_is_quarantined_at_once(bus, quarantine, worker):
    worker.refuse.add(b"garbage")
    await publish(bus, b"garbage", b"fine")

    [held] = await eventually(
        quarantine.store.all, lambda rows: len(rows) == 1, timeout=20, wanted="one quarantined"
    )
    await settled(bus)
    assert worker.seen.count(b"garbage") == 1
    assert (held.payload, held.error, held.deliveries) == (b"garbage", "malformed", 1)
    assert worker.done == [b"fine"]


async def test_an_unreachable_database_is_not_counted_against_the_message(bus, quarantine, worker):
    worker.unreachable[b"unlucky"] = BOUND.max_failures + 2
    await publish(bus, b"unlucky")

    await eventually(lambda: worker.done == [b"unlucky"], timeout=30, wanted="it processed")
    assert worker.seen.count(b"unlucky") == BOUND.max_failures + 3
    assert await quarantine.store.all() == []


async def test_a_handlers_own_nak_is_not_a_failure(bus, quarantine):
    """The executor waits out retry backoffs and leases by naking: never quarantined."""
    naks = Counter[bytes]()

    async def patient(message):
        naks[message.data] += 1
        return Nak(0.01) if naks[message.data] <= BOUND.max_failures * 2 else ACK

    consumer = bus.consumer(
        STREAM, durable="patient", subject=SUBJECT, handler=quarantine.wrap(patient)
    )
    task = asyncio.create_task(consumer.run())
    try:
        await publish(bus, b"later")
        await eventually(lambda: naks[b"later"] > BOUND.max_failures * 2, timeout=20)
        await settled(bus, "patient")
    finally:
        consumer.stop()
        await task
    assert await quarantine.store.all() == []


async def test_list_pages_and_counts_the_quarantine(bus, quarantine, worker, stub):
    bodies = [f"bad-{i}".encode() for i in range(5)]
    worker.refuse.update(bodies)
    await publish(bus, *bodies)
    await eventually(quarantine.store.all, lambda rows: len(rows) == 5, timeout=20)

    first = await stub.ListMessages(
        pb.ListMessagesRequest(page=common_pb2.PageRequest(page_size=2))
    )
    assert first.total == 5 and len(first.messages) == 2 and first.page.next_page_token
    seen = list(first.messages)
    token = first.page.next_page_token
    while token:
        page = await stub.ListMessages(
            pb.ListMessagesRequest(page=common_pb2.PageRequest(page_size=2, page_token=token))
        )
        assert page.total == 5
        seen += page.messages
        token = page.page.next_page_token
    ids = [m.id for m in seen]
    assert ids == sorted(ids) and len(set(ids)) == 5  # oldest first, each once
    assert sorted(m.payload for m in seen) == bodies
    assert sorted(m.stream_sequence for m in seen) == [1, 2, 3, 4, 5]

    other = await stub.ListMessages(pb.ListMessagesRequest(consumer="someone-else"))
    assert other.total == 0 and not other.messages
    shown = await stub.GetMessage(pb.GetMessageRequest(id=seen[3].id))
    assert shown == seen[3]

    for bad in (
        pb.ListMessagesRequest(page=common_pb2.PageRequest(page_token="not-a-token")),
        pb.GetMessageRequest(id=0),
    ):
        call = stub.ListMessages if isinstance(bad, pb.ListMessagesRequest) else stub.GetMessage
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(bad)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetMessage(pb.GetMessageRequest(id=10**9))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_replay_processes_a_message_once_its_cause_is_fixed(bus, quarantine, worker, stub):
    worker.poison.add(b"needs-fix")
    await publish(bus, b"needs-fix")
    [held] = await eventually(quarantine.store.all, lambda rows: len(rows) == 1, timeout=20)

    worker.poison.clear()  # the cause is fixed
    replayed = await stub.ReplayMessage(pb.ReplayMessageRequest(id=held.id))

    assert replayed.message.id == held.id and replayed.new_stream_sequence == 2
    await eventually(lambda: worker.done == [b"needs-fix"], timeout=20, wanted="processed")
    await settled(bus)
    assert await quarantine.store.all() == []
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.ReplayMessage(pb.ReplayMessageRequest(id=held.id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_replayed_message_that_still_fails_comes_back_once(
    bus, quarantine, worker, stub, manual_clock
):
    worker.poison.add(b"hopeless")
    await publish(bus, b"hopeless")
    [first] = await eventually(quarantine.store.all, lambda rows: len(rows) == 1, timeout=20)
    manual_clock.advance(3600)

    await stub.ReplayMessage(pb.ReplayMessageRequest(id=first.id))
    [again] = await eventually(
        quarantine.store.all,
        lambda rows: len(rows) == 1 and rows[0].id != first.id,
        timeout=20,
        wanted="it back in quarantine",
    )
    await settled(bus)

    # delivered its bounded number of times again, and no more: not a loop
    assert worker.seen.count(b"hopeless") == 2 * BOUND.max_failures
    assert (again.payload, again.replays, again.deliveries) == (b"hopeless", 1, 3)
    assert again.stream_sequence == 2
    assert again.first_seen == first.first_seen  # its history travels with it
    assert again.last_seen == first.last_seen + timedelta(seconds=3600)


async def test_discard_removes_it_and_publishes_nothing(bus, quarantine, worker, stub):
    worker.refuse.add(b"junk")
    await publish(bus, b"junk")
    [held] = await eventually(quarantine.store.all, lambda rows: len(rows) == 1, timeout=20)

    discarded = await stub.DiscardMessage(pb.DiscardMessageRequest(id=held.id))

    assert discarded.message.payload == b"junk"
    assert await quarantine.store.all() == []
    assert (await bus.js.stream_info(STREAM)).state.messages == 1
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.DiscardMessage(pb.DiscardMessageRequest(id=held.id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_racing_replays_and_discards_act_once(bus, quarantine, worker, stub):
    worker.refuse.add(b"contested")
    await publish(bus, b"contested")
    [held] = await eventually(quarantine.store.all, lambda rows: len(rows) == 1, timeout=20)
    worker.refuse.clear()

    calls = [stub.ReplayMessage(pb.ReplayMessageRequest(id=held.id)) for _ in range(4)] + [
        stub.DiscardMessage(pb.DiscardMessageRequest(id=held.id)) for _ in range(4)
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)

    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1
    assert {o.code() for o in lost} == {grpc.StatusCode.NOT_FOUND}
    replays = 1 if isinstance(won[0], pb.ReplayMessageResponse) else 0
    assert (await bus.js.stream_info(STREAM)).state.messages == 1 + replays
    await eventually(
        lambda: worker.done.count(b"contested") == replays, timeout=20, wanted="replays handled"
    )
    assert await quarantine.store.all() == []


def test_a_concurrent_transaction_anywhere_in_the_chain_is_not_the_message_s_fault():
    """A deadlock or serialization failure wrapped by the handler's own error (as SQLAlchemy
    and handlers wrap asyncpg's) passes next time; the message's own error does not."""
    import asyncpg
    from dispo.libs.quarantine.guard import not_the_messages_fault

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as cause:
                raise RuntimeError("handler failed") from cause
        except RuntimeError as outer:
            return outer

    assert not_the_messages_fault(wrapped(asyncpg.exceptions.DeadlockDetectedError("d")))
    assert not_the_messages_fault(wrapped(asyncpg.exceptions.SerializationError("s")))
    assert not not_the_messages_fault(wrapped(ValueError("not a number")))
    looped = ValueError("loop")
    looped.__context__ = wrapped(looped)  # a chain that comes back to itself ends
    assert not not_the_messages_fault(looped)


async def test_a_handled_message_is_not_parsed_for_a_failure_count_while_nothing_fails(
    quarantine, bus
):
    """The guard reads a message's consumer and sequence (its reply subject parsed) only
    when there is a failure to count or to forget: the healthy path pays nothing for it. A
    message with no JetStream metadata would raise if it were read."""
    from nats.aio.msg import Msg

    async def handled(message):
        return ACK

    async def later(message):
        return Nak(1.0)

    bare = Msg(bus.nc, subject=SUBJECT, reply="", data=b"ok")
    assert await quarantine.guard.handle(handled, bare) == ACK
    assert await quarantine.guard.handle(later, bare) == Nak(1.0)
