"""SQL of arbitration: claims on conflict targets, the verdicts deciding them and the
compensations of their losers, on the driver port (:mod:`dispo.libs.db.driver`) in the
caller's transaction. Every move is checked against its declared transitions and carries
its expected state in its ``WHERE``; ``RETURNING`` says which rows moved. ``payload``
columns (``jsonb``) are written as JSON text and read back as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from dispo.libs.db.driver import Conn, Row
from dispo.libs.error_text import truncate_error
from dispo.libs.payload import canonical_json
from dispo.reconciler.json_rows import JsonRow, with_json
from dispo.reconciler.states import (
    CLAIM_TRANSITIONS,
    COMPENSATION_TRANSITIONS,
    ClaimState,
    CompensationState,
)


class Claim(NamedTuple):
    """One cell's claim on a conflict target, for :func:`claims_add_many`."""

    cell_ref: str
    cell: str
    target: str
    effect: str
    payload: dict[str, Any]


async def claims_add_many(
    conn: Conn, task_id: str, business: str, accepted_at: datetime, claims: Sequence[Claim]
) -> int:
    """Record the task's claims, OPEN, with one statement; a claim recorded before is left as
    it is. Returns how many were recorded now."""
    if not claims:
        return 0
    added = await conn.fetch(
        "INSERT INTO claims (task_id, cell_ref, business, cell, target, effect, accepted_at, state, payload)"
        " SELECT :task, c.ref, :business, c.cell, c.target, c.effect, :at, 'open', CAST(c.payload AS jsonb)"
        " FROM unnest(CAST(:refs AS text[]), CAST(:cells AS text[]), CAST(:targets AS text[]),"
        " CAST(:effects AS text[]), CAST(:payloads AS text[])) AS c(ref, cell, target, effect, payload)"
        " ON CONFLICT DO NOTHING RETURNING cell_ref",
        {
            "task": task_id,
            "business": business,
            "at": accepted_at,
            "refs": [c.cell_ref for c in claims],
            "cells": [c.cell for c in claims],
            "targets": [c.target for c in claims],
            "effects": [c.effect for c in claims],
            "payloads": [canonical_json(c.payload).decode() for c in claims],
        },
    )
    return len(added)


async def claims_open_targets(conn: Conn, limit: int) -> list[tuple[str, str]]:
    """The (target, effect) pairs with OPEN claims, the oldest claimed first."""
    rows = await conn.fetch(
        (
            "SELECT target, effect FROM claims WHERE state = 'open' GROUP BY target, effect"
            " ORDER BY min(accepted_at) LIMIT :limit"
        ),
        {"limit": limit},
    )
    return [(r.target, r.effect) for r in rows]


async def claims_of_target(conn: Conn, target: str, effect: str, window: float) -> list[JsonRow]:
    """OPEN claims on the target and the WON / OPEN ones within ``window`` of them, locked."""
    return with_json(
        await conn.fetch(
            (
                "SELECT * FROM claims WHERE target = :target AND effect = :effect AND state IN ('open', 'won')"
                " AND accepted_at >= ((SELECT min(accepted_at) FROM claims"
                "                      WHERE target = :target AND effect = :effect AND state = 'open') - CAST(:window AS interval))"
                " ORDER BY accepted_at, task_id FOR UPDATE"
            ),
            {"target": target, "effect": effect, "window": timedelta(seconds=window)},
        ),
        "payload",
    )


async def verdict_add(
    conn: Conn,
    target: str,
    effect: str,
    winner: str,
    losers: list[str],
    reason: str,
    now: datetime,
) -> int:
    [verdict_id] = await conn.scalars(
        "INSERT INTO verdicts (target, effect, winner_task_id, loser_task_ids, reason, decided_at)"
        " VALUES (:target, :effect, :winner, :losers, :reason, :now) RETURNING id",
        {
            "target": target,
            "effect": effect,
            "winner": winner,
            "losers": losers,
            "reason": reason[:1000],
            "now": now,
        },
    )
    return int(verdict_id)


async def claims_set_if(
    conn: Conn,
    target: str,
    effect: str,
    task_ids: list[str],
    expected: tuple[ClaimState, ...],
    new: ClaimState,
    verdict_id: int | None,
) -> int:
    """Move the claims of ``task_ids`` on the target from ``expected`` to ``new`` (decided by
    ``verdict_id``, if given); returns how many moved."""
    CLAIM_TRANSITIONS.check(expected, new)
    moved = await conn.fetch(
        (
            "UPDATE claims SET state = :new, verdict_id = COALESCE(CAST(:verdict AS bigint), verdict_id)"
            " WHERE target = :target AND effect = :effect AND task_id = ANY(CAST(:ids AS text[]))"
            " AND state = ANY(CAST(:expected AS text[])) RETURNING task_id"
        ),
        {
            "target": target,
            "effect": effect,
            "ids": task_ids,
            "expected": [s.value for s in expected],
            "new": new.value,
            "verdict": verdict_id,
        },
    )
    return len(moved)


