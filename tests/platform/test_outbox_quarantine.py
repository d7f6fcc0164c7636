"""A row that cannot be published never holds back the rows behind it: a failing batch is
split until the failing rows are found, each failure is an attempt counted on the row with
its error, and after the last attempt the row is quarantined (kept, marked, logged, listed)
while the rest goes out. Attempts are spaced on the relay's clock, driven by the test."""

from __future__ import annotations

import pytest
import structlog
from dispo.libs.bus import Bus
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import tasks
from dispo.libs.db import create_engine
from dispo.libs.db.driver import Database
from dispo.libs.outbox import (
    OutboxRelay,
    OutboxRow,
    outbox_add_many,
    outbox_discard,
    outbox_quarantined,
    outbox_replay,
    outbox_table,
)
from nats.js.api import StreamConfig
from sqlalchemy import MetaData, text
from support.nats import nats_with_max_payload

SCHEMA = "outbox_quarantine_test"
metadata = MetaData()
outbox = outbox_table(metadata)
TOO_LARGE = 2 * 1024 * 1024  # over NATS's default max_payload of 1 MiB


@pytest.fixture
async def engine(database_url):
    engine = create_engine(database_url, SCHEMA)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.run_sync(metadata.create_all)
    yield engine
    await engine.dispose()


@pytest.fixture
async def db(engine, database_url):
    db = await Database.open(database_url, SCHEMA, size=2)
    yield db
    await db.close()


async def add(db, clock: ManualClock, *rows: tuple[str, bytes]) -> None:
    async with db.transaction() as conn:
        await outbox_add_many(
            conn,
            outbox,
            [OutboxRow(tasks.TASK_CLOSE, msg_id, data, clock.now()) for msg_id, data in rows],
        )


