"""Transactional outbox: write the event row in the same transaction as the state change,
publish it afterwards, delete it (ADR-0062: the stream keeps the event; a row is in the
table only while it is unsent or quarantined). Only subjects declared in
dispo.libs.contracts are accepted. A crash or a NATS outage between commit and publish
only delays the event: the relay publishes whatever is unsent, oldest first, and the
message id makes a second publication of the same row a no-op within the stream's
duplicate window. The ``sent_at`` column is what versions before ADR-0062 marked instead
of deleting; the relay deletes the rows they marked, a batch at a time.

A row that cannot be published never holds back the rows behind it (ADR-0034): a batch that
fails is split until the failing rows are found, the others are published; each failure is
an attempt counted on the row with its error, retried after a backoff on the relay's clock,
and after ``DISPO_OUTBOX_MAX_ATTEMPTS`` the row is quarantined: kept in the table, marked,
with its last error, skipped by the relay, logged, and listed by :func:`outbox_quarantined`
(:func:`outbox_replay` puts a row back, :func:`outbox_discard` deletes it). Retention deletes
a quarantined row of a status snapshot or a callback once it was set aside longer than the
business policy's longest retention, and keeps the others, work a consumer must see, for an
operator (:func:`outbox_delete_if_quarantined_before`, ADR-0105).

Every statement runs on the driver port (:mod:`dispo.libs.db.driver`, ADR-0097): a
:class:`~dispo.libs.db.driver.Conn` in the caller's transaction, the relay on the service's
:class:`~dispo.libs.db.driver.Database`. The ``Table`` of :func:`outbox_table` is the
outbox's shape, for the services' migrations and tests; the statements read from it the
table's name and which optional columns it has.

A traced outbox (``outbox_table(metadata, traced=True)``) keeps with each row the trace
context of the work that wrote it (``trace``: :func:`dispo.libs.tracing.current`) and
publishes it as the message's ``traceparent`` headers; a row without one is published with
its message id alone, as on an untraced outbox.

A delayable outbox (``outbox_table(metadata, delayable=True)``, ADR-0103) keeps a row with
an ``available_at`` ahead of the relay's clock until then: a pass releases the rows that are
due (clears ``available_at``) and publishes them as any other. The unsent index leaves the
delayed rows out, so they cost the hot query nothing; they have an index of their own, by
``available_at``. Such a row is never handed to the direct publisher and is written
withdrawable, so it can be taken back until a pass claims it.

A withdrawable outbox (``outbox_table(metadata, withdrawable=True)``) lets its service take a
row back before it is published (:func:`outbox_withdraw`, ADR-0090) only where that can be
proven: a row is written ``withdrawable`` only when no direct publisher will take it
(:attr:`Staged.direct` False), and a pass clears the flag, and commits, before it publishes
the row. A row the direct publisher sends, or that a pass took, is never withdrawn.

    outbox = outbox_table(metadata)                   # in the service's tables module
    await outbox_add(conn, outbox, subject, msg_id, payload, now)   # inside the transaction
    await outbox_add_many(conn, outbox, [OutboxRow(subject, msg_id, payload, now), ...])
    relay = rt.outbox_relay(outbox)                   # OutboxRelay on the service's Database, bus, clock
    rt.add_part("outbox relay", relay.run, relay.stop)   # publishes and deletes what it sent
    relay.kick()                                      # after commit: publish now, not at the next poll
    staged = Staged()                                 # ... or, with the rows in hand:
    await outbox_add_many(conn, outbox, rows, staged)  # inside the transaction, then after commit:
    relay.publish_committed(staged)                   # published without a pass
    await outbox_quarantined(conn, outbox)            # the rows set aside, oldest first
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import nats.js.errors
from dispo.libs.backoff import backoff
from dispo.libs.bus import Bus, MessageTooLarge
from dispo.libs.clock import Clock, SystemClock
from dispo.libs.contracts import require_declared
from dispo.libs.db.driver import Conn, Database, Statement
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Pause, Periodic
from dispo.libs.tracing import headers_of
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    text,
)

log = get_logger(__name__)

DEFAULT_MAX_ATTEMPTS = 8
# Backoff between the attempts of a row that failed: 1 s doubling to a minute, so the
# default attempts span about two minutes, longer than a cluster's leader election.
RETRY_BASE_SECONDS = 1.0
RETRY_CAP_SECONDS = 60.0

_UNSENT = "sent_at IS NULL AND quarantined_at IS NULL"
# An unsent row of a delayable outbox that is due, or released: what a pass takes.
_READY = f"{_UNSENT} AND available_at IS NULL"
# An unsent row of a delayable outbox still held for later.
_DELAYED = f"{_UNSENT} AND available_at IS NOT NULL"


def _ready(table: Table) -> str:
    """The condition of a row a pass may take: unsent and, on a delayable outbox, due."""
    return _READY if "available_at" in table.c else _UNSENT


# Marking a row sent is deleting it (ADR-0062). Seconds a row the direct publisher sent
# waits for the next transaction's outbox write to mark it sent (:meth:`OutboxRelay.staged`)
# before the publisher marks it with a statement of its own: under load every flush marks
# the rows sent before it, with no statement more.
MARK_DELAY = 0.05
# Seconds after which rows handed to a transaction that never reported back (it failed)
# are marked by the publisher.
MARK_RETAKE = 5.0


def outbox_table(
    metadata: MetaData,
    name: str = "outbox",
    *,
    traced: bool = False,
    withdrawable: bool = False,
    delayable: bool = False,
) -> Table:
    """The outbox of one service. ``attempts``, ``last_error`` and ``next_attempt_at`` are
    the failed publications of a row; ``quarantined_at`` marks a row set aside. A ``traced``
    outbox (its service's migration added the column, :data:`TRACE_UPGRADE`) keeps in
    ``trace`` the trace context of the work that wrote the row (:mod:`dispo.libs.tracing`),
    published as the message's headers. A ``withdrawable`` outbox (:data:`WITHDRAW_UPGRADE`)
    marks in ``withdrawable`` the rows no publisher has taken yet (:func:`outbox_withdraw`).
    A ``delayable`` outbox (:data:`DELAY_UPGRADE`) holds a row until its ``available_at``."""
    optional: list[Any] = [Column("trace", Text)] if traced else []
    if withdrawable:
        optional.append(
            Column("withdrawable", Boolean, nullable=False, server_default=text("false"))
        )
    unsent = _UNSENT
    if delayable:
        unsent = _READY
        optional.append(Column("available_at", DateTime(timezone=True)))
        optional.append(Index(f"{name}_delayed", "available_at", postgresql_where=text(_DELAYED)))
    return Table(
        name,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("subject", Text, nullable=False),
        Column("msg_id", Text, nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("sent_at", DateTime(timezone=True)),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("last_error", Text),
        Column("next_attempt_at", DateTime(timezone=True)),
        Column("quarantined_at", DateTime(timezone=True)),
        *optional,
        Index(f"{name}_unsent", "id", postgresql_where=text(unsent)),
        Index(f"{name}_quarantined", "id", postgresql_where=text("quarantined_at IS NOT NULL")),
    )


# The schema step that gave every outbox its attempts and its quarantine, run by each
# service's own migration on its table (frozen: a later change is a new step).
QUARANTINE_UPGRADE = (
    "ALTER TABLE outbox ADD COLUMN attempts integer NOT NULL DEFAULT 0,"
    " ADD COLUMN last_error text, ADD COLUMN next_attempt_at timestamptz,"
    " ADD COLUMN quarantined_at timestamptz",
    "DROP INDEX outbox_unsent",
    "CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL AND quarantined_at IS NULL",
    "CREATE INDEX outbox_quarantined ON outbox (id) WHERE quarantined_at IS NOT NULL",
)
QUARANTINE_DOWNGRADE = (
    "DROP INDEX outbox_quarantined",
    "DROP INDEX outbox_unsent",
    "ALTER TABLE outbox DROP COLUMN attempts, DROP COLUMN last_error,"
    " DROP COLUMN next_attempt_at, DROP COLUMN quarantined_at",
    "CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL",
)


# The schema step that gave an outbox its trace context (frozen, as above).
TRACE_UPGRADE = ("ALTER TABLE outbox ADD COLUMN trace text",)
TRACE_DOWNGRADE = ("ALTER TABLE outbox DROP COLUMN trace",)

# The schema step that made an outbox withdrawable (frozen, as above). Rows written before
# it may be on their way to the bus already: they are not withdrawable.
WITHDRAW_UPGRADE = ("ALTER TABLE outbox ADD COLUMN withdrawable boolean NOT NULL DEFAULT false",)
WITHDRAW_DOWNGRADE = ("ALTER TABLE outbox DROP COLUMN withdrawable",)

# The schema step that made an outbox delayable (frozen, as above): the unsent index leaves
# the delayed rows out, and they have one of their own (ADR-0103).
DELAY_UPGRADE = (
    "ALTER TABLE outbox ADD COLUMN available_at timestamptz",
    "DROP INDEX outbox_unsent",
    "CREATE INDEX outbox_unsent ON outbox (id)"
    " WHERE sent_at IS NULL AND quarantined_at IS NULL AND available_at IS NULL",
    "CREATE INDEX outbox_delayed ON outbox (available_at)"
    " WHERE sent_at IS NULL AND quarantined_at IS NULL AND available_at IS NOT NULL",
)
DELAY_DOWNGRADE = (
    "DROP INDEX outbox_delayed",
    "DROP INDEX outbox_unsent",
    "ALTER TABLE outbox DROP COLUMN available_at",
    "CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL AND quarantined_at IS NULL",
)


def _migrate(statements: Sequence[str]) -> None:
    from alembic import op

    for statement in statements:
        op.execute(statement)


def quarantine_upgrade() -> None:
    """A service migration's ``upgrade``: :data:`QUARANTINE_UPGRADE` on its outbox."""
    _migrate(QUARANTINE_UPGRADE)


def quarantine_downgrade() -> None:
    """A service migration's ``downgrade``: :data:`QUARANTINE_DOWNGRADE` on its outbox."""
    _migrate(QUARANTINE_DOWNGRADE)


def trace_upgrade() -> None:
    """A service migration's ``upgrade``: :data:`TRACE_UPGRADE` on its outbox."""
    _migrate(TRACE_UPGRADE)


def trace_downgrade() -> None:
    """A service migration's ``downgrade``: :data:`TRACE_DOWNGRADE` on its outbox."""
    _migrate(TRACE_DOWNGRADE)


def withdraw_upgrade() -> None:
    """A service migration's ``upgrade``: :data:`WITHDRAW_UPGRADE` on its outbox."""
    _migrate(WITHDRAW_UPGRADE)


def withdraw_downgrade() -> None:
    """A service migration's ``downgrade``: :data:`WITHDRAW_DOWNGRADE` on its outbox."""
    _migrate(WITHDRAW_DOWNGRADE)


def delay_upgrade() -> None:
    """A service migration's ``upgrade``: :data:`DELAY_UPGRADE` on its outbox."""
    _migrate(DELAY_UPGRADE)


def delay_downgrade() -> None:
    """A service migration's ``downgrade``: :data:`DELAY_DOWNGRADE` on its outbox."""
    _migrate(DELAY_DOWNGRADE)


async def outbox_add(
    conn: Conn,
    table: Table,
    subject: str,
    msg_id: str,
    payload: bytes,
    now: datetime,
    trace: str | None = None,
) -> None:
    """Write one event row in the caller's transaction (:func:`outbox_add_many` with a list
    of one). The subject must be carried by a stream declared in
    :mod:`dispo.libs.contracts` (else :class:`UndeclaredSubject`, and nothing is written):
    an event no stream stores would be published into the void. ``trace``
    (:func:`dispo.libs.tracing.current`) is kept on a traced outbox."""
    await outbox_add_many(conn, table, [OutboxRow(subject, msg_id, payload, now, trace)])


class OutboxRow(NamedTuple):
    """One event row for :func:`outbox_add_many`."""

    subject: str
    msg_id: str
    payload: bytes
    created_at: datetime
    # The trace context to publish with it (kept on a traced outbox only).
    trace: str | None = None


class Staged:
    """The rows one transaction wrote with :func:`outbox_add_many`, for
    :meth:`OutboxRelay.publish_committed` once it committed. ``unstaged``: the transaction
    also wrote rows without it (:func:`outbox_add`), which a pass publishes.

    ``marking``: rows the relay published already (:meth:`OutboxRelay.staged`), deleted
    by this transaction's outbox write (``marked`` once it wrote them into its statement),
    so that deleting them costs no statement of its own.

    ``direct``: the rows go to the relay's direct publisher after the commit (False: the
    relay is not publishing directly, or the bus was disconnected, and a pass publishes
    them). On a withdrawable outbox the rows of a Staged that is not direct are written
    ``withdrawable`` (:func:`outbox_withdraw`); a direct one's never are: the direct
    publisher sends them without a row lock a withdrawal would wait for."""

    def __init__(self, marking: Sequence[int] = (), *, direct: bool = True) -> None:
        self.ids: list[int] = []
        self.rows: list[OutboxRow] = []
        self.unstaged = False
        self.marking: list[int] = list(marking)
        self.marked: list[int] = []
        self.direct = direct

    @property
    def withdrawable(self) -> bool:
        """Whether its rows are written withdrawable (on an outbox that has the column)."""
        return not self.direct

    def mark_params(self) -> dict[str, Any]:
        """The parameters of :func:`outbox_mark_cte` in the statement about to run: every
        row of ``marking``, deleted as sent."""
        self.marked = self.marking
        return {"marking": self.marking}

    def add(self, ids: Sequence[int], rows: Sequence[OutboxRow]) -> None:
        """Rows written with these ids (in the same order)."""
        self.ids.extend(ids)
        self.rows.extend(rows)


async def outbox_add_many(
    conn: Conn,
    table: Table,
    rows: Sequence[OutboxRow],
    staged: Staged | None = None,
) -> list[int]:
    """Write many event rows in the caller's transaction with one statement, in the order
    given (the relay publishes in outbox order); returns their ids, in the same order, and
    adds the rows to ``staged`` if given. Every subject is checked first, as in
    :func:`outbox_add`: one undeclared subject refuses the whole call, and nothing is written.
    """
    for row in rows:
        require_declared(row.subject)
    if not rows:
        return []
    params = {
        "subjects": [r.subject for r in rows],
        "msg_ids": [r.msg_id for r in rows],
        "payloads": [r.payload for r in rows],
        "created": [r.created_at for r in rows],
    }
    # The trace column only when a row carries a context: untraced work writes what it did.
    traced = "trace" in table.c and any(r.trace is not None for r in rows)
    if traced:
        params["traces"] = [r.trace for r in rows]
    if "withdrawable" in table.c:
        params["withdrawable"] = staged is not None and staged.withdrawable
    marking = staged is not None and bool(staged.marking)
    if marking:
        assert staged is not None
        params.update(staged.mark_params())
    # Ids are numbered in insertion order, and the rows go in in the order given.
    ids = sorted(await _insert_many(table, traced, marking).scalars(conn, params))
    if staged is not None:
        staged.add(ids, rows)
    return ids


def outbox_insert_from(table: Table, select: str) -> str:
    """SQL inserting into ``table`` the rows ``select`` yields — its columns, in order,
    ``subject, msg_id, payload, created_at, trace`` (trace NULL for none; a traced outbox
    only), then ``withdrawable`` on a withdrawable outbox (:attr:`Staged.withdrawable`),
    then ``available_at`` on a delayable one (NULL: at once) — and returning ``id, msg_id``: the last part of a statement that writes its own
    rows and their events together (``WITH written AS (INSERT ... RETURNING ...)``), so a
    write and its events are one statement, atomic on its own, with no transaction around
    it. ``select`` must order its rows (``ORDER BY``): ids are numbered in that order, the
    order the relay publishes in. The caller checks each subject with
    :func:`~dispo.libs.contracts.require_declared` first, as :func:`outbox_add_many` does."""
    trace = ", trace" if "trace" in table.c else ""
    withdrawable = ", withdrawable" if "withdrawable" in table.c else ""
    available = ", available_at" if "available_at" in table.c else ""
    return (
        f"INSERT INTO {table.fullname}"
        f" (subject, msg_id, payload, created_at{trace}{withdrawable}{available})"
        f" {select} RETURNING id, msg_id"
    )


def _insert_many(table: Table, traced: bool = False, marking: bool = False) -> Statement:
    """The multi-row insert of ``table`` (with the ``trace`` column when ``traced``, after
    :func:`outbox_mark_cte` when ``marking``): the rows as arrays, one statement text
    whatever their number (prepared once per connection). ``WITH ORDINALITY`` keeps their
    order. On a withdrawable outbox every row takes ``:withdrawable``."""
    # By the table's shape: outboxes of one name differ between services (one process may
    # hold several, as a test does).
    key = (table.fullname, tuple(table.c.keys()), traced, marking)
    statement = _INSERT_MANY.get(key)
    if statement is None:
        trace, traces, name = (
            (", trace", ", CAST(:traces AS text[])", ", trace") if traced else ("", "", "")
        )
        column, value = (
            (", withdrawable", ", CAST(:withdrawable AS boolean)")
            if "withdrawable" in table.c
            else ("", "")
        )
        statement = Statement(
            (f"WITH {outbox_mark_cte(table)} " if marking else "")
            + f"INSERT INTO {table.fullname} (subject, msg_id, payload, created_at{trace}{column})"
            f" SELECT subject, msg_id, payload, created_at{trace}{value} FROM unnest("
            "CAST(:subjects AS text[]), CAST(:msg_ids AS text[]),"
            f" CAST(:payloads AS bytea[]), CAST(:created AS timestamptz[]){traces})"
            f" WITH ORDINALITY AS r(subject, msg_id, payload, created_at{name}, n) ORDER BY n"
            " RETURNING id"
        )
        _INSERT_MANY[key] = statement
    return statement


_INSERT_MANY: dict[tuple[str, tuple[str, ...], bool, bool], Statement] = {}


def _mark_sent_sql(table: Table) -> str:
    """The rows of ``:marking`` (published) deleted; locked in id order first, so that two
    statements taking overlapping rows wait for each other rather than deadlock (the
    second finds them gone). A delete, not an update that marks them: a marked row would
    be a new version of the row, payload and all, with its own index entries, in the
    table and in the write-ahead log (ADR-0062)."""
    return (
        f"DELETE FROM {table.fullname} WHERE id IN (SELECT id FROM {table.fullname}"
        " WHERE id = ANY(CAST(:marking AS bigint[])) ORDER BY id FOR UPDATE)"
    )


def outbox_mark_cte(table: Table) -> str:
    """A ``WITH`` item (``marked AS (...)``) deleting the rows the relay published
    already: put it in the statement that writes a transaction's outbox rows, with
    :meth:`Staged.mark_params` among its parameters."""
    return f"marked AS ({_mark_sent_sql(table)})"


async def outbox_withdraw(conn: Conn, table: Table, subject: str, msg_id: str) -> bool:
    """Delete the unsent row of ``subject`` with ``msg_id`` if it is still withdrawable (a
    withdrawable outbox, :func:`outbox_table`); True if it was: its event was never
    published and never will be. False if there is none, or a publisher may have taken it
    (the direct publisher's rows never are withdrawable; a pass clears the flag, and
    commits, before it publishes a row, so a withdrawal waiting for the pass's row lock
    finds it cleared) — then the event is, or may be, on its way (ADR-0090)."""
    rows = await _sql(table).withdraw_if_withdrawable.fetch(
        conn, {"subject": subject, "msg_id": msg_id}
    )
    return bool(rows)


async def outbox_prune(conn: Conn, table: Table, limit: int) -> int:
    """Delete up to ``limit`` rows marked sent (``sent_at``: kept by a version before
    ADR-0062, which marked sent rows instead of deleting them, during a rolling upgrade
    and after it); returns how many were deleted. The stream keeps the events."""
    [deleted] = await _sql(table).prune_if_sent.scalars(conn, {"limit": limit})
    return int(deleted)


class OutboxBacklog(NamedTuple):
    """What an outbox holds back: rows not published yet, the oldest one's creation time
    (None when there is none), rows set aside."""

    unsent: int
    oldest_unsent: datetime | None
    quarantined: int


async def outbox_backlog(conn: Conn, table: Table) -> OutboxBacklog:
    """:class:`OutboxBacklog` of ``table``, from its two partial indexes (the oldest row by
    id: rows are numbered as they are written)."""
    [row] = await _sql(table).backlog.fetch(conn)
    return OutboxBacklog(int(row[0]), row[1], int(row[2]))


class QuarantinedRow(NamedTuple):
    """A row the relay set aside: what an operator needs to judge it (not its payload)."""

    id: int
    subject: str
    msg_id: str
    size: int
    attempts: int
    last_error: str
    created_at: datetime
    quarantined_at: datetime


async def outbox_quarantined(
    conn: Conn, table: Table, *, after_id: int = 0, limit: int = 100
) -> list[QuarantinedRow]:
    """The quarantined rows of ``table`` with an id above ``after_id``, oldest first, at
    most ``limit`` (page on with the last id returned)."""
    rows = await _sql(table).quarantined.fetch(conn, {"after_id": after_id, "limit": limit})
    return [QuarantinedRow(*r) for r in rows]


async def outbox_replay(conn: Conn, table: Table, ids: Sequence[int]) -> int:
    """Give quarantined rows back to the relay with a fresh count of attempts (after the
    cause was removed); returns how many were quarantined and now are not."""
    return len(await _sql(table).replay_if_quarantined.fetch(conn, {"ids": list(ids)}))


async def outbox_discard(conn: Conn, table: Table, ids: Sequence[int]) -> int:
    """Delete quarantined rows (their events are given up); returns how many."""
    return len(await _sql(table).discard_if_quarantined.fetch(conn, {"ids": list(ids)}))


class QuarantineCounts(NamedTuple):
    """An outbox's quarantined rows as retention sees them (ADR-0105): ``due``, set aside
    before the cutoff and of a subject whose stream ages its messages out, which the next
    passes delete; ``held``, of a stream that keeps work until consumed (``task.create``
    among them), kept until an operator replays or discards them."""

    due: int
    held: int


async def outbox_delete_if_quarantined_before(
    conn: Conn, table: Table, cutoff: datetime, aging: str, limit: int
) -> int:
    """Delete at most ``limit`` rows quarantined before ``cutoff`` whose subject matches
    ``aging`` (:func:`dispo.libs.contracts.aging_subjects_pattern`), oldest first, skipping
    rows another transaction holds; returns how many. A row replayed since (its
    ``quarantined_at`` cleared) is not touched."""
    [deleted] = await _sql(table).delete_if_quarantined_before.scalars(
        conn, {"cutoff": cutoff, "aging": aging, "limit": limit}
    )
    return int(deleted)


async def outbox_quarantine_counts(
    conn: Conn, table: Table, cutoff: datetime, aging: str
) -> QuarantineCounts:
    """:class:`QuarantineCounts` of ``table`` at ``cutoff`` (read from its quarantine's
    partial index: the rows set aside are few)."""
    [row] = await _sql(table).quarantine_counts.fetch(conn, {"cutoff": cutoff, "aging": aging})
    return QuarantineCounts(int(row[0]), int(row[1]))


class _Sql:
    """The statements of one outbox (its name, and its optional columns), made once per
    outbox (:func:`_sql`); each names its guard: a row published, withdrawn, replayed or
    discarded only in the state that allows it."""

    def __init__(self, table: Table) -> None:
        t = table.fullname
        optional = [c for c in ("trace", "withdrawable") if c in table.c]
        columns = ", ".join(
            ["id", "subject", "msg_id", "payload", "attempts", "next_attempt_at", *optional]
        )
        ready = _ready(table)
        self.mark_sent = Statement(_mark_sent_sql(table))
        # A pass's rows (see :meth:`unsent`).
        self._unsent = {
            (ordered, held): Statement(
                f"SELECT {columns} FROM {t} WHERE {ready}"
                + ("" if ordered else " AND (next_attempt_at IS NULL OR next_attempt_at <= :now)")
                + (" AND id <> ALL(CAST(:held AS bigint[]))" if held else "")
                + " ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED"
            )
            for ordered in (False, True)
            for held in (False, True)
        }
        # The delayed rows due at ``:now``, released to the passes (oldest due first, at
        # most ``:limit``; rows another pass releases are skipped).
        self.release_if_due = Statement(
            f"UPDATE {t} SET available_at = NULL WHERE id IN (SELECT id FROM {t}"
            f" WHERE {_DELAYED} AND available_at <= :now ORDER BY available_at"
            " LIMIT :limit FOR UPDATE SKIP LOCKED) RETURNING id"
        )
        self.delete_sent = Statement(f"DELETE FROM {t} WHERE id = ANY(CAST(:ids AS bigint[]))")
        self.claim_withdrawable = Statement(
            f"UPDATE {t} SET withdrawable = false WHERE id = ANY(CAST(:ids AS bigint[]))"
        )
        self.fail_if_unsent = Statement(
            f"UPDATE {t} o SET attempts = f.attempts, last_error = f.error,"
            " next_attempt_at = f.next_attempt_at, quarantined_at = f.quarantined_at"
            " FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[]),"
            " CAST(:errors AS text[]), CAST(:next AS timestamptz[]),"
            " CAST(:quarantined AS timestamptz[]))"
            " AS f(id, attempts, error, next_attempt_at, quarantined_at)"
            " WHERE o.id = f.id AND o.sent_at IS NULL"
        )
        self.withdraw_if_withdrawable = Statement(
            f"DELETE FROM {t} WHERE msg_id = :msg_id AND subject = :subject"
            " AND sent_at IS NULL AND withdrawable RETURNING id"
        )
        self.prune_if_sent = Statement(
            f"WITH pruned AS (DELETE FROM {t} WHERE id IN (SELECT id FROM {t}"
            " WHERE sent_at IS NOT NULL ORDER BY id LIMIT :limit) RETURNING 1)"
            " SELECT count(*) FROM pruned"
        )
        self.backlog = Statement(
            f"SELECT (SELECT count(*) FROM {t} WHERE {ready}),"
            f" (SELECT created_at FROM {t} WHERE {ready} ORDER BY id LIMIT 1),"
            f" (SELECT count(*) FROM {t} WHERE quarantined_at IS NOT NULL)"
        )
        self.quarantined = Statement(
            "SELECT id, subject, msg_id, octet_length(payload), attempts,"
            f" coalesce(last_error, ''), created_at, quarantined_at FROM {t}"
            " WHERE quarantined_at IS NOT NULL AND id > :after_id ORDER BY id LIMIT :limit"
        )
        self.replay_if_quarantined = Statement(
            f"UPDATE {t} SET quarantined_at = NULL, attempts = 0, next_attempt_at = NULL"
            " WHERE id = ANY(CAST(:ids AS bigint[])) AND quarantined_at IS NOT NULL"
            " AND sent_at IS NULL RETURNING id"
        )
        # Retention's (ADR-0105): the rows set aside before the cutoff of a subject whose
        # stream ages its messages out; the others wait for an operator.
        self.delete_if_quarantined_before = Statement(
            f"WITH gone AS (DELETE FROM {t} WHERE id IN (SELECT id FROM {t}"
            " WHERE quarantined_at IS NOT NULL AND quarantined_at < :cutoff"
            " AND subject ~ CAST(:aging AS text) ORDER BY id LIMIT :limit"
            " FOR UPDATE SKIP LOCKED) AND quarantined_at IS NOT NULL RETURNING 1)"
            " SELECT count(*) FROM gone"
        )
        self.quarantine_counts = Statement(
            "SELECT count(*) FILTER (WHERE quarantined_at < :cutoff"
            " AND subject ~ CAST(:aging AS text)),"
            f" count(*) FILTER (WHERE subject !~ CAST(:aging AS text)) FROM {t}"
            " WHERE quarantined_at IS NOT NULL"
        )
        self.discard_if_quarantined = Statement(
            f"DELETE FROM {t} WHERE id = ANY(CAST(:ids AS bigint[]))"
            " AND quarantined_at IS NOT NULL RETURNING id"
        )

    def unsent(self, *, ordered: bool, held: bool) -> Statement:
        """Up to ``:limit`` unsent rows, oldest first, locked, skipping the rows another
        pass holds; due at ``:now`` unless ``ordered`` (an ordered relay must see a row that
        is not due: it waits for it); not one of ``:held`` (the direct publisher's) when
        ``held``."""
        return self._unsent[(ordered, held)]


_SQL: dict[tuple[str, tuple[str, ...]], _Sql] = {}


def _sql(table: Table) -> _Sql:
    """The statements of ``table``, made once per outbox shape."""
    key = (table.fullname, tuple(table.c.keys()))
    sql = _SQL.get(key)
    if sql is None:
        sql = _SQL.setdefault(key, _Sql(table))
    return sql


class _Committed(NamedTuple):
    """A row handed to :meth:`OutboxRelay.publish_committed`: what a pass would read back."""

    id: int
    subject: str
    msg_id: str
    payload: bytes
    trace: str | None


class _Failure(NamedTuple):
    row: Any
    error: BaseException


def _answered(error: BaseException) -> bool:
    """The bus's size check or the server refused this very message (a 4xx answer, such as
    a stream's message size limit): its own failure, whatever the other rows did. A timeout,
    a lost connection, no stream answering or a server error (5xx: storage, no quorum) says
    nothing about the row unless other rows of the same pass went out."""
    if isinstance(error, MessageTooLarge):
        return True
    code = getattr(error, "code", None) if isinstance(error, nats.js.errors.APIError) else None
    return isinstance(code, int) and 400 <= code < 500


class _Split:
    """One pass's publication of rows: at once, and when that fails, in halves down to the
    rows that fail. Parts that time out (JetStream not answering) are not split for ever:
    after two timeouts with nothing published, or :data:`_MOST_TIMEOUTS` in all, the rest
    of the pass is given up as an outage, each row failed with the last timeout."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.sent: list[Any] = []
        self.failed: list[_Failure] = []
        self.timeouts = 0
        self.outage: BaseException | None = None

    async def publish(self, rows: list[Any]) -> None:
        if not rows:
            return
        if self.outage is not None:
            self.failed.extend(_Failure(r, self.outage) for r in rows)
            return
        try:
            await _publish(self.bus, rows)
        except Exception as error:
            if isinstance(error, TimeoutError):
                self.timeouts += 1
                if self.timeouts >= (_MOST_TIMEOUTS if self.sent else 2):
                    self.outage = error
            if len(rows) == 1 or self.outage is not None or not self.bus.nc.is_connected:
                self.failed.extend(_Failure(r, error) for r in rows)
                return
            half = len(rows) // 2
            await self.publish(rows[:half])
            await self.publish(rows[half:])
            return
        self.sent.extend(rows)


_MOST_TIMEOUTS = 8


async def _publish(bus: Bus, rows: Sequence[Any]) -> None:
    """Rows (a pass's or the direct publisher's) with one pipelined publish, each with its
    message id and, where it keeps one, its trace context."""
    headers = [_headers(r) for r in rows]
    await bus.publish_many(
        [(r.subject, r.payload, r.msg_id) for r in rows],
        headers=headers if any(headers) else None,
    )


def _headers(row: Any) -> dict[str, str] | None:
    """The headers a row's message carries besides its id: its trace context, if the row
    keeps one (a traced outbox's, :func:`outbox_table`)."""
    trace = getattr(row, "trace", None)
    return headers_of(trace) if trace else None


class OutboxRelay:
    """Publishes unsent rows in batches; several replicas share the work (SKIP LOCKED).

    Options for a service that needs them:

    - ``ordered``: publish a batch one message at a time, each after the previous one's ack,
      so the stream keeps the outbox order even when a publish fails midway (by default a
      batch is published at once, :meth:`Bus.publish_many`, and deleted by one
      statement). A row that fails stops the batch: the rows behind it wait until it is
      published or quarantined.
    - ``prepare``: awaited before the first batch, and again until it succeeds (e.g. ensuring
      the stream the events go to).
    - ``clock``: the service's clock (default: the system's). The pruning pauses on it, and
      a failed row's next attempt is due on it.
    - ``max_attempts``: failed publications of a row before it is quarantined.

    A row that cannot be published (ADR-0034): when a batch fails, it is split in halves,
    each published again, until the failing rows are found; the rest go out in the same
    pass, so only a failing batch is published in parts. A failure counts as an attempt of
    the row when it is the row's own (over the bus's size limit, or refused by the server)
    or when other rows of the pass were published (the bus works; this row does not). A
    pass in which nothing went out for want of an answer or a connection counts nothing: the
    bus is down, not the rows (and after two timeouts with nothing published, the pass
    stops splitting and gives up). A row with failed attempts is tried alone, after a backoff
    on the clock, so it does not make the next batch fail; after ``max_attempts`` it is
    quarantined (logged, listed by :func:`outbox_quarantined`).

    Publication after commit: a service that has the rows it just committed in hand gives
    them to :meth:`publish_committed` instead of kicking a pass. While the relay runs, its
    direct publisher sends whatever has been handed over since its last send with one
    pipelined publish and deletes it with one statement, so the rows are never read back
    and a burst of small transactions goes out as one batch. A pass never takes a row the
    direct publisher holds. What the direct publisher cannot send (the bus down, a refusal, a
    row over the size limit) it leaves unsent and kicks a pass, which counts the failure as
    above; the pass remains what publishes after a crash, an outage, or for another replica.

    A withdrawable outbox (ADR-0090): rows the direct publisher will not take are written
    withdrawable and left to a pass, which claims them (clears the flag and commits) before
    it publishes them, so :func:`outbox_withdraw` never takes a row that may be on the bus.

    A published row is deleted (ADR-0062: the stream keeps the event). While it runs, the
    relay also deletes the rows a version before that marked sent instead (``sent_at``), at
    most ``prune_batch`` per transaction, one pass after another while passes delete
    something, then a pause of ``prune_interval`` clock seconds (:meth:`prune_once` is one
    pass).
    """

    def __init__(
        self,
        db: Database,
        table: Table,
        bus: Bus,
        *,
        batch: int = 500,
        poll_interval: float = 1.0,
        ordered: bool = False,
        prepare: Callable[[], Awaitable[None]] | None = None,
        clock: Clock | None = None,
        prune_batch: int = 1000,
        prune_interval: float = 300.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        mark_delay: float = MARK_DELAY,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.db = db
        self.table = table
        self.bus = bus
        self.batch = batch
        self.poll_interval = poll_interval
        self.ordered = ordered
        self._prepare = prepare
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.prune_batch = prune_batch
        self.prune_interval = prune_interval
        self.max_attempts = max_attempts
        self._kick = asyncio.Event()
        self._stopping = asyncio.Event()
        # Rows handed over after their commit, waiting for the direct publisher; the ids it
        # holds (queued or being sent), which a pass leaves alone.
        self._committed: deque[_Committed] = deque()
        self._held: set[int] = set()
        self._direct_wake = asyncio.Event()
        self._direct_running = False
        # Rows the direct publisher sent so far (for reports and tests).
        self.published_directly = 0
        # Rows it sent and nothing marked sent yet, by id: the loop time they were sent
        # (waiting for the next transaction's outbox write, :meth:`staged`), or handed to
        # a transaction (``_marking``: the time it took them). Both stay held.
        self._unmarked: dict[int, float] = {}
        self._marking: dict[int, float] = {}
        self.mark_delay = mark_delay
        self._sql = _sql(table)
        self._pruning = Periodic(
            f"{table.name} prune", self._prune_pass, prune_interval, self.clock
        )

    def kick(self) -> None:
        self._kick.set()

    def staged(self) -> Staged:
        """A :class:`Staged` for a transaction about to write outbox rows, which also marks
        sent the rows the direct publisher sent since the last one (hand it to
        :meth:`publish_committed` after the commit). A transaction that fails, or writes
        no outbox row, leaves them to the direct publisher, which marks them itself after
        :data:`MARK_RETAKE` seconds."""
        marking = list(self._unmarked)
        now = asyncio.get_running_loop().time()
        self._marking.update(dict.fromkeys(marking, now))
        self._unmarked.clear()
        direct = self._direct_running and not self.ordered and self.bus.nc.is_connected
        return Staged(marking, direct=direct)

    def publish_committed(self, staged: Staged) -> None:
        """Publish the rows a transaction of this process has just committed (``staged``)
        without a pass reading them back; returns at once. An ordered relay, or one not
        running, takes a pass instead, as do rows the transaction did not stage and the
        rows of a Staged that is not direct (they may be withdrawable: only a pass, which
        takes them under its row lock, may publish them)."""
        self._marked(staged.marked)
        if staged.marking and not staged.marked:  # no outbox write took them: back in line
            self._unmark(staged.marking)
        if self.ordered or not self._direct_running or not staged.direct:
            if staged.rows or staged.unstaged:
                self.kick()
            return
        if staged.unstaged:
            self.kick()
        for row_id, row in zip(staged.ids, staged.rows, strict=True):
            self._committed.append(
                _Committed(row_id, row.subject, row.msg_id, row.payload, row.trace)
            )
            self._held.add(row_id)
        self._direct_wake.set()

    def _marked(self, ids: Sequence[int]) -> None:
        for row_id in ids:
            self._marking.pop(row_id, None)
            self._unmarked.pop(row_id, None)
            self._held.discard(row_id)

    def _unmark(self, ids: Sequence[int]) -> None:
        """Rows a transaction took to mark and did not: the next one takes them."""
        now = asyncio.get_running_loop().time()
        for row_id in ids:
            if self._marking.pop(row_id, None) is not None:
                self._unmarked[row_id] = now

    async def _publish_directly(self) -> None:
        """The direct publisher: while the relay runs, send what was handed over; mark sent
        what no transaction marked for it soon enough."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            wait = None
            if self._unmarked or self._marking:
                due = min(
                    [t + self.mark_delay for t in self._unmarked.values()]
                    + [t + MARK_RETAKE for t in self._marking.values()]
                )
                wait = max(0.0, due - loop.time())
            await self._wait_for(self._direct_wake, wait)
            self._direct_wake.clear()
            while self._committed and not self._stopping.is_set():
                rows = [
                    self._committed.popleft() for _ in range(min(self.batch, len(self._committed)))
                ]
                if not await self._send_committed(rows):
                    self._held.difference_update(r.id for r in rows)
            now = loop.time()
            overdue = [i for i, t in self._unmarked.items() if now - t >= self.mark_delay]
            overdue += [i for i, t in self._marking.items() if now - t >= MARK_RETAKE]
            if overdue:
                await self._mark_overdue(overdue)

    async def _send_committed(self, rows: list[_Committed]) -> bool:
        """One pipelined publish of ``rows``; True if it went out (the rows are then marked
        sent by the next transaction's outbox write, or by :meth:`_mark_overdue`).
        Anything that fails leaves the rows to a pass (kicked): it publishes them again, a
        no-op by message id for those that went out, and counts the failures."""
        if not self.bus.nc.is_connected:  # see relay_once: wait for the connection
            self.kick()
            return False
        try:
            await _publish(self.bus, rows)
        except Exception as error:
            log.info(
                "outbox rows left to the relay's pass",
                table=self.table.name,
                rows=len(rows),
                error=repr(error),
            )
            self.kick()
            return False
        now = asyncio.get_running_loop().time()
        self._unmarked.update((r.id, now) for r in rows)
        self.published_directly += len(rows)
        return True

    async def _mark_overdue(self, ids: list[int]) -> None:
        """Mark sent with a statement of their own the rows no transaction marked in time.
        PostgreSQL down: they are left to a pass, which sends them again (a no-op)."""
        try:
            async with self.db.connection() as conn:
                await self._sql.mark_sent.fetch(conn, {"marking": sorted(ids)})
        except Exception as error:
            log.warning("outbox rows not marked sent", table=self.table.name, error=repr(error))
            self._marked(ids)  # let go of them: a pass sends them again
            self.kick()
            return
        self._marked(ids)

    async def relay_once(self) -> int:
        """Publish up to one batch of unsent rows; returns how many were published. Rows
        still withdrawable are claimed first, in a transaction of their own (ADR-0090)."""
        if not self.bus.nc.is_connected:
            # A publish now would sit in the client's reconnect buffer and go out later,
            # outside our transaction; wait for the connection instead.
            return 0
        if self._prepare is not None:
            await self._prepare()
            self._prepare = None
        now = self.clock.now()
        if "available_at" in self.table.c:
            await self.release_due(now)
        unsent = self._sql.unsent(ordered=self.ordered, held=bool(self._held))
        params: dict[str, Any] = {"limit": self.batch}
        if not self.ordered:
            params["now"] = now
        if self._held:  # the direct publisher's rows
            params["held"] = list(self._held)
        while True:
            async with self.db.transaction() as conn:
                rows = await unsent.fetch(conn, params)
                if not rows:
                    return 0
                if await self._claim(conn, rows):
                    continue  # committed as the block ends; the next transaction publishes
                if self.ordered:
                    sent, failed = await self._publish_in_order(rows, now)
                else:
                    sent, failed = await self._publish_isolating(rows)
                if sent:
                    await self._sql.delete_sent.fetch(conn, {"ids": [r.id for r in sent]})
                counted = [f for f in failed if sent or _answered(f.error)]
                if counted and self.bus.nc.is_connected:
                    await self._record_failures(conn, counted, now)
            break
        if failed and not sent and not counted:
            # Nothing went out and nothing was the rows' fault: the bus is not answering.
            raise failed[0].error
        return len(sent)

    async def release_due(self, now: datetime) -> int:
        """Release the delayed rows due at ``now`` (a delayable outbox): each becomes an
        unsent row like any other, still withdrawable until a pass claims it; returns how
        many. One statement, its own transaction."""
        async with self.db.connection() as conn:
            rows = await self._sql.release_if_due.fetch(conn, {"now": now, "limit": self.batch})
        if rows:
            log.info("delayed outbox rows due", table=self.table.name, rows=len(rows))
        return len(rows)

    async def _claim(self, conn: Conn, rows: Sequence[Any]) -> bool:
        """Clear ``withdrawable`` on the rows of a pass about to publish them; True if
        there were any: the caller commits before it publishes anything, so that once a
        row may be on the bus no withdrawal can take it, whatever becomes of the
        publishing transaction (a withdrawal waiting for its row lock finds the flag
        cleared). A row over the bus's size limit is never sent, so it stays withdrawable
        (a task.create quarantined so can still be taken back)."""
        limit = self.bus.max_payload
        claim = [
            r.id
            for r in rows
            if getattr(r, "withdrawable", False)
            and self.bus.message_size(r.payload, msg_id=r.msg_id, headers=_headers(r)) <= limit
        ]
        if claim:
            await self._sql.claim_withdrawable.fetch(conn, {"ids": claim})
        return bool(claim)

    async def _publish_in_order(
        self, rows: Sequence[Any], now: datetime
    ) -> tuple[list[Any], list[_Failure]]:
        """One at a time, each after the previous one's ack; stop at a row that fails or
        whose next attempt is not due yet."""
        sent: list[Any] = []
        for row in rows:
            if row.next_attempt_at is not None and row.next_attempt_at > now:
                break
            try:
                await self.bus.publish(
                    row.subject, row.payload, msg_id=row.msg_id, headers=_headers(row)
                )
            except Exception as error:
                return sent, [_Failure(row, error)]
            sent.append(row)
        return sent, []

    async def _publish_isolating(self, rows: Sequence[Any]) -> tuple[list[Any], list[_Failure]]:
        """The rows never tried before at once; if that fails, in halves, down to the rows
        that fail. Rows that failed before are each tried alone. Rows over the bus's size
        limit are not sent at all."""
        split = _Split(self.bus)
        limit = self.bus.max_payload
        fresh: list[Any] = []
        suspect: list[Any] = []
        for row in rows:
            size = self.bus.message_size(row.payload, msg_id=row.msg_id, headers=_headers(row))
            if size > limit:
                split.failed.append(_Failure(row, MessageTooLarge(row.subject, size, limit)))
            else:
                (suspect if row.attempts else fresh).append(row)
        await split.publish(fresh)
        for row in suspect:
            await split.publish([row])
        return split.sent, split.failed

    async def _record_failures(
        self, conn: Conn, failures: Sequence[_Failure], now: datetime
    ) -> None:
        """Count an attempt on each failed row, with its error and when to try it again;
        quarantine the rows whose attempts are spent (one statement for them all)."""
        params: dict[str, list[Any]] = {
            "ids": [],
            "attempts": [],
            "errors": [],
            "next": [],
            "quarantined": [],
        }
        for failure in failures:
            row, attempts = failure.row, failure.row.attempts + 1
            error = truncate_error(f"{type(failure.error).__name__}: {failure.error}")
            spent = attempts >= self.max_attempts
            delay = backoff(RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, 0.0, attempts)
            params["ids"].append(row.id)
            params["attempts"].append(attempts)
            params["errors"].append(error)
            params["next"].append(now + timedelta(seconds=delay))
            params["quarantined"].append(now if spent else None)
        await self._sql.fail_if_unsent.fetch(conn, params)
        for failure, attempts, error, quarantined in zip(
            failures, params["attempts"], params["errors"], params["quarantined"], strict=True
        ):
            row = failure.row
            fields = {
                "table": self.table.name,
                "id": row.id,
                "subject": row.subject,
                "msg_id": row.msg_id,
                "size": len(row.payload),
                "attempts": attempts,
                "error": error,
            }
            if quarantined is not None:
                log.error("outbox row quarantined", **fields)
            else:
                log.warning("outbox row not published", **fields)

    async def prune_once(self) -> int:
        """Delete up to ``prune_batch`` rows marked sent (:func:`outbox_prune`); returns how
        many."""
        async with self.db.transaction() as conn:
            return await outbox_prune(conn, self.table, self.prune_batch)

    async def run(self) -> None:
        pruning = asyncio.create_task(self._pruning.run(), name=self._pruning.name)
        direct = asyncio.create_task(self._publish_directly(), name=f"{self.table.name} direct")
        self._direct_running = True
        try:
            await self._relay_loop()
        finally:
            self._direct_running = False
            for part in (pruning, direct):
                part.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await part
            if self._unmarked or self._marking:  # sent: not to be sent again after a restart
                with contextlib.suppress(Exception):
                    await self._mark_overdue([*self._unmarked, *self._marking])

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
        await self._wait_for(self._kick, seconds)

    async def _wait_for(self, event: asyncio.Event, seconds: float | None) -> None:
        """Until ``event`` is set, the relay stops, or ``seconds`` pass (None: no limit)."""
        waiters = [
            asyncio.ensure_future(event.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()

    def stop(self) -> None:
        self._stopping.set()
        self._pruning.stop()
