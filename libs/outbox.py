"""Transactional outbox: write the event row in the same transaction as the state change,
publish it afterwards, mark it sent. Only subjects declared in dispo.libs.contracts are
accepted. A crash or a NATS outage between commit and publish
only delays the event: the relay publishes whatever is unsent, oldest first, and the
message id makes a second publication of the same row a no-op within the stream's
duplicate window. Sent rows are kept for a retention (``DISPO_OUTBOX_RETENTION_SECONDS``, a
day by default), then the relay deletes them: the stream keeps the events.

    outbox = outbox_table(metadata)                   # in the service's tables module
    await outbox_add(conn, outbox, subject, msg_id, payload, now)   # inside the transaction
    await outbox_add_many(conn, outbox, [OutboxRow(subject, msg_id, payload, now), ...])
    relay = rt.outbox_relay(outbox)                   # OutboxRelay on the service's engine, bus, clock
    rt.add_part("outbox relay", relay.run, relay.stop)   # publishes, and prunes rows long sent
    relay.kick()                                      # after commit: publish now, not at the next poll
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from dispo.libs.bus import Bus
from dispo.libs.clock import Clock, SystemClock
from dispo.libs.contracts import require_declared
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Pause, Periodic
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    LargeBinary,
    MetaData,
    Table,
    Text,
    delete,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import TextClause

log = get_logger(__name__)

DEFAULT_RETENTION = timedelta(days=1)


def outbox_table(metadata: MetaData, name: str = "outbox") -> Table:
    return Table(
        name,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("subject", Text, nullable=False),
        Column("msg_id", Text, nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("sent_at", DateTime(timezone=True)),
        Index(f"{name}_unsent", "id", postgresql_where=text("sent_at IS NULL")),
    )


async def outbox_add(
    conn: AsyncConnection, table: Table, subject: str, msg_id: str, payload: bytes, now: datetime
) -> None:
    """Write one event row in the caller's transaction. The subject must be carried by a
    stream declared in :mod:`dispo.libs.contracts` (else :class:`UndeclaredSubject`, and
    nothing is written): an event no stream stores would be published into the void."""
    require_declared(subject)
    await conn.execute(
        table.insert().values(subject=subject, msg_id=msg_id, payload=payload, created_at=now)
    )


class OutboxRow(NamedTuple):
    """One event row for :func:`outbox_add_many`."""

    subject: str
    msg_id: str
    payload: bytes
    created_at: datetime


async def outbox_add_many(conn: AsyncConnection, table: Table, rows: Sequence[OutboxRow]) -> None:
    """Write many event rows in the caller's transaction with one statement, in the order
    given (the relay publishes in outbox order). Every subject is checked first, as in
    :func:`outbox_add`: one undeclared subject refuses the whole call, and nothing is written.
    """
    for row in rows:
        require_declared(row.subject)
    if not rows:
        return
    await conn.execute(
        _insert_many(table),
        {
            "subjects": [r.subject for r in rows],
            "msg_ids": [r.msg_id for r in rows],
            "payloads": [r.payload for r in rows],
            "created": [r.created_at for r in rows],
        },
    )


def _insert_many(table: Table) -> TextClause:
    """The multi-row insert of ``table``: the rows as arrays, one statement text whatever
    their number (prepared once per connection). ``WITH ORDINALITY`` keeps their order."""
    statement = _INSERT_MANY.get(table.fullname)
    if statement is None:
        statement = text(
            f"INSERT INTO {table.fullname} (subject, msg_id, payload, created_at)"
            " SELECT subject, msg_id, payload, created_at FROM unnest("
            "CAST(:subjects AS text[]), CAST(:msg_ids AS text[]),"
            " CAST(:payloads AS bytea[]), CAST(:created AS timestamptz[]))"
            " WITH ORDINALITY AS r(subject, msg_id, payload, created_at, n) ORDER BY n"
        )
        _INSERT_MANY[table.fullname] = statement
    return statement


_INSERT_MANY: dict[str, TextClause] = {}


async def outbox_prune(
    conn: AsyncConnection, table: Table, sent_before: datetime, limit: int
) -> int:
    """Delete the rows sent before ``sent_before`` among the ``limit`` oldest sent rows (the
    stream keeps the events); returns how many were deleted.

    A pass reads no more than ``limit`` sent rows, however many recent ones the table holds:
    rows are sent in outbox order, give or take a batch, so the oldest sent rows are the
    ones that expire first. A row sent late only waits for its own expiry, and its place in
    the window does not stop the expired rows after it from going.
    """
    t = table
    oldest = (
        select(t.c.id, t.c.sent_at)
        .where(t.c.sent_at.is_not(None))
        .order_by(t.c.id)
        .limit(limit)
        .subquery()
    )
    expired = select(oldest.c.id).where(oldest.c.sent_at < sent_before)
    return (await conn.execute(delete(t).where(t.c.id.in_(expired.scalar_subquery())))).rowcount


class OutboxRelay:
    """Publishes unsent rows in batches; several replicas share the work (SKIP LOCKED).

    Options for a service that needs them:

    - ``ordered``: publish a batch one message at a time, each after the previous one's ack,
      so the stream keeps the outbox order even when a publish fails midway (by default a
      batch is published at once, :meth:`Bus.publish_many`, and marked sent by one
      statement).
    - ``prepare``: awaited before the first batch, and again until it succeeds (e.g. ensuring
      the stream the events go to).
    - ``clock``: the service's clock (default: the system's). It stamps ``sent_at``, the
      retention is measured on it, and the pruning pauses on it.

    Retention: while it runs, the relay also deletes rows sent more than ``retention`` ago,
    at most ``prune_batch`` per transaction, one pass after another while passes delete
    something, then a pause of ``prune_interval`` clock seconds (:meth:`prune_once` is one
    pass).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        table: Table,
        bus: Bus,
        *,
        batch: int = 500,
        poll_interval: float = 1.0,
        ordered: bool = False,
        prepare: Callable[[], Awaitable[None]] | None = None,
        clock: Clock | None = None,
        retention: timedelta = DEFAULT_RETENTION,
        prune_batch: int = 1000,
        prune_interval: float = 300.0,
    ) -> None:
        self.engine = engine
        self.table = table
        self.bus = bus
        self.batch = batch
        self.poll_interval = poll_interval
        self.ordered = ordered
        self._prepare = prepare
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.retention = retention
        self.prune_batch = prune_batch
        self.prune_interval = prune_interval
        self._kick = asyncio.Event()
        self._stopping = asyncio.Event()
        self._pruning = Periodic(
            f"{table.name} prune", self._prune_pass, prune_interval, self.clock
        )

    def kick(self) -> None:
        self._kick.set()

    async def relay_once(self) -> int:
        """Publish up to one batch of unsent rows; returns how many were published."""
        t = self.table
        if not self.bus.nc.is_connected:
            # A publish now would sit in the client's reconnect buffer and go out later,
            # outside our transaction; wait for the connection instead.
            return 0
        if self._prepare is not None:
            await self._prepare()
            self._prepare = None
        async with self.engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(t.c.id, t.c.subject, t.c.msg_id, t.c.payload)
                    .where(t.c.sent_at.is_(None))
                    .order_by(t.c.id)
                    .limit(self.batch)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if not rows:
                return 0
            if self.ordered:
                for r in rows:
                    await self.bus.publish(r.subject, r.payload, msg_id=r.msg_id)
            else:
                await self.bus.publish_many([(r.subject, r.payload, r.msg_id) for r in rows])
            await conn.execute(
                update(t).where(t.c.id.in_([r.id for r in rows])).values(sent_at=self.clock.now())
            )
        return len(rows)

    async def prune_once(self) -> int:
        """Delete up to ``prune_batch`` rows sent more than ``retention`` ago; returns how many."""
        async with self.engine.begin() as conn:
            return await outbox_prune(
                conn, self.table, self.clock.now() - self.retention, self.prune_batch
            )

    async def run(self) -> None:
        pruning = asyncio.create_task(self._pruning.run(), name=self._pruning.name)
        try:
            await self._relay_loop()
        finally:
            pruning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pruning

    async def _prune_pass(self) -> Pause | None:
        """One prune; a pass that deleted something may have left a backlog: the next pass
        at once, in its own transaction. PostgreSQL down: the next interval tries again."""
        deleted = await self.prune_once()
        if deleted == 0:
            return None
        log.info("outbox pruned", table=self.table.name, deleted=deleted)
        return Pause(0)

    async def _relay_loop(self) -> None:
        while not self._stopping.is_set():
            self._kick.clear()
            try:
                published = await self.relay_once()
            except Exception as error:  # NATS or PostgreSQL down: try again shortly
                log.warning("outbox relay failed", table=self.table.name, error=repr(error))
                published = 0
                await self._wait(0.5)
                continue
            if published < self.batch:
                await self._wait(self.poll_interval if self.bus.nc.is_connected else 0.2)

    async def _wait(self, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(self._kick.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()

    def stop(self) -> None:
        self._stopping.set()
        self._pruning.stop()
