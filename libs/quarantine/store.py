"""The quarantine table of one service and the operations on it.

Each consuming service keeps the table in its own schema (created by a migration of its
own chain through :func:`dispo.libs.quarantine.schema.create_quarantine`); the engine's
``search_path`` picks the service's copy. A row is one stream message of one consumer,
unique by ``(consumer, stream, stream_sequence)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dispo.libs.bus import Bus
from dispo.libs.clock import Clock
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import NotFound
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    delete,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

TABLE = "quarantine"
# Headers a replayed copy carries, so that it keeps its history if it comes back.
FIRST_SEEN_HEADER = "Dispo-Quarantine-First-Seen"
REPLAYS_HEADER = "Dispo-Quarantine-Replays"


def quarantine_table(metadata: MetaData, name: str = TABLE) -> Table:
    return Table(
        name,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("consumer", Text, nullable=False),
        Column("stream", Text, nullable=False),
        Column("subject", Text, nullable=False),
        Column("stream_sequence", BigInteger, nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("error", Text, nullable=False),
        Column("deliveries", Integer, nullable=False),
        Column("replays", Integer, nullable=False),
        Column("first_seen", DateTime(timezone=True), nullable=False),
        Column("last_seen", DateTime(timezone=True), nullable=False),
        UniqueConstraint("consumer", "stream", "stream_sequence", name=f"uq_{name}_message"),
    )


quarantine = quarantine_table(MetaData())


@dataclass(frozen=True)
class Poisoned:
    """A message a consumer gives up on, as the guard hands it to the store."""

    consumer: str
    stream: str
    subject: str
    stream_sequence: int
    payload: bytes
    error: str
    deliveries: int
    replays: int
    first_seen: datetime


@dataclass(frozen=True)
class Held(Poisoned):
    """A row of the quarantine: what was held, with its id and when it was last seen."""

    id: int
    last_seen: datetime

    def replay_msg_id(self) -> str:
        """The replayed copy's message id: its own (the original's would be dropped by the
        stream's de-duplication), the same for a replay retried after its removal failed."""
        return f"replay:{self.consumer}:{self.stream}:{self.stream_sequence}:{self.replays + 1}"

    def replay_headers(self) -> dict[str, str]:
        return {
            FIRST_SEEN_HEADER: self.first_seen.isoformat(),
            REPLAYS_HEADER: str(self.replays + 1),
        }


def _held(row: object) -> Held:
    m = row._mapping  # type: ignore[attr-defined]
    return Held(**{c.name: m[c.name] for c in quarantine.columns})


class QuarantineStore:
    """The service's quarantine: written by the consumers' guard, read and acted on by the
    QuarantineService servicer. Time is ``clock``'s."""

    def __init__(self, engine: AsyncEngine, clock: Clock, table: Table = quarantine) -> None:
        self.engine = engine
        self.clock = clock
        self.table = table

    async def hold(self, poisoned: Poisoned) -> None:
        """Keep ``poisoned``; the same stream message again (its acknowledgement was lost)
        updates the row."""
        t = self.table
        now = self.clock.now()
        values = {
            "consumer": poisoned.consumer,
            "stream": poisoned.stream,
            "subject": poisoned.subject,
            "stream_sequence": poisoned.stream_sequence,
            "payload": poisoned.payload,
            "error": truncate_error(poisoned.error),
            "deliveries": poisoned.deliveries,
            "replays": poisoned.replays,
            "first_seen": min(poisoned.first_seen, now),
            "last_seen": now,
        }
        statement = insert(t).values(values)
        statement = statement.on_conflict_do_update(
            constraint=f"uq_{t.name}_message",
            set_={
                "error": statement.excluded.error,
                "deliveries": statement.excluded.deliveries,
                "last_seen": statement.excluded.last_seen,
            },
        )
        async with self.engine.begin() as conn:
            await conn.execute(statement)

    async def page(
        self, *, consumer: str, after_id: int | None, limit: int
    ) -> tuple[list[Held], int]:
        """Up to ``limit`` rows after ``after_id``, oldest first, and how many match in all,
        both from one snapshot (a message quarantined meanwhile is in neither or both)."""
        t = self.table
        where = [t.c.consumer == consumer] if consumer else []
        query = select(t).where(*where)
        if after_id is not None:
            query = query.where(t.c.id > after_id)
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            rows = (await conn.execute(query.order_by(t.c.id).limit(limit))).all()
            total = (
                await conn.execute(select(func.count()).select_from(t).where(*where))
            ).scalar_one()
        return [_held(r) for r in rows], int(total)

    async def size(self) -> int:
        """How many messages the quarantine holds."""
        async with self.engine.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(self.table))).scalar_one()
        return int(total)

    async def get(self, message_id: int) -> Held:
        async with self.engine.connect() as conn:
            return await self._get(conn, message_id, lock=False)

    async def discard(self, message_id: int) -> Held:
        """Remove the row for good; ``NotFound`` when there is none (any more)."""
        t = self.table
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(delete(t).where(t.c.id == message_id).returning(*t.columns))
            ).first()
        if row is None:
            raise _not_found(message_id)
        return _held(row)

    async def replay(self, message_id: int, bus: Bus) -> tuple[Held, int]:
        """Publish the payload again on its subject, then remove the row; the row is
        locked meanwhile, so two replays of one message publish it once. If the publish
        fails the row stays; if the removal fails after it, a retried replay publishes
        under the same message id and the stream drops the copy. Returns the row and the
        replayed copy's stream sequence."""
        t = self.table
        async with self.engine.begin() as conn:
            held = await self._get(conn, message_id, lock=True)
            ack = await bus.publish(
                held.subject,
                held.payload,
                msg_id=held.replay_msg_id(),
                headers=held.replay_headers(),
            )
            await conn.execute(delete(t).where(t.c.id == message_id))
        return held, int(ack.seq)

    async def _get(self, conn: AsyncConnection, message_id: int, *, lock: bool) -> Held:
        t = self.table
        query = select(t).where(t.c.id == message_id)
        row = (await conn.execute(query.with_for_update() if lock else query)).first()
        if row is None:
            raise _not_found(message_id)
        return _held(row)

    async def all(self) -> Sequence[Held]:
        """Every row, oldest first (tests and small tools)."""
        rows, _ = await self.page(consumer="", after_id=None, limit=1_000_000)
        return rows


def _not_found(message_id: int) -> NotFound:
    return NotFound(f"no quarantined message {message_id}")
