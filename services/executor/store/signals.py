"""The ``signals`` rows (ADR-0102): each signal a task was sent, once per signal id, kept
until a node waiting for its name takes it; and the ``waits`` rows: when each WAITING node's
time is up, what the timeout sweep reads. Every write runs under the task's row lock (the
caller's), so a node starting to wait and a signal arriving never miss each other."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dispo.executor.waits import Signal
from dispo.libs.db.driver import Conn


async def signals_insert_many(conn: Conn, signals: Sequence[Signal], now: datetime) -> set[str]:
    """Record each signal whose ``(task_id, signal_id)`` is new; returns the ``signal_id``s
    of those recorded here (a repeated one is left as it is)."""
    if not signals:
        return set()
    rows = await conn.fetch(
        "INSERT INTO signals (task_id, signal_id, signal, payload, received_at)"
        " SELECT * FROM unnest(CAST(:tasks AS text[]), CAST(:ids AS text[]),"
        " CAST(:names AS text[]), CAST(:payloads AS bytea[]), CAST(:nows AS timestamptz[]))"
        " ON CONFLICT (task_id, signal_id) DO NOTHING RETURNING signal_id",
        {
            "tasks": [s.task_id for s in signals],
            "ids": [s.signal_id for s in signals],
            "names": [s.signal for s in signals],
            "payloads": [s.payload for s in signals],
            "nows": [now] * len(signals),
        },
    )
    return {row.signal_id for row in rows}


async def signals_free_many(conn: Conn, task_ids: Sequence[str]) -> dict[str, list[Signal]]:
    """The signals of each task no node has taken, oldest first, by task id."""
    found: dict[str, list[Signal]] = {t: [] for t in task_ids}
    if not task_ids:
        return found
    rows = await conn.fetch(
        "SELECT task_id, signal_id, signal, payload FROM signals"
        " WHERE task_id = ANY(CAST(:ids AS text[])) AND taken_by IS NULL ORDER BY seq",
        {"ids": sorted(set(task_ids))},
    )
    for row in rows:
        found[row.task_id].append(Signal(row.task_id, row.signal_id, row.signal, row.payload))
    return found


async def signals_take_if_free_many(
    conn: Conn, taken: Sequence[tuple[str, str, str]], now: datetime
) -> None:
    """Each ``(task_id, signal_id, node_id)``: the signal taken by that node, where no node
    has taken it yet."""
    if taken:
        await conn.fetch(
            "UPDATE signals s SET taken_by = u.node, taken_at = :now"
            " FROM unnest(CAST(:tasks AS text[]), CAST(:ids AS text[]), CAST(:nodes AS text[]))"
            " AS u(task, id, node)"
            " WHERE s.task_id = u.task AND s.signal_id = u.id AND s.taken_by IS NULL",
            {
                "tasks": [t for t, _, _ in taken],
                "ids": [i for _, i, _ in taken],
                "nodes": [n for _, _, n in taken],
                "now": now,
            },
        )


async def waits_insert_many(conn: Conn, waits: Sequence[tuple[str, str, datetime]]) -> None:
    """Each ``(task_id, node_id, until)``: a node that started waiting, and when its time
    is up."""
    if waits:
        await conn.fetch(
            "INSERT INTO waits (task_id, node_id, until)"
            " SELECT * FROM unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]),"
            " CAST(:untils AS timestamptz[])) ON CONFLICT (task_id, node_id)"
            " DO UPDATE SET until = EXCLUDED.until",
            {
                "tasks": [t for t, _, _ in waits],
                "nodes": [n for _, n, _ in waits],
                "untils": [u for _, _, u in waits],
            },
        )


async def waits_delete_many(conn: Conn, ended: Sequence[tuple[str, str]]) -> None:
    """Each ``(task_id, node_id)``: a node that waits no more (signalled, timed out, or
    moved otherwise)."""
    if ended:
        await conn.fetch(
            "DELETE FROM waits w USING unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]))"
            " AS u(task, node) WHERE w.task_id = u.task AND w.node_id = u.node",
            {"tasks": [t for t, _ in ended], "nodes": [n for _, n in ended]},
        )


async def waits_due_many(conn: Conn, now: datetime, limit: int) -> dict[str, list[str]]:
    """The waits whose time is up (at most ``limit``, the earliest first): their node ids by
    task id."""
    rows = await conn.fetch(
        "SELECT task_id, node_id FROM waits WHERE until <= :now ORDER BY until LIMIT :limit",
        {"now": now, "limit": limit},
    )
    due: dict[str, list[str]] = {}
    for row in rows:
        due.setdefault(row.task_id, []).append(row.node_id)
    return due