async def state(engine) -> dict[str, tuple]:
    """msg_id -> (sent, attempts, quarantined, last error)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                f"SELECT msg_id, sent_at IS NOT NULL, attempts, quarantined_at IS NOT NULL,"
                f" coalesce(last_error, '') FROM {SCHEMA}.outbox ORDER BY id"
            )
        )
        return {r[0]: tuple(r[1:]) for r in rows}


async def published(bus: Bus, stream: str = "TASKS") -> list[str]:
    """The message ids stored in ``stream``, in stream order."""
    info = await bus.js.stream_info(stream)
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        message = await bus.js.get_msg(stream, seq)
        ids.append(message.headers["Nats-Msg-Id"])
    return ids


class CountingBus:
    """The real bus, counting its publish_many calls (a batch's cost)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.batches: list[int] = []
        original = bus.publish_many

        async def publish_many(messages, **kw):
            self.batches.append(len(messages))
            return await original(messages, **kw)

        bus.publish_many = publish_many  # type: ignore[method-assign]


async def test_a_row_over_the_limit_is_quarantined_after_its_attempts_and_the_rest_goes_out(
    engine, db, bus, manual_clock
):
    await tasks.TASKS.ensure(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, max_attempts=3)
    await add(db, manual_clock, ("a", b"a"), ("big", b"x" * TOO_LARGE), ("b", b"b"))

    with structlog.testing.capture_logs() as logs:
        assert await relay.relay_once() == 2
        assert await published(bus) == ["a", "b"]
        big = (await state(engine))["big"]
        assert big[:3] == (False, 1, False)
        assert "MessageTooLarge" in big[3] and f"over the bus's limit of {1024 * 1024}" in big[3]

        # Its next attempt is due a second later on the clock, not before.
        await add(db, manual_clock, ("c", b"c"))
        assert await relay.relay_once() == 1
        assert (await state(engine))["big"][1] == 1
        manual_clock.advance(seconds=1)
        assert await relay.relay_once() == 0
        assert (await state(engine))["big"][:3] == (False, 2, False)
        manual_clock.advance(seconds=2)
        assert await relay.relay_once() == 0
        assert (await state(engine))["big"][:3] == (False, 3, True)

        # Set aside: skipped by the relay, kept in the table, listed with what explains it.
        manual_clock.advance(hours=1)
        await add(db, manual_clock, ("d", b"d"))
        assert await relay.relay_once() == 1
        assert await published(bus) == ["a", "b", "c", "d"]
    assert (await state(engine))["big"][:3] == (False, 3, True)
    async with db.connection() as conn:
        [listed] = await outbox_quarantined(conn, outbox)
        assert await outbox_quarantined(conn, outbox, after_id=listed.id) == []
    assert (listed.subject, listed.msg_id, listed.attempts) == (tasks.TASK_CLOSE, "big", 3)
    assert listed.size == TOO_LARGE and "MessageTooLarge" in listed.last_error
    [line] = [entry for entry in logs if entry["event"] == "outbox row quarantined"]
    assert line["log_level"] == "error"
    assert (line["subject"], line["msg_id"], line["id"], line["size"]) == (
        tasks.TASK_CLOSE,
        "big",
        listed.id,
        TOO_LARGE,
    )
    assert "MessageTooLarge" in line["error"]


async def test_a_failing_batch_is_split_and_a_good_batch_is_published_at_once(
    engine, db, bus, manual_clock
):
    """The stream takes at most 1 KB per message, so the server refuses the 2 KB row (the
    bus's own check passes it): the batch fails, is split, and the other rows go out."""
    await bus.js.add_stream(
        StreamConfig(name="TASKS", subjects=list(tasks.TASKS.subjects), max_msg_size=1024)
    )
    counting = CountingBus(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, max_attempts=2)
    good = [(f"m{i}", b"x" * 100) for i in range(16)]
    await add(db, manual_clock, *good[:5], ("refused", b"x" * 2048), *good[5:])

    assert await relay.relay_once() == 16
    assert sorted(await published(bus)) == sorted(m for m, _ in good)
    assert counting.batches[0] == 17 and len(counting.batches) > 1  # split after the failure
    refused = (await state(engine))["refused"]
    assert refused[:3] == (False, 1, False) and "maximum" in refused[3]

    # The next pass: the new rows in one batch, the suspect row alone.
    counting.batches.clear()
    manual_clock.advance(seconds=1)
    await add(db, manual_clock, *((f"n{i}", b"y") for i in range(10)))
    assert await relay.relay_once() == 10
    assert counting.batches == [10, 1]
    assert (await state(engine))["refused"][:3] == (False, 2, True)

    # A batch with no bad row: one publish_many, nothing split.
    counting.batches.clear()
    await add(db, manual_clock, *((f"p{i}", b"z") for i in range(50)))
    assert await relay.relay_once() == 50
    assert counting.batches == [50]


async def test_nothing_is_counted_while_no_stream_answers(engine, db, bus, manual_clock):
    """No stream for the subject (as while JetStream restarts): the pass fails, no row is
    blamed. Once another row goes out in the same pass, the failing one is counted."""
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, max_attempts=2)
    await add(db, manual_clock, ("a", b"a"), ("b", b"b"))
    for _ in range(3):
        with pytest.raises(Exception, match="NoStreamResponse|no response"):
            await relay.relay_once()
        manual_clock.advance(minutes=5)
    assert {m: s[:3] for m, s in (await state(engine)).items()} == {
        "a": (False, 0, False),
        "b": (False, 0, False),
    }
    await tasks.TASKS.ensure(bus)
    assert await relay.relay_once() == 2
    assert await published(bus) == ["a", "b"]


async def test_an_ordered_relay_waits_for_the_failing_row_then_goes_on_without_it(
    engine, db, bus, manual_clock
):
    await tasks.TASKS.ensure(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, ordered=True, max_attempts=2)
    await add(db, manual_clock, ("a", b"a"), ("big", b"x" * TOO_LARGE), ("c", b"c"))

    assert await relay.relay_once() == 1
    assert await published(bus) == ["a"]
    assert await relay.relay_once() == 0  # not due yet: "c" waits behind it, in order
    manual_clock.advance(seconds=1)
    assert await relay.relay_once() == 0
    assert (await state(engine))["big"][:3] == (False, 2, True)
    assert await relay.relay_once() == 1
    assert await published(bus) == ["a", "c"]


