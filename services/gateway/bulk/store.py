"""The SQL of bulk actions (ADR-0112): one guarded, list-shaped write path for the
``bulk_actions`` table (insert, advance while RUNNING, and retention's delete once done),
on the driver port."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.libs.db.driver import Conn, Statement
from dispo.libs.retention import businesses_statement, cutoff_params, due_statement, past_cutoff


@dataclass(frozen=True)
class BulkActionRow:
    action_id: str
    kind: str
    business: str
    actor: str
    reason: str
    request: bytes
    rate: float
    cutoff: datetime
    state: str
    matched: int
    processed: int
    acted: int
    skipped: int
    cursor_created: datetime | None
    cursor_task: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def cursor(self) -> tuple[datetime, str] | None:
        """The (created_at, task_id) of the last task taken; None before the first."""
        if self.cursor_created is None or self.cursor_task is None:
            return None
        return self.cursor_created, self.cursor_task


@dataclass(frozen=True)
class Advance:
    """One batch of an action taken: its new cursor and counts, guarded by the count of
    tasks it had taken before (a batch taken twice advances once)."""

    action_id: str
    processed_before: int
    processed: int
    acted: int
    skipped: int
    cursor: tuple[datetime, str] | None
    done: bool


_COLUMNS = ", ".join(BulkActionRow.__dataclass_fields__)

_INSERT_MANY = Statement(
    "INSERT INTO bulk_actions (action_id, kind, business, actor, reason, request, rate,"
    " cutoff, state, matched, created_at, updated_at)"
    " SELECT a, k, b, ac, r, rq, rt, c, 'running', m, :now, :now FROM unnest("
    " CAST(:ids AS text[]), CAST(:kinds AS text[]), CAST(:businesses AS text[]),"
    " CAST(:actors AS text[]), CAST(:reasons AS text[]), CAST(:requests AS bytea[]),"
    " CAST(:rates AS float8[]), CAST(:cutoffs AS timestamptz[]), CAST(:matched AS int8[]))"
    " AS t(a, k, b, ac, r, rq, rt, c, m)"
)


async def bulk_actions_insert_many(conn: Conn, rows: list[BulkActionRow], now: datetime) -> None:
    """Record new RUNNING actions (their counts zero, no cursor) in one statement."""
    await conn.fetch(
        _INSERT_MANY,
        {
            "ids": [r.action_id for r in rows],
            "kinds": [r.kind for r in rows],
            "businesses": [r.business for r in rows],
            "actors": [r.actor for r in rows],
            "reasons": [r.reason for r in rows],
            "requests": [r.request for r in rows],
            "rates": [r.rate for r in rows],
            "cutoffs": [r.cutoff for r in rows],
            "matched": [r.matched for r in rows],
            "now": now,
        },
    )


_ADVANCE_IF_RUNNING_MANY = Statement(
    "UPDATE bulk_actions AS b SET processed = t.p, acted = b.acted + t.a,"
    " skipped = b.skipped + t.s, cursor_created = COALESCE(t.cc, b.cursor_created),"
    " cursor_task = COALESCE(t.ct, b.cursor_task), updated_at = :now,"
    " state = CASE WHEN t.d THEN 'done' ELSE 'running' END,"
    " finished_at = CASE WHEN t.d THEN CAST(:now AS timestamptz) END"
    " FROM unnest(CAST(:ids AS text[]), CAST(:before AS int8[]), CAST(:processed AS int8[]),"
    " CAST(:acted AS int8[]), CAST(:skipped AS int8[]), CAST(:cc AS timestamptz[]),"
    " CAST(:ct AS text[]), CAST(:done AS bool[])) AS t(i, pb, p, a, s, cc, ct, d)"
    " WHERE b.action_id = t.i AND b.state = 'running' AND b.processed = t.pb"
    " RETURNING b.action_id"
)


async def bulk_actions_advance_if_running_many(
    conn: Conn, advances: list[Advance], now: datetime
) -> set[str]:
    """Move each action past its batch if it is RUNNING and had taken exactly
    ``processed_before`` tasks; the ids advanced (an action another pass advanced first is
    not)."""
    if not advances:
        return set()
    rows = await conn.fetch(
        _ADVANCE_IF_RUNNING_MANY,
        {
            "ids": [a.action_id for a in advances],
            "before": [a.processed_before for a in advances],
            "processed": [a.processed for a in advances],
            "acted": [a.acted for a in advances],
            "skipped": [a.skipped for a in advances],
            "cc": [a.cursor[0] if a.cursor else None for a in advances],
            "ct": [a.cursor[1] if a.cursor else None for a in advances],
            "done": [a.done for a in advances],
            "now": now,
        },
    )
    return {r[0] for r in rows}


_GET = Statement(f"SELECT {_COLUMNS} FROM bulk_actions WHERE action_id = :id")
_LOCK_RUNNING = Statement(
    f"SELECT {_COLUMNS} FROM bulk_actions WHERE action_id = :id AND state = 'running'"
    " FOR UPDATE SKIP LOCKED"
)
_RUNNING = Statement(
    "SELECT action_id FROM bulk_actions WHERE state = 'running' ORDER BY action_id"
)


async def bulk_action_get(conn: Conn, action_id: str) -> BulkActionRow | None:
    rows = await conn.fetch(_GET, {"id": action_id})
    return BulkActionRow(*rows[0]) if rows else None


async def bulk_action_lock_running(conn: Conn, action_id: str) -> BulkActionRow | None:
    """The action if it is RUNNING and no other pass holds it, locked for the transaction."""
    rows = await conn.fetch(_LOCK_RUNNING, {"id": action_id})
    return BulkActionRow(*rows[0]) if rows else None


async def bulk_actions_running(conn: Conn) -> list[str]:
    return list(await conn.scalars(_RUNNING))


async def bulk_actions_list(
    conn: Conn, business: str | None, limit: int, offset: int
) -> list[BulkActionRow]:
    """Newest first; only ``business``'s when given."""
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    where = ""
    if business is not None:
        where = "WHERE business = :business"
        params["business"] = business
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM bulk_actions {where}"
        " ORDER BY created_at DESC, action_id DESC"
        " LIMIT CAST(:limit AS integer) OFFSET CAST(:offset AS integer)",
        params,
    )
    return [BulkActionRow(*r) for r in rows]


