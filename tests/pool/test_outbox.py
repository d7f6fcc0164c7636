"""The pool's outbox is the shared one (libs/outbox.py): same table shape after the pool's
migrations, and a relay that keeps the stream in outbox order when a publish fails: the
failing row stops the batch until it goes out (or is quarantined, ADR-0034)."""

from __future__ import annotations

from dispo.pool import store
from dispo.pool.events import outbox_relay
from sqlalchemy import inspect
from sqlalchemy.dialects import postgresql

from .conftest import evaluation


async def test_the_migrated_outbox_has_the_shared_shape(pool_engine):
    def reflect(sync_conn):
        inspector = inspect(sync_conn)
        return inspector.get_columns("outbox"), inspector.get_indexes("outbox")

    async with pool_engine.connect() as conn:
        columns, indexes = await conn.run_sync(reflect)
    dialect = postgresql.dialect()
    assert {c["name"]: (c["type"].compile(dialect), c["nullable"]) for c in columns} == {
        c.name: (c.type.compile(dialect), c.nullable) for c in store.outbox.columns
    }
    assert sorted(
        (i["name"], i["column_names"], i["dialect_options"].get("postgresql_where"))
        for i in indexes
    ) == [
        ("outbox_quarantined", ["id"], "(quarantined_at IS NOT NULL)"),
        ("outbox_unsent", ["id"], "((sent_at IS NULL) AND (quarantined_at IS NULL))"),
    ]
    assert sorted(i.name for i in store.outbox.indexes) == ["outbox_quarantined", "outbox_unsent"]


async def test_a_failed_publish_stops_the_batch_so_the_stream_keeps_outbox_order(
    pool, service_db, manual_clock, bus, monkeypatch
):
    relay = outbox_relay(await service_db("pool"), bus, manual_clock)
    for name in ("first", "second", "third"):
        await pool.cancel(
            (await pool.create_evaluation(evaluation(name))).id
        )  # one evaluation.completed each
    publish = bus.publish
    attempts = []

    async def publish_failing_the_second(subject, data, *, msg_id, **kwargs):
        attempts.append(msg_id)
        if len(attempts) == 2:
            raise TimeoutError("no ack")
        return await publish(subject, data, msg_id=msg_id, **kwargs)

    monkeypatch.setattr(bus, "publish", publish_failing_the_second)
    # "first" goes out and is marked sent; "second" fails (an attempt counted on it) and
    # stops the batch: nothing after the failure is tried.
    assert await relay.relay_once() == 1
    assert attempts == ["first:completed", "second:completed"]
    monkeypatch.undo()
    assert await relay.relay_once() == 0  # "second" is not due yet, and "third" waits behind it
    manual_clock.advance(seconds=1)
    assert await relay.relay_once() == 2
    sub = await bus.js.pull_subscribe("evaluation.>", stream="EVALUATIONS")
    stored = [m.headers["Nats-Msg-Id"] for m in await sub.fetch(10, timeout=1)]
    assert stored == ["first:completed", "second:completed", "third:completed"]