async def test_a_quarantined_row_can_be_replayed_or_discarded(engine, db, tmp_path, manual_clock):
    """Against a server carrying 64 KB messages, a 100 KB row is quarantined; replayed once
    the bus takes it (here: another server), it goes out; discarded, it is gone."""
    await add(db, manual_clock, ("big", b"x" * 100_000), ("other", b"x" * 100_000))
    with nats_with_max_payload(tmp_path / "small", 64 * 1024) as server:
        small = await Bus.connect([server.url], name="test-small", credentials=server.credentials())
        try:
            await tasks.TASKS.ensure(small)
            relay = OutboxRelay(db, outbox, small, clock=manual_clock, max_attempts=1)
            assert await relay.relay_once() == 0
        finally:
            await small.close()
    assert {m: s[:3] for m, s in (await state(engine)).items()} == {
        "big": (False, 1, True),
        "other": (False, 1, True),
    }
    async with db.transaction() as conn:
        [big, other] = await outbox_quarantined(conn, outbox)
        assert await outbox_replay(conn, outbox, [big.id]) == 1
        assert await outbox_discard(conn, outbox, [other.id]) == 1
        assert await outbox_replay(conn, outbox, [other.id]) == 0
    with nats_with_max_payload(tmp_path / "large", 1024 * 1024) as server:
        large = await Bus.connect([server.url], name="test-large", credentials=server.credentials())
        try:
            await tasks.TASKS.ensure(large)
            relay = OutboxRelay(db, outbox, large, clock=manual_clock)
            assert await relay.relay_once() == 1
            assert await published(large) == ["big"]
        finally:
            await large.close()
    assert await state(engine) == {}  # published, then deleted


# The services whose outbox carries the trace context of the work that wrote each row.
TRACED = {"gateway", "executor", "reconciler"}
WITHDRAWABLE = {"gateway"}
# The services whose outbox holds rows until their time (ADR-0103).
DELAYABLE = {"gateway"}


@pytest.mark.parametrize("service", ["gateway", "executor", "reconciler", "pool"])
async def test_every_service_outbox_is_migrated_to_the_shared_shape(service_engine, service):
    engine = await service_engine(service)
    async with engine.connect() as conn:
        columns = (
            await conn.execute(
                text(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = :schema AND table_name = 'outbox'"
                ),
                {"schema": service},
            )
        ).scalars()
        indexes = dict(
            (
                await conn.execute(
                    text(
                        "SELECT indexname, indexdef FROM pg_indexes"
                        " WHERE schemaname = :schema AND tablename = 'outbox'"
                    ),
                    {"schema": service},
                )
            ).all()
        )
    # The shared shape; a traced outbox (libs/tracing.py) has its trace column besides, a
    # withdrawable one (ADR-0090) its withdrawable column, a delayable one (ADR-0103) its
    # available_at, left out of the unsent index and indexed apart.
    shape = outbox_table(
        MetaData(),
        traced=service in TRACED,
        withdrawable=service in WITHDRAWABLE,
        delayable=service in DELAYABLE,
    )
    assert set(columns) == {c.name for c in shape.columns}
    assert set(indexes) == {i.name for i in shape.indexes} | {"outbox_pkey"}
    unsent = "WHERE ((sent_at IS NULL) AND (quarantined_at IS NULL)"
    if service in DELAYABLE:
        assert f"{unsent} AND (available_at IS NULL))" in indexes["outbox_unsent"]
        assert "(available_at) WHERE" in indexes["outbox_delayed"]
    else:
        assert f"{unsent})" in indexes["outbox_unsent"]
    assert "WHERE (quarantined_at IS NOT NULL)" in indexes["outbox_quarantined"]


async def test_a_bus_that_does_not_answer_costs_a_pass_two_timeouts_and_counts_nothing(
    engine, db, bus, manual_clock
):
    """A subscriber that never answers takes the subject (as a JetStream that has lost its
    quorum would): the batch times out, its first half too, and the pass gives up."""

    async def ignore(msg) -> None:
        pass

    silent = await bus.nc.subscribe(tasks.TASK_CLOSE, cb=ignore)
    counting = CountingBus(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, max_attempts=1)
    await add(db, manual_clock, *((f"m{i}", b"x") for i in range(20)))
    with pytest.raises(TimeoutError):
        await relay.relay_once()
    assert counting.batches == [20, 10]
    assert {s[:3] for s in (await state(engine)).values()} == {(False, 0, False)}
    await silent.unsubscribe()
    await tasks.TASKS.ensure(bus)
    assert await relay.relay_once() == 20
