"""SQL of arbitration: claims on conflict targets and the verdicts deciding them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from dispo.libs.error_text import truncate_error
from dispo.libs.payload import canonical_json
from dispo.reconciler.states import (
    CLAIM_TRANSITIONS,
    COMPENSATION_TRANSITIONS,
    ClaimState,
    CompensationState,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


async def claim_add(
    conn: AsyncConnection,
    task_id: str,
    cell_ref: str,
    business: str,
    cell: str,
    target: str,
    effect: str,
    accepted_at: datetime,
    payload: dict[str, Any],
) -> bool:
    result = await conn.execute(
        text(
            "INSERT INTO claims (task_id, cell_ref, business, cell, target, effect, accepted_at, state, payload)"
            " VALUES (:task, :ref, :business, :cell, :target, :effect, :at, 'open', CAST(:payload AS jsonb))"
            " ON CONFLICT DO NOTHING"
        ),
        {
            "task": task_id,
            "ref": cell_ref,
            "business": business,
            "cell": cell,
            "target": target,
            "effect": effect,
            "at": accepted_at,
            "payload": canonical_json(payload).decode(),
        },
    )
    return result.rowcount == 1


async def open_targets(conn: AsyncConnection, limit: int) -> list[tuple[str, str]]:
    rows = await conn.execute(
        text(
            "SELECT target, effect FROM claims WHERE state = 'open' GROUP BY target, effect"
            " ORDER BY min(accepted_at) LIMIT :limit"
        ),
        {"limit": limit},
    )
    return [(r.target, r.effect) for r in rows]


async def target_claims(
    conn: AsyncConnection, target: str, effect: str, window: float
) -> list[Any]:
    """OPEN claims on the target and the WON / OPEN ones within ``window`` of them, locked."""
    return list(
        await conn.execute(
            text(
                "SELECT * FROM claims WHERE target = :target AND effect = :effect AND state IN ('open', 'won')"
                " AND accepted_at >= ((SELECT min(accepted_at) FROM claims"
                "                      WHERE target = :target AND effect = :effect AND state = 'open') - CAST(:window AS interval))"
                " ORDER BY accepted_at, task_id FOR UPDATE"
            ),
            {"target": target, "effect": effect, "window": timedelta(seconds=window)},
        )
    )


async def verdict_add(
    conn: AsyncConnection,
    target: str,
    effect: str,
    winner: str,
    losers: list[str],
    reason: str,
    now: datetime,
) -> int:
    row = (
        await conn.execute(
            text(
                "INSERT INTO verdicts (target, effect, winner_task_id, loser_task_ids, reason, decided_at)"
                " VALUES (:target, :effect, :winner, :losers, :reason, :now) RETURNING id"
            ),
            {
                "target": target,
                "effect": effect,
                "winner": winner,
                "losers": losers,
                "reason": reason[:1000],
                "now": now,
            },
        )
    ).one()
    return int(row.id)


async def claims_set_if(
    conn: AsyncConnection,
    target: str,
    effect: str,
    task_ids: list[str],
    expected: tuple[ClaimState, ...],
    new: ClaimState,
    verdict_id: int | None,
) -> int:
    CLAIM_TRANSITIONS.check(expected, new)
    result = await conn.execute(
        text(
            "UPDATE claims SET state = :new, verdict_id = COALESCE(:verdict, verdict_id)"
            " WHERE target = :target AND effect = :effect AND task_id = ANY(:ids) AND state = ANY(:expected)"
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
    return result.rowcount


async def verdicts_list(
    conn: AsyncConnection, target: str, task_id: str, limit: int, offset: int
) -> list[Any]:
    clauses, params = [], {"limit": limit, "offset": offset, "target": target, "task": task_id}
    if target:
        clauses.append("target = :target")
    if task_id:
        clauses.append("(winner_task_id = :task OR :task = ANY(loser_task_ids))")
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return list(
        await conn.execute(
            text(f"SELECT * FROM verdicts {where} ORDER BY id LIMIT :limit OFFSET :offset"), params
        )
    )


async def compensation_add(
    conn: AsyncConnection,
    verdict_id: int,
    task_id: str,
    business: str,
    cell: str,
    payload: dict[str, Any],
    now: datetime,
) -> None:
    await conn.execute(
        text(
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
    conn: AsyncConnection, now: datetime, lease_until: datetime, limit: int
) -> list[Any]:
    return list(
        await conn.execute(
            text(
                "UPDATE compensations c SET next_at = :lease FROM ("
                "  SELECT verdict_id, task_id FROM compensations WHERE state = 'pending' AND next_at <= :now"
                "  ORDER BY next_at LIMIT :limit FOR UPDATE SKIP LOCKED) due"
                " WHERE c.verdict_id = due.verdict_id AND c.task_id = due.task_id RETURNING c.*"
            ),
            {"now": now, "lease": lease_until, "limit": limit},
        )
    )


async def compensation_set_if(
    conn: AsyncConnection,
    verdict_id: int,
    task_id: str,
    attempts_read: int,
    new: CompensationState,
    next_at: datetime | None,
    submitted_task_id: str,
    error: str,
) -> bool:
    COMPENSATION_TRANSITIONS.check(CompensationState.PENDING, new)
    result = await conn.execute(
        text(
            "UPDATE compensations SET state = :new, attempts = attempts + 1, next_at = :next,"
            " submitted_task_id = :submitted, error = :error"
            " WHERE verdict_id = :verdict AND task_id = :task AND state = 'pending' AND attempts = :attempts"
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
    return result.rowcount == 1


async def compensations_of(conn: AsyncConnection, verdict_ids: list[int]) -> list[Any]:
    return list(
        await conn.execute(
            text(
                "SELECT * FROM compensations WHERE verdict_id = ANY(:ids) ORDER BY verdict_id, task_id"
            ),
            {"ids": verdict_ids},
        )
    )
