"""Retention: every service deletes what it keeps about finished tasks once their business's
retention period (:mod:`dispo.libs.business_policy`) has passed, in small batches on the
injectable clock (ADR-0105; River's job cleaner and Oban's Pruner are the models).

A service gives its store's three list-shaped statements: the businesses it holds tasks
of, one guarded delete of at most ``batch`` tasks past their business's cutoff (with
everything it keeps about them) answering how many rows of each table it deleted, and a
count of what is due (the dry run). :func:`add_retention` runs them as a periodic part and
serves ``dispo.retention.v1.RetentionService``::

    add_retention(rt, "gateway", db, store.tasks_businesses_finished,
                  store.tasks_delete_if_finished_many, store.tasks_due)

Each batch is one short transaction (one statement, or the reconciler's three): its locks
last milliseconds, and rows another transaction holds are skipped (``FOR UPDATE SKIP
LOCKED``), never waited for. While a backlog lasts the next batch follows after
``pause_seconds``, so the hot path's statements get the database between them; once a batch
is short the part waits its interval. :meth:`Retention.purge_once` is one batch, callable
from a test.

A service also gives the :class:`Records` it keeps besides its tasks' rows, purged in the
same passes, a batch each in a transaction of its own: the gateway's finished bulk actions
(:func:`business_records`), each service's quarantined outbox rows (:func:`outbox_records`)
and its quarantine (:func:`quarantine_records`), of which only copies of status snapshots and
callbacks are ever deleted; work set aside waits for an operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dispo.libs import metrics
from dispo.libs.business_policy import BusinessPolicy, load_configured_policy
from dispo.libs.clock import Clock
from dispo.libs.contracts import AGING_STREAMS, aging_subjects_pattern
from dispo.libs.db.driver import Conn, Database
from dispo.libs.logging import get_logger
from dispo.libs.outbox import outbox_delete_if_quarantined_before, outbox_quarantine_counts
from dispo.libs.periodic import Pause
from dispo.libs.quarantine.store import (
    quarantine_delete_if_aged_before,
    quarantine_retention_counts,
)
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import Table

if TYPE_CHECKING:
    from dispo.libs.service import Runtime

log = get_logger(__name__)


class RetentionSettings(BaseSettings):
    """How the gateway, the executor and the reconciler purge finished tasks."""

    model_config = SettingsConfigDict(env_prefix="DISPO_RETENTION_", extra="ignore")

    enabled: bool = Field(
        default=True,
        description="Whether the gateway, the executor and the reconciler delete finished"
        " tasks past their business's retention (`DISPO_BUSINESS_POLICY`, docs/retention.md)",
    )
    interval_seconds: float = Field(
        default=60.0, gt=0, description="Seconds between retention passes when nothing is due"
    )
    batch: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="Finished tasks a retention batch deletes (with their rows in every table"
        " of the service), in one short transaction",
    )
    pause_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between two retention batches while a backlog lasts, left to the"
        " hot path: with `DISPO_RETENTION_BATCH`, at most 500 tasks a second per service by"
        " default, ten times what a stack finishing 50 tasks a second needs",
    )


@dataclass(frozen=True)
class Purged:
    """What one batch deleted: the tasks, and the rows of each table (the tasks' own
    included, and the :class:`Records`'). ``full``: a kind of records filled its batch
    (more are due)."""

    tasks: int = 0
    rows: Mapping[str, int] = field(default_factory=dict)
    full: bool = False


@dataclass(frozen=True)
class RecordCounts:
    """Records of one kind as retention sees them now: ``due``, past their retention (the
    next passes delete them); ``held``, kept until an operator acts on them."""

    due: int = 0
    held: int = 0


# At most ``limit`` records past their retention on ``policy`` at ``now``, deleted;
# how many.
PurgeRecords = Callable[[Conn, BusinessPolicy, datetime, int], Awaitable[int]]
CountRecords = Callable[[Conn, BusinessPolicy, datetime], Awaitable[RecordCounts]]


@dataclass(frozen=True)
class Records:
    """A kind of record a service keeps besides its tasks' rows (its finished bulk actions,
    its quarantined outbox rows, its quarantine), purged in the same passes by a statement
    of its own, a batch at a time. ``rule`` tells an operator what is deleted and what is
    kept (GetRetention)."""

    table: str
    rule: str
    purge: PurgeRecords
    count: CountRecords


# The businesses a service holds finished tasks of.
Businesses = Callable[[Conn], Awaitable[list[str]]]
# One batch: at most ``limit`` tasks past the cutoff of their business (``""``: a row whose
# business is not recorded), deleted with everything the service keeps about them.
Purge = Callable[[Conn, Mapping[str, datetime], int], Awaitable[Purged]]
# How many finished tasks of each business are past its cutoff (a dry run).
Due = Callable[[Conn, Mapping[str, datetime]], Awaitable[dict[str, int]]]


class Retention:
    def __init__(
        self,
        service: str,
        db: Database,
        policy: BusinessPolicy,
        clock: Clock,
        businesses: Businesses,
        purge: Purge,
        settings: RetentionSettings | None = None,
        due: Due | None = None,
        records: Sequence[Records] = (),
    ) -> None:
        self.service = service
        self.db = db
        self.policy = policy
        self.clock = clock
        self.businesses = businesses
        self.purge = purge
        self.due_counts = due
        self.settings = settings or RetentionSettings()
        self.records = tuple(records)

    async def cutoffs(self, conn: Conn) -> dict[str, datetime]:
        return self.policy.cutoffs(await self.businesses(conn), self.clock.now())

    async def purge_once(self) -> Purged:
        """One batch: the oldest finished tasks past their retention, at most ``batch``,
        then at most ``batch`` records of each kind past theirs, each in a transaction of
        its own."""
        limit = self.settings.batch
        async with self.db.transaction() as conn:  # a batch's locks last milliseconds
            cutoffs = await self.cutoffs(conn)
            purged = await self.purge(conn, cutoffs, limit) if cutoffs else Purged()
        rows = dict(purged.rows)
        full = False
        now = self.clock.now()
        for records in self.records:
            async with self.db.transaction() as conn:
                count = await records.purge(conn, self.policy, now, limit)
            rows[records.table] = rows.get(records.table, 0) + count
            full = full or count >= limit
        for table, count in rows.items():
            metrics.retention_purged(table, count)
        if purged.tasks or any(rows.get(r.table) for r in self.records):
            log.info("retention purged", tasks=purged.tasks, rows=rows)
        return Purged(purged.tasks, rows, full)

    async def purge_pass(self) -> Pause | None:
        """The periodic part's action: a batch, and the next one soon while a backlog
        lasts."""
        purged = await self.purge_once()
        if purged.tasks >= self.settings.batch or purged.full:
            return Pause(self.settings.pause_seconds)
        return None

    async def records_report(self) -> list[RecordsDue]:
        """Each kind of record the service keeps besides its tasks': what the next passes
        delete and what is kept for an operator. Nothing is deleted."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            return [
                RecordsDue(r.table, r.rule, await r.count(conn, self.policy, now))
                for r in self.records
            ]

    async def due(self) -> dict[str, int]:
        """Finished tasks past their retention now, by business (those with any): what the
        next passes delete (nothing is deleted)."""
        return {r.business: r.due for r in await self.report() if r.due}

    async def report(self, business: str = "") -> list[BusinessDue]:
        """Each business the service holds tasks of (or ``business`` alone), its retention,
        its cutoff now and its finished tasks past it, by name. Nothing is deleted."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            names = [business] if business else await self.businesses(conn)
            cutoffs = self.policy.cutoffs(names, now)
            counts = await self.due_counts(conn, cutoffs) if cutoffs and self.due_counts else {}
        return [
            BusinessDue(
                name,
                self.policy.terms(name).retention_days
                if name
                else self.policy.longest_retention.days,
                cutoffs[name],
                counts.get(name, 0),
            )
            for name in sorted(names)
        ]


@dataclass(frozen=True)
class BusinessDue:
    """A business's retention in one service (``""``: rows whose business is not
    recorded)."""

    business: str
    retention_days: int
    cutoff: datetime
    due: int


@dataclass(frozen=True)
class RecordsDue:
    """A kind of record in one service: its rule, and its counts now."""

    table: str
    rule: str
    counts: RecordCounts


def add_retention(
    rt: Runtime,
    service: str,
    db: Database,
    businesses: Businesses,
    purge: Purge,
    due: Due,
    records: Sequence[Records] = (),
) -> Retention:
    """The service's retention on the policy ``DISPO_BUSINESS_POLICY`` names (a policy
    file that is not one stops the start): a periodic part of ``rt`` unless
    ``DISPO_RETENTION_ENABLED`` is false, and ``dispo.retention.v1.RetentionService`` on its
    gRPC server either way."""
    from dispo.libs.api.retention.v1 import retention_pb2_grpc
    from dispo.libs.retention_servicer import SERVICE_NAME, RetentionServicer

    settings = RetentionSettings()
    retention = Retention(
        service,
        db,
        load_configured_policy(),
        rt.clock,
        businesses,
        purge,
        settings,
        due,
        records,
    )
    if settings.enabled:
        rt.add_periodic("retention", retention.purge_pass, settings.interval_seconds)
    servicer = RetentionServicer(retention)
    rt.add_servicer(
        lambda server: retention_pb2_grpc.add_RetentionServiceServicer_to_server(servicer, server),
        SERVICE_NAME,
    )
    return retention


# ---- the records besides the tasks' (ADR-0105, amended) ---------------------------------
# A set-aside message (a quarantined outbox row, a message a consumer gave up on) carries no
# business: it is kept as long as the longest retention of the policy, counted from when it
# was set aside. Only a copy of a message its stream would have dropped after days (a status
# snapshot, a callback) is ever deleted; a message of a stream that keeps work until it is
# consumed (task.create, task.fail, task.cancel, ... an evaluation) waits for an operator.

OUTBOX_RULE = (
    "quarantined rows of status snapshots and callbacks: deleted once set aside longer than"
    " the longest retention; of work (task.create, task.fail, task.cancel, ...): kept until"
    " an operator replays or discards them"
)
QUARANTINE_RULE = (
    "messages of TASK_STATUS and CALLBACKS: deleted once last seen longer ago than the"
    " longest retention; of TASKS and EVALUATIONS (work): kept until an operator replays or"
    " discards them"
)
BULK_ACTIONS_RULE = (
    "finished bulk actions: deleted past their business's retention (an action of every"
    " business: the longest), counted from when they finished"
)


def outbox_records(table: Table) -> Records:
    """The quarantined rows of a service's outbox ``table``."""
    aging = aging_subjects_pattern()

    async def purge(conn: Conn, policy: BusinessPolicy, now: datetime, limit: int) -> int:
        cutoff = now - policy.longest_retention
        return await outbox_delete_if_quarantined_before(conn, table, cutoff, aging, limit)

    async def count(conn: Conn, policy: BusinessPolicy, now: datetime) -> RecordCounts:
        counts = await outbox_quarantine_counts(conn, table, now - policy.longest_retention, aging)
        return RecordCounts(counts.due, counts.held)

    return Records("outbox", OUTBOX_RULE, purge, count)


