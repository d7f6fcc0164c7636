"""The ``business_pauses`` rows (ADR-0109): the businesses whose tasks no executor starts
until an operator resumes them. One row per paused business; a pause of a paused business
keeps the first one's record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dispo.libs.db.driver import Conn


@dataclass(frozen=True)
class Pause:
    business: str
    paused_at: datetime
    paused_by: str
    reason: str


async def business_pauses_insert_if_absent_many(
    conn: Conn, businesses: Sequence[str], now: datetime, by: str, reason: str
) -> None:
    """Pause each of ``businesses`` not paused yet (a paused one keeps its record)."""
    await conn.fetch(
        "INSERT INTO business_pauses (business, paused_at, paused_by, reason)"
        " SELECT b, :now, :by, :reason FROM unnest(CAST(:businesses AS text[])) AS b"
        " ON CONFLICT (business) DO NOTHING",
        {"businesses": sorted(set(businesses)), "now": now, "by": by, "reason": reason},
    )


async def business_pauses_delete_many(conn: Conn, businesses: Sequence[str]) -> None:
    await conn.fetch(
        "DELETE FROM business_pauses WHERE business = ANY(CAST(:businesses AS text[]))",
        {"businesses": sorted(set(businesses))},
    )


async def business_pauses_all(conn: Conn) -> list[Pause]:
    rows = await conn.fetch(
        "SELECT business, paused_at, paused_by, reason FROM business_pauses ORDER BY business"
    )
    return [Pause(r.business, r.paused_at, r.paused_by, r.reason) for r in rows]