async def verdicts_list(
    conn: Conn, target: str, task_id: str, limit: int, offset: int
) -> list[Row]:
    clauses, params = [], {"limit": limit, "offset": offset, "target": target, "task": task_id}
    if target:
        clauses.append("target = :target")
    if task_id:
        clauses.append("(winner_task_id = :task OR :task = ANY(loser_task_ids))")
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return await conn.fetch(
        f"SELECT * FROM verdicts {where} ORDER BY id LIMIT :limit OFFSET :offset", params
    )


async def compensation_add(
    conn: Conn,
    verdict_id: int,
    task_id: str,
    business: str,
    cell: str,
    payload: dict[str, Any],
    now: datetime,
) -> None:
    await conn.fetch(
        (
            "INSERT INTO compensations (verdict_id, task_id, business, cell, payload, state, next_at)"
            " VALUES (:verdict, :task, :business, :cell, CAST(:payload AS jsonb), 'pending', :now) ON CONFLICT DO NOTHING"
        ),
        {
            "verdict": verdict_id,
            "task": task_id,
            "business": business,
            "cell": cell,
            "payload": canonical_json(payload).decode(),
            "now": now,
        },
    )


async def compensations_claim(
    conn: Conn, now: datetime, lease_until: datetime, limit: int
) -> list[JsonRow]:
    """Due PENDING compensations, oldest due first, claimed until ``lease_until`` (other
    replicas skip them meanwhile)."""
    return with_json(
        await conn.fetch(
            (
                "UPDATE compensations c SET next_at = :lease FROM ("
                "  SELECT verdict_id, task_id FROM compensations WHERE state = 'pending' AND next_at <= :now"
                "  ORDER BY next_at LIMIT :limit FOR UPDATE SKIP LOCKED) due"
                " WHERE c.verdict_id = due.verdict_id AND c.task_id = due.task_id RETURNING c.*"
            ),
            {"now": now, "lease": lease_until, "limit": limit},
        ),
        "payload",
    )


async def compensation_set_if(
    conn: Conn,
    verdict_id: int,
    task_id: str,
    attempts_read: int,
    new: CompensationState,
    next_at: datetime | None,
    submitted_task_id: str,
    error: str,
) -> bool:
    COMPENSATION_TRANSITIONS.check(CompensationState.PENDING, new)
    moved = await conn.fetch(
        (
            "UPDATE compensations SET state = :new, attempts = attempts + 1, next_at = :next,"
            " submitted_task_id = :submitted, error = :error"
            " WHERE verdict_id = :verdict AND task_id = :task AND state = 'pending' AND attempts = :attempts"
            " RETURNING task_id"
        ),
        {
            "verdict": verdict_id,
            "task": task_id,
            "attempts": attempts_read,
            "new": new.value,
            "next": next_at,
            "submitted": submitted_task_id,
            "error": truncate_error(error),
        },
    )
    return bool(moved)


async def compensations_of(conn: Conn, verdict_ids: list[int]) -> list[JsonRow]:
    rows = await conn.fetch(
        "SELECT * FROM compensations WHERE verdict_id = ANY(CAST(:ids AS bigint[]))"
        " ORDER BY verdict_id, task_id",
        {"ids": verdict_ids},
    )
    return with_json(rows, "payload")


# ---- retention (ADR-0105) ---------------------------------------------------------------
_CLAIMS_DELETE_IF_DECIDED = (
    "DELETE FROM claims WHERE task_id = ANY(CAST(:ids AS text[])) AND state <> :open"
    " RETURNING task_id"
)


async def claims_delete_if_decided_many(conn: Conn, task_ids: list[str]) -> int:
    """Delete the claims of finished tasks whose completion facts retention deleted, those
    with a verdict (an OPEN claim is kept: arbitration still reads it); how many. The
    verdicts stay: they name every task they decided."""
    if not task_ids:
        return 0
    rows = await conn.fetch(
        _CLAIMS_DELETE_IF_DECIDED, {"ids": task_ids, "open": ClaimState.OPEN.value}
    )
    return len(rows)