def quarantine_records() -> Records:
    """The service's quarantine (:mod:`dispo.libs.quarantine`)."""

    async def purge(conn: Conn, policy: BusinessPolicy, now: datetime, limit: int) -> int:
        cutoff = now - policy.longest_retention
        return await quarantine_delete_if_aged_before(conn, AGING_STREAMS, cutoff, limit)

    async def count(conn: Conn, policy: BusinessPolicy, now: datetime) -> RecordCounts:
        cutoff = now - policy.longest_retention
        return RecordCounts(*await quarantine_retention_counts(conn, AGING_STREAMS, cutoff))

    return Records("quarantine", QUARANTINE_RULE, purge, count)


def business_records(
    table: str,
    rule: str,
    businesses: Businesses,
    delete: Callable[[Conn, Mapping[str, datetime], int], Awaitable[int]],
    due: Due,
) -> Records:
    """Records kept by business as tasks are (``""``: of every business, kept as long as
    the longest retention), from the store's three statements shaped as a task purge's."""

    async def purge(conn: Conn, policy: BusinessPolicy, now: datetime, limit: int) -> int:
        cutoffs = policy.cutoffs(await businesses(conn), now)
        return await delete(conn, cutoffs, limit) if cutoffs else 0

    async def count(conn: Conn, policy: BusinessPolicy, now: datetime) -> RecordCounts:
        cutoffs = policy.cutoffs(await businesses(conn), now)
        return RecordCounts(sum((await due(conn, cutoffs)).values()) if cutoffs else 0)

    return Records(table, rule, purge, count)


