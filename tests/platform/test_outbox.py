"""The shared outbox: many rows written with one statement; the relay publishes a row and
deletes it (ADR-0062), and deletes the rows an older version marked sent, a batch at a time,
keeping the unsent ones."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import UndeclaredSubject, tasks
from dispo.libs.db import create_engine
from dispo.libs.db.driver import Database
from dispo.libs.outbox import (
    OutboxRelay,
    OutboxRow,
    Staged,
    outbox_add,
    outbox_add_many,
    outbox_table,
    outbox_withdraw,
)
from dispo.libs.service import Runtime
from dispo.libs.settings import CommonSettings, ServerSettings
from sqlalchemy import MetaData, event, select, text
from support import eventually

SCHEMA = "outbox_test"
metadata = MetaData()
outbox = outbox_table(metadata)
withdrawable = outbox_table(metadata, "withdrawable_outbox", withdrawable=True)


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
    """The driver port on the same schema: where a store writes its outbox rows."""
    db = await Database.open(database_url, SCHEMA, size=2)
    yield db
    await db.close()


async def add(db, clock: ManualClock, name: str, *, marked: bool) -> None:
    """A row created a while ago; ``marked``: sent and marked so (``sent_at``), as a version
    before ADR-0062 left it, else unsent."""
    async with db.transaction() as conn:
        await outbox_add(
            conn, outbox, tasks.TASK_CLOSE, name, b"x", clock.now() - timedelta(days=3)
        )
        if marked:
            await conn.fetch(
                "UPDATE outbox SET sent_at = :now WHERE msg_id = :name",
                {"now": clock.now(), "name": name},
            )


async def names(engine) -> list[str]:
    async with engine.connect() as conn:
        return list(
            (
                await conn.execute(
                    outbox.select().with_only_columns(outbox.c.msg_id).order_by(outbox.c.id)
                )
            ).scalars()
        )


async def test_many_rows_go_in_with_one_statement_in_the_order_given(engine, db, manual_clock):
    statements: list[str] = []
    db.watch(lambda sql, args: statements.append(sql))
    rows = [
        OutboxRow(
            tasks.task_status(f"t{i}", common_pb2.TASK_STATUS_RUNNING),
            f"m-{i}",
            bytes([i]),
            manual_clock.now(),
        )
        for i in (3, 1, 2, 0, 4)
    ]
    async with db.transaction() as conn:
        statements.clear()
        await outbox_add_many(conn, outbox, rows)
        await outbox_add_many(conn, outbox, [])
        assert len(statements) == 1
    async with engine.connect() as conn:
        stored = (
            await conn.execute(
                outbox.select()
                .with_only_columns(
                    outbox.c.subject, outbox.c.msg_id, outbox.c.payload, outbox.c.created_at
                )
                .order_by(outbox.c.id)
            )
        ).all()
    assert [OutboxRow(*r) for r in stored] == rows


async def test_one_undeclared_subject_refuses_the_whole_call(engine, db, manual_clock):
    now = manual_clock.now()
    async with db.transaction() as conn:
        with pytest.raises(UndeclaredSubject, match="task.created"):
            await outbox_add_many(
                conn,
                outbox,
                [
                    OutboxRow(tasks.TASK_CLOSE, "ok-1", b"x", now),
                    OutboxRow("task.created", "bad-1", b"x", now),
                ],
            )
        # Refused before anything was sent: the caller's transaction goes on, with nothing
        # of the call in it.
        await outbox_add_many(conn, outbox, [OutboxRow(tasks.TASK_CLOSE, "ok-2", b"x", now)])
    assert await names(engine) == ["ok-2"]


async def test_outboxes_of_one_name_are_each_written_with_the_columns_they_have(
    engine, db, manual_clock
):
    """Every service's outbox is named ``outbox``, in shapes of its own (traced,
    withdrawable); one process may hold several (as a test run does): each is written with
    its own columns, whichever was written first."""
    row = [OutboxRow(tasks.TASK_CLOSE, "plain", b"x", manual_clock.now())]
    gateway_shaped = outbox_table(MetaData(), withdrawable=True)
    async with db.transaction() as conn:
        with pytest.raises(asyncpg.UndefinedColumnError, match="withdrawable"):
            async with conn.savepoint():  # this schema's outbox has no such column
                await outbox_add_many(conn, gateway_shaped, row, Staged(direct=False))
        await outbox_add_many(conn, outbox, row)
    assert await names(engine) == ["plain"]


@pytest.mark.parametrize("subject", ["task.created", "task.status", "test.event", "pool.wake.c1"])
async def test_an_undeclared_subject_is_refused_and_its_transaction_writes_nothing(
    engine, db, manual_clock, subject
):
    now = manual_clock.now()
    with pytest.raises(UndeclaredSubject, match=subject):
        async with db.transaction() as conn:
            await outbox_add(conn, outbox, tasks.TASK_CLOSE, "ok-1", b"x", now)
            await outbox_add(conn, outbox, subject, "bad-1", b"x", now)
    async with db.transaction() as conn:
        await outbox_add(
            conn, outbox, tasks.task_status("t1", common_pb2.TASK_STATUS_RUNNING), "ok-2", b"x", now
        )
    # The refused transaction left nothing behind; the declared write went in.
    assert await names(engine) == ["ok-2"]


async def test_rows_an_older_version_marked_sent_go_a_batch_at_a_time(
    engine, db, bus, manual_clock
):
    await add(db, manual_clock, "unsent-old", marked=False)
    for i in range(5):
        await add(db, manual_clock, f"marked-{i}", marked=True)
    await add(db, manual_clock, "unsent-new", marked=False)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, prune_batch=3)

    assert [await relay.prune_once() for _ in range(3)] == [3, 2, 0]
    assert await names(engine) == ["unsent-old", "unsent-new"]


async def test_a_relay_pass_deletes_what_it_published_and_what_an_older_version_marked(
    engine, db, bus, manual_clock
):
    await tasks.TASKS.ensure(bus)
    await add(db, manual_clock, "marked", marked=True)
    await add(db, manual_clock, "first", marked=False)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, prune_interval=60)
    running = asyncio.create_task(relay.run())
    try:
        relay.kick()

        async def empty() -> bool:
            return not await names(engine)

        await eventually(empty, timeout=10, interval=0.02, wanted="the outbox empty")
        # Only the unsent row went out; the marked one had been sent before.
        assert (await bus.js.stream_info("TASKS")).state.messages == 1
        last = await bus.js.get_last_msg("TASKS", tasks.TASK_CLOSE)
        assert last.headers and last.headers["Nats-Msg-Id"] == "first"
    finally:
        relay.stop()
        await asyncio.wait_for(running, 10)


async def test_every_service_relay_takes_the_clock_and_attempts_of_its_runtime(
    monkeypatch, engine, db, bus, manual_clock
):
    monkeypatch.setenv("DISPO_OUTBOX_MAX_ATTEMPTS", "3")
    verifier = TokenVerifier(db, manual_clock, 0)
    rt = Runtime(
        "gateway", CommonSettings(), ServerSettings(), engine, db, bus, manual_clock, verifier
    )
    relay = rt.outbox_relay(outbox, ordered=True)
    assert (relay.max_attempts, relay.clock, relay.ordered) == (3, manual_clock, True)


async def commit_rows(db, clock: ManualClock, names: list[str]):
    rows = [OutboxRow(tasks.TASK_CLOSE, name, b"x", clock.now()) for name in names]
    staged = Staged()
    async with db.transaction() as conn:
        ids = await outbox_add_many(conn, outbox, rows, staged)
    assert staged.ids == ids and staged.rows == rows
    return ids, staged


async def test_rows_handed_over_after_commit_go_out_without_a_pass(engine, db, bus, manual_clock):
    """The direct publisher sends what was committed and deletes it; no pass is due (an
    hour between polls, no kick), so nothing else could have."""
    await tasks.TASKS.ensure(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, poll_interval=3600)
    running = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: relay._direct_running, timeout=10, wanted="the relay running")
        ids, staged = await commit_rows(db, manual_clock, ["a", "b", "c"])
        assert len(ids) == 3 and ids == sorted(ids)
        relay.publish_committed(staged)

        async def all_sent() -> bool:
            return await names(engine) == []

        await eventually(all_sent, timeout=10, interval=0.02, wanted="the rows deleted")
        assert relay.published_directly == 3
        assert (await bus.js.stream_info("TASKS")).state.messages == 3
        last = await bus.js.get_last_msg("TASKS", tasks.TASK_CLOSE)
        assert last.headers and last.headers["Nats-Msg-Id"] == "c"
    finally:
        relay.stop()
        await asyncio.wait_for(running, 10)


async def test_rows_sent_directly_are_marked_by_the_next_outbox_write(
    engine, db, bus, manual_clock
):
    """Under load the direct publisher deletes nothing with a statement of its own: the next
    transaction that writes outbox rows deletes the ones sent before it. Rows no transaction
    took (a transaction that wrote none gives them back) are deleted when the relay stops."""
    await tasks.TASKS.ensure(bus)
    statements: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    db.watch(lambda sql, args: statements.append(sql))
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, poll_interval=3600, mark_delay=3600)
    running = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: relay._direct_running, timeout=10, wanted="the relay running")
        ids, staged = await commit_rows(db, manual_clock, ["a", "b", "c"])
        relay.publish_committed(staged)
        await eventually(
            lambda: relay.published_directly == 3, timeout=10, interval=0.02, wanted="sent"
        )
        assert await names(engine) == ["a", "b", "c"]  # sent, waiting for the next write
        idle = relay.staged()  # a transaction that writes no outbox row gives them back
        assert idle.marking == ids
        relay.publish_committed(idle)

        statements.clear()
        later = manual_clock.advance(seconds=5)
        rows = [OutboxRow(tasks.TASK_CLOSE, "d", b"x", later)]
        second = relay.staged()
        assert second.marking == ids
        async with db.transaction() as conn:
            await outbox_add_many(conn, outbox, rows, second)
        relay.publish_committed(second)
        # Deleted by the insert of d: one statement, no DELETE of its own.
        assert await names(engine) == ["d"]
        [write] = [q for q in statements if "outbox" in q and not q.startswith("SELECT")]
        assert write.startswith("WITH marked AS (DELETE") and "INSERT INTO" in write
        await eventually(
            lambda: relay.published_directly == 4, timeout=10, interval=0.02, wanted="d sent"
        )
        assert relay.staged().marking == [ids[-1] + 1]  # d: taken, and never written back
    finally:
        relay.stop()
        await asyncio.wait_for(running, 10)
    assert await names(engine) == []  # d deleted as the relay stopped
    assert (await bus.js.stream_info("TASKS")).state.messages == 4


async def test_rows_the_direct_publisher_cannot_send_are_left_to_a_pass(
    engine, db, bus, manual_clock
):
    """No stream takes the subject yet: the direct publish fails, the rows stay unsent, and
    the pass it kicks publishes them once the stream exists."""
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock, poll_interval=3600)
    running = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: relay._direct_running, timeout=10, wanted="the relay running")
        ids, staged = await commit_rows(db, manual_clock, ["a", "b"])
        relay.publish_committed(staged)
        await eventually(
            lambda: not relay._held, timeout=10, interval=0.02, wanted="the publish tried"
        )
        assert relay.published_directly == 0
        assert await names(engine) == ["a", "b"]
        await tasks.TASKS.ensure(bus)

        async def all_sent() -> bool:
            if not await names(engine):
                return True
            manual_clock.advance(seconds=60)  # a failure the pass counted is due again
            return False

        await eventually(all_sent, timeout=30, interval=0.05, wanted="the pass publishing them")
        assert relay.published_directly == 0
        assert (await bus.js.stream_info("TASKS")).state.messages == 2
    finally:
        relay.stop()
        await asyncio.wait_for(running, 10)


async def test_a_pass_leaves_the_rows_the_direct_publisher_holds(engine, db, bus, manual_clock):
    """Handed over to a relay whose direct publisher has not run yet, the rows are its own:
    a pass in between publishes nothing."""
    await tasks.TASKS.ensure(bus)
    relay = OutboxRelay(db, outbox, bus, clock=manual_clock)
    relay._direct_running = True  # as while run() runs, with its publisher not scheduled yet
    ids, staged = await commit_rows(db, manual_clock, ["a", "b"])
    relay.publish_committed(staged)
    assert await relay.relay_once() == 0
    assert await names(engine) == ["a", "b"]
    relay._held.clear()
    assert await relay.relay_once() == 2


async def test_a_pass_claims_a_withdrawable_row_and_commits_before_it_publishes(
    engine, db, bus, manual_clock, monkeypatch
):
    """On a withdrawable outbox (ADR-0090) the rows of a direct Staged are never withdrawn
    (the direct publisher sends them without a row lock), those of another one can be until
    a pass takes them: it clears the flag, and commits, before the publish, so a withdrawal
    finds them claimed even if the pass's own transaction is then lost. A row the bus cannot
    carry is never sent: it stays withdrawable."""
    await tasks.TASKS.ensure(bus)
    t, subject, now = withdrawable, tasks.TASK_CLOSE, manual_clock.now()
    waiting = [
        OutboxRow(subject, "kept", b"x", now),
        OutboxRow(subject, "huge", b"x" * (bus.max_payload + 1), now),
        OutboxRow(subject, "withdrawn", b"x", now),
    ]
    async with db.transaction() as conn:
        await outbox_add_many(conn, t, [OutboxRow(subject, "direct", b"x", now)], Staged())
        await outbox_add_many(conn, t, waiting, Staged(direct=False))
    async with db.transaction() as conn:
        assert not await outbox_withdraw(conn, t, subject, "direct")
        assert await outbox_withdraw(conn, t, subject, "withdrawn")
    committed: list[dict[str, bool]] = []
    publish_many = bus.publish_many

    async def look_then_publish(*args, **kwargs):
        async with engine.connect() as conn:  # what a withdrawal would find
            committed.append(dict((await conn.execute(select(t.c.msg_id, t.c.withdrawable))).all()))
        await publish_many(*args, **kwargs)

    monkeypatch.setattr(bus, "publish_many", look_then_publish)
    relay = OutboxRelay(db, t, bus, clock=manual_clock)

    assert await relay.relay_once() == 2

    assert committed == [{"direct": False, "kept": False, "huge": True}]
    async with db.transaction() as conn:
        assert await outbox_withdraw(conn, t, subject, "huge")
