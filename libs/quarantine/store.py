"""The quarantine table of one service and the operations on it.

Each consuming service keeps the table in its own schema (created by a migration of its
own chain through :func:`dispo.libs.quarantine.schema.create_quarantine`); the
``search_path`` of the service's :class:`~dispo.libs.db.driver.Database` picks the
service's copy. A row is one stream message of one consumer, unique by
``(consumer, stream, stream_sequence)``. The statements below run on that Database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dispo.libs.bus import Bus
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Conn, Database, Row, Statement
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import NotFound

TABLE = "quarantine"
# Headers a replayed copy carries, so that it keeps its history if it comes back.
FIRST_SEEN_HEADER = "Dispo-Quarantine-First-Seen"
REPLAYS_HEADER = "Dispo-Quarantine-Replays"


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


_COLUMNS = (
    "id, consumer, stream, subject, stream_sequence, payload, error, deliveries, replays,"
    " first_seen, last_seen"
)

# A message kept; the same stream message again (its acknowledgement was lost) updates the
# row's error, deliveries and last sight.
HOLD = Statement(
    f"INSERT INTO {TABLE} (consumer, stream, subject, stream_sequence, payload, error,"
    " deliveries, replays, first_seen, last_seen) VALUES (:consumer, :stream, :subject,"
    " :stream_sequence, :payload, :error, :deliveries, :replays, :first_seen, :last_seen)"
    f" ON CONFLICT ON CONSTRAINT uq_{TABLE}_message DO UPDATE SET error = excluded.error,"
    " deliveries = excluded.deliveries, last_seen = excluded.last_seen"
)
# A page of rows after an id, of one consumer or (``:consumer`` empty) of all.
_OF_CONSUMER = "(CAST(:consumer AS text) = '' OR consumer = :consumer)"
PAGE = Statement(
    f"SELECT {_COLUMNS} FROM {TABLE} WHERE {_OF_CONSUMER} AND id > :after_id"
    " ORDER BY id LIMIT :limit"
)
COUNT = Statement(f"SELECT count(*) FROM {TABLE} WHERE {_OF_CONSUMER}")
SIZE = Statement(f"SELECT count(*) FROM {TABLE}")
GET = Statement(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = :id")
GET_FOR_UPDATE = Statement(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = :id FOR UPDATE")
DELETE = Statement(f"DELETE FROM {TABLE} WHERE id = :id RETURNING {_COLUMNS}")

# Retention's (ADR-0105): the messages of a stream that ages its messages out, last seen
# before the cutoff; those of a stream that keeps work until consumed wait for an operator.
DELETE_IF_AGED_BEFORE = Statement(
    f"WITH gone AS (DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE}"
    " WHERE last_seen < :cutoff AND stream = ANY(CAST(:streams AS text[]))"
    " ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED) RETURNING 1) SELECT count(*) FROM gone"
)
RETENTION_COUNTS = Statement(
    "SELECT count(*) FILTER (WHERE last_seen < :cutoff AND stream = ANY(CAST(:streams AS"
    " text[]))), count(*) FILTER (WHERE stream <> ALL(CAST(:streams AS text[])))"
    f" FROM {TABLE}"
)


async def quarantine_delete_if_aged_before(
    conn: Conn, streams: Sequence[str], cutoff: datetime, limit: int
) -> int:
    """Delete at most ``limit`` messages of ``streams`` (those that age their messages out,
    :data:`dispo.libs.contracts.AGING_STREAMS`) last seen before ``cutoff``, oldest first,
    skipping rows a replay holds; returns how many."""
    [deleted] = await DELETE_IF_AGED_BEFORE.scalars(
        conn, {"streams": list(streams), "cutoff": cutoff, "limit": limit}
    )
    return int(deleted)


async def quarantine_retention_counts(
    conn: Conn, streams: Sequence[str], cutoff: datetime
) -> tuple[int, int]:
    """The messages :func:`quarantine_delete_if_aged_before` would delete at ``cutoff``, and
    those of the other streams, kept until an operator replays or discards them."""
    [row] = await RETENTION_COUNTS.fetch(conn, {"streams": list(streams), "cutoff": cutoff})
    return int(row[0]), int(row[1])


def _held(row: Row) -> Held:
    return Held(**{name: row[name] for name in row.keys()})


class QuarantineStore:
    """The service's quarantine: written by the consumers' guard, read and acted on by the
    QuarantineService servicer. Time is ``clock``'s."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def hold(self, poisoned: Poisoned) -> None:
        """Keep ``poisoned``; the same stream message again (its acknowledgement was lost)
        updates the row."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            await HOLD.fetch(
                conn,
                {
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
                },
            )

    async def page(
        self, *, consumer: str, after_id: int | None, limit: int
    ) -> tuple[list[Held], int]:
        """Up to ``limit`` rows after ``after_id``, oldest first, and how many match in all,
        both from one snapshot (a message quarantined meanwhile is in neither or both)."""
        async with self.db.transaction() as conn:
            await conn.fetch("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            rows = await PAGE.fetch(
                conn,
                {"consumer": consumer, "after_id": after_id or 0, "limit": limit},
            )
            [total] = await COUNT.scalars(conn, {"consumer": consumer})
        return [_held(r) for r in rows], int(total)

    async def size(self) -> int:
        """How many messages the quarantine holds."""
        async with self.db.connection() as conn:
            [total] = await SIZE.scalars(conn)
        return int(total)

    async def get(self, message_id: int) -> Held:
        async with self.db.connection() as conn:
            return await self._get(conn, message_id, lock=False)

    async def discard(self, message_id: int) -> Held:
        """Remove the row for good; ``NotFound`` when there is none (any more)."""
        async with self.db.connection() as conn:
            rows = await DELETE.fetch(conn, {"id": message_id})
        if not rows:
            raise _not_found(message_id)
        return _held(rows[0])

    async def replay(self, message_id: int, bus: Bus) -> tuple[Held, int]:
        """Publish the payload again on its subject, then remove the row; the row is
        locked meanwhile, so two replays of one message publish it once. If the publish
        fails the row stays; if the removal fails after it, a retried replay publishes
        under the same message id and the stream drops the copy. Returns the row and the
        replayed copy's stream sequence."""
        async with self.db.transaction() as conn:
            held = await self._get(conn, message_id, lock=True)
            ack = await bus.publish(
                held.subject,
                held.payload,
                msg_id=held.replay_msg_id(),
                headers=held.replay_headers(),
            )
            await DELETE.fetch(conn, {"id": message_id})
        return held, int(ack.seq)

    async def _get(self, conn: Conn, message_id: int, *, lock: bool) -> Held:
        rows = await (GET_FOR_UPDATE if lock else GET).fetch(conn, {"id": message_id})
        if not rows:
            raise _not_found(message_id)
        return _held(rows[0])

    async def all(self) -> Sequence[Held]:
        """Every row, oldest first (tests and small tools)."""
        rows, _ = await self.page(consumer="", after_id=None, limit=1_000_000)
        return rows


def _not_found(message_id: int) -> NotFound:
    return NotFound(f"no quarantined message {message_id}")
