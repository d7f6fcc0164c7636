"""SQL of the drift records (tables in the reconciler's schema, own migration branch)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

MAX_TEXT = 500


async def check_insert(
    conn: AsyncConnection,
    check_id: str,
    at: datetime,
    crons_in_db: int,
    crons_in_driver: int,
    driver: str,
) -> None:
    await conn.execute(
        text("""
        INSERT INTO drift_checks (check_id, at, crons_in_db, crons_in_driver, driver)
        VALUES (:id, :at, :db, :drv, :driver)"""),
        {"id": check_id, "at": at, "db": crons_in_db, "drv": crons_in_driver, "driver": driver},
    )


async def repair_insert(
    conn: AsyncConnection,
    check_id: str,
    kind: str,
    cron_id: str,
    evaluation_id: str,
    reason: str,
    outcome: str,
    detail: str,
    at: datetime,
) -> dict:
    row = (
        await conn.execute(
            text("""
        INSERT INTO drift_repairs (check_id, kind, cron_id, evaluation_id, reason, outcome, detail, at)
        VALUES (:check, :kind, :cron, :ev, :reason, :outcome, :detail, :at) RETURNING *"""),
            {
                "check": check_id,
                "kind": kind,
                "cron": cron_id,
                "ev": evaluation_id,
                "reason": reason[:MAX_TEXT],
                "outcome": outcome,
                "detail": detail[:MAX_TEXT],
                "at": at,
            },
        )
    ).one()
    return dict(row._mapping)


async def repairs_list(conn: AsyncConnection, kind: str = "", limit: int = 100) -> list[dict]:
    rows = await conn.execute(
        text("""
        SELECT * FROM drift_repairs WHERE (:kind = '' OR kind = :kind) ORDER BY id DESC LIMIT :limit"""),
        {"kind": kind, "limit": limit},
    )
    return [dict(r._mapping) for r in rows]
