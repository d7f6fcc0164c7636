"""SQL of the drift records (tables in the reconciler's schema, own migration branch), on
the driver port (:mod:`dispo.libs.db.driver`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispo.libs.db.driver import Conn

MAX_TEXT = 500


async def check_add(
    conn: Conn,
    check_id: str,
    at: datetime,
    crons_in_db: int,
    crons_in_driver: int,
    driver: str,
) -> None:
    await conn.fetch(
        "INSERT INTO drift_checks (check_id, at, crons_in_db, crons_in_driver, driver)"
        " VALUES (:id, :at, :db, :drv, :driver)",
        {"id": check_id, "at": at, "db": crons_in_db, "drv": crons_in_driver, "driver": driver},
    )


async def repair_add(
    conn: Conn,
    check_id: str,
    kind: str,
    cron_id: str,
    evaluation_id: str,
    reason: str,
    outcome: str,
    detail: str,
    at: datetime,
) -> dict[str, Any]:
    [row] = await conn.fetch(
        "INSERT INTO drift_repairs (check_id, kind, cron_id, evaluation_id, reason, outcome, detail, at)"
        " VALUES (:check, :kind, :cron, :ev, :reason, :outcome, :detail, :at) RETURNING *",
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
    return dict(row.items())


async def repairs_list(conn: Conn, kind: str = "", limit: int = 100) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT * FROM drift_repairs WHERE (CAST(:kind AS text) = '' OR kind = :kind)"
        " ORDER BY id DESC LIMIT :limit",
        {"kind": kind, "limit": limit},
    )
    return [dict(r.items()) for r in rows]