# ---- retention (ADR-0105) ---------------------------------------------------------------
# A finished action: done before its business's cutoff. Read by ix_bulk_actions_business
# (its creation is never later than its finish); ``""``: an action of every business.
_DONE = "t.state = 'done' AND t.finished_at < p.cutoff"
_BUSINESSES = Statement(businesses_statement("bulk_actions"))
_DELETE_IF_DONE = Statement(
    f"WITH {past_cutoff('bulk_actions', 'created_at', _DONE, 'action_id')},"
    " gone AS (DELETE FROM bulk_actions b USING doomed d WHERE b.action_id = d.action_id"
    " AND b.state = 'done' RETURNING 1) SELECT count(*) FROM gone"
)
_DUE = Statement(due_statement("bulk_actions", "created_at", _DONE))


async def bulk_actions_businesses(conn: Conn) -> list[str]:
    """The businesses with bulk actions (``""`` among them for an action of every one)."""
    return list(await _BUSINESSES.scalars(conn))


async def bulk_actions_delete_if_done_many(
    conn: Conn, cutoffs: Mapping[str, datetime], limit: int
) -> int:
    """Delete at most ``limit`` actions done before their business's cutoff, oldest first,
    in one statement; a running one is never touched. How many."""
    [deleted] = await _DELETE_IF_DONE.scalars(conn, cutoff_params(cutoffs, limit))
    return int(deleted)


async def bulk_actions_due(conn: Conn, cutoffs: Mapping[str, datetime]) -> dict[str, int]:
    """How many actions of each business are done before its cutoff."""
    return {r.business: r.due for r in await _DUE.fetch(conn, cutoff_params(cutoffs))}