# ---- the statements' shared parts: a store builds its purge from these ------------------
# Each statement reads a table by an index on ``(business, <since>)``, ``<since>`` a time
# a row has from its insert and never changes (when the task was created, or finished for a
# row written at the finish): an index no update touches leaves the hot path's updates HOT
# (ADR-0061). ``guard`` (on ``t``, with the business's ``p.cutoff``) says which rows are
# finished and finished before the cutoff; ``<since>`` is never later than the finish.


def businesses_statement(table: str) -> str:
    """The businesses holding rows of ``table``, read from its ``(business, …)`` index one
    business at a time (a loose index scan: one probe per business, however many rows each
    holds)."""
    return (
        f"WITH RECURSIVE b AS (SELECT min(business) AS business FROM {table}"
        f" UNION ALL SELECT (SELECT min(business) FROM {table} WHERE business > b.business)"
        " FROM b WHERE b.business IS NOT NULL)"
        " SELECT business FROM b WHERE business IS NOT NULL"
    )


def past_cutoff(table: str, since: str, guard: str, key: str = "task_id") -> str:
    """Two CTEs, ``p`` (each business and its cutoff) and ``doomed`` (the ``key`` of at most
    ``:limit`` rows of ``table`` meeting ``guard``), locked, those another transaction holds
    skipped. Each business's rows are read oldest first from the ``(business, <since>)``
    index up to its cutoff, so a business keeping its tasks longer is never scanned past to
    reach another's; only what is not finished yet among the old rows (parked work) is
    read and passed over."""
    return (
        "p AS (SELECT * FROM unnest(CAST(:businesses AS text[]),"
        " CAST(:cutoffs AS timestamptz[])) AS p(business, cutoff)),"
        f" doomed AS (SELECT d.{key} FROM p CROSS JOIN LATERAL (SELECT t.{key} FROM {table} t"
        f" WHERE t.business = p.business AND t.{since} < p.cutoff AND {guard}"
        f" ORDER BY t.{since} LIMIT CAST(:limit AS integer) FOR UPDATE SKIP LOCKED) d"
        " LIMIT CAST(:limit AS integer))"
    )


def due_statement(table: str, since: str, guard: str) -> str:
    """How many rows of ``table`` each business holds meeting ``guard``."""
    return (
        "SELECT p.business, count(*) AS due FROM unnest(CAST(:businesses AS text[]),"
        f" CAST(:cutoffs AS timestamptz[])) AS p(business, cutoff) JOIN {table} t"
        f" ON t.business = p.business AND t.{since} < p.cutoff AND {guard}"
        " GROUP BY p.business"
    )


def cutoff_params(cutoffs: Mapping[str, datetime], limit: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"businesses": list(cutoffs), "cutoffs": list(cutoffs.values())}
    if limit is not None:
        params["limit"] = limit
    return params
