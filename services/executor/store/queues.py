"""The ``worker_presence`` rows (ADR-0101): when a worker last showed itself (a poll or a
heartbeat) on each queue it serves, written at most once a second per worker; a queue is
live while one of its workers was seen within a run lease. With the ``worker_runs`` rows,
what each queue has now: live workers, runs offered and taken.

The ``queue_paces`` rows (ADR-0108, "Worker queues"): the runs of each queue with a
``max_calls_per_second`` taken in its latest second and the one before, read and written
by the claim that takes them, under the queue's lock (:mod:`dispo.executor.queue_pace`
decides)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dispo.executor.queue_pace import Count
from dispo.libs.db.driver import Conn, Row


async def presence_mark_many(
    conn: Conn, marks: Sequence[tuple[str, str]], now: datetime, forget_before: datetime
) -> None:
    """Each ``(queue, worker_id)`` seen at ``now`` (never moved back); the rows of these
    queues not seen since ``forget_before`` (workers long gone) are deleted with it."""
    if not marks:
        return
    marks = sorted(set(marks))
    await conn.fetch(
        "WITH gone AS (DELETE FROM worker_presence WHERE queue = ANY(CAST(:queues AS text[]))"
        " AND seen_at < :forget AND worker_id <> ALL(CAST(:workers AS text[])))"
        " INSERT INTO worker_presence (queue, worker_id, seen_at)"
        " SELECT u.queue, u.worker, :now"
        " FROM unnest(CAST(:queues AS text[]), CAST(:workers AS text[])) AS u(queue, worker)"
        " ON CONFLICT (queue, worker_id) DO UPDATE SET seen_at = excluded.seen_at"
        " WHERE worker_presence.seen_at < excluded.seen_at",
        {
            "queues": [q for q, _ in marks],
            "workers": [w for _, w in marks],
            "now": now,
            "forget": forget_before,
        },
    )


async def queues_summary(conn: Conn, live_since: datetime) -> list[Row]:
    """Every queue with a worker seen since ``live_since`` or a run: ``queue``,
    ``live_workers``, ``last_seen`` (any worker's, or None), ``offered``, ``taken``."""
    return await conn.fetch(
        "WITH p AS (SELECT queue, count(*) FILTER (WHERE seen_at >= :since) AS live_workers,"
        " max(seen_at) AS last_seen FROM worker_presence GROUP BY queue),"
        " r AS (SELECT queue, count(*) FILTER (WHERE state = 'offered') AS offered,"
        " count(*) FILTER (WHERE state = 'taken') AS taken FROM worker_runs GROUP BY queue)"
        " SELECT COALESCE(p.queue, r.queue) AS queue, COALESCE(p.live_workers, 0) AS"
        " live_workers, p.last_seen, COALESCE(r.offered, 0) AS offered,"
        " COALESCE(r.taken, 0) AS taken FROM p FULL JOIN r ON r.queue = p.queue"
        " ORDER BY 1",
        {"since": live_since},
    )


async def queue_paces_many(conn: Conn, queues: Sequence[str]) -> dict[str, Count]:
    """What each of ``queues`` records of its runs a second (a queue with no row: none
    taken yet)."""
    if not queues:
        return {}
    rows = await conn.fetch(
        "SELECT queue, second, taken, last FROM queue_paces"
        " WHERE queue = ANY(CAST(:queues AS text[]))",
        {"queues": sorted(set(queues))},
    )
    return {r.queue: Count(r.second, r.taken, r.last) for r in rows}


async def queue_paces_put_if_later_many(conn: Conn, counts: dict[str, Count]) -> None:
    """Write each queue's count, unless its row already records a later second (never moved
    back); the caller holds the queues' locks (:func:`..worker_runs.queues_lock_many`)."""
    if not counts:
        return
    names = sorted(counts)
    await conn.fetch(
        "INSERT INTO queue_paces (queue, second, taken, last)"
        " SELECT * FROM unnest(CAST(:queues AS text[]), CAST(:seconds AS bigint[]),"
        " CAST(:taken AS integer[]), CAST(:last AS integer[]))"
        " ON CONFLICT (queue) DO UPDATE SET second = excluded.second,"
        " taken = excluded.taken, last = excluded.last"
        " WHERE queue_paces.second <= excluded.second",
        {
            "queues": names,
            "seconds": [counts[q].second for q in names],
            "taken": [counts[q].taken for q in names],
            "last": [counts[q].last for q in names],
        },
    )
