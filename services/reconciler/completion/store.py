"""SQL of the completion facts: finished tasks, callback deliveries, reconciliation findings,
on the driver port (:mod:`dispo.libs.db.driver`) in the caller's transaction (or, for one
statement, on a connection where it commits alone). Every move of a delivery or a
reconciliation is checked against its declared transitions and guarded by the state and
attempts it read; ``RETURNING`` says which rows moved."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.db.driver import Conn, Row, Statement
from dispo.libs.error_text import truncate_error
from dispo.libs.retention import (
    businesses_statement,
    cutoff_params,
    due_statement,
    past_cutoff,
)
from dispo.reconciler.states import (
    NOTIFY_TRANSITIONS,
    PARKED,
    RECONCILE_TRANSITIONS,
    NotifyState,
    ReconcileState,
)


@dataclass(frozen=True)
class Finished:
    """One "task finished" fact to record: the task's first terminal snapshot."""

    env: task_pb2.Task
    status: str
    finished_at: datetime
    notify: NotifyState
    # The trace context the snapshot came with: the callback continues it.
    trace: str | None = None
    # PENDING: the reconcile sweep probes it later; NOT_SAMPLED or NOTHING_TO_PROBE: known
    # at the finish, recorded reconciled at once.
    reconcile: ReconcileState = ReconcileState.PENDING


async def finished_add_many(
    conn: Conn,
    facts: Sequence[Finished],
    now: datetime,
    reconcile_at: datetime,
    alongside: tuple[str, Mapping[str, Any]] | None = None,
) -> set[str]:
    """Record "task finished" once per task (the first terminal snapshot is the fact), for
    many tasks in one statement; returns the task ids recorded now (not those recorded
    before). Of two facts of one task in ``facts``, the first is the one recorded. Rows go
    in in task id order, so replicas inserting overlapping batches do not deadlock. A fact
    whose reconcile state is already known is recorded reconciled (``reconciled_at`` now);
    a PENDING one is due for the reconcile sweep at ``reconcile_at``.

    ``alongside``, a data-modifying statement and its parameters, runs as a ``WITH`` item of
    the same statement: both take effect or neither, with no transaction around them."""
    first: dict[str, Finished] = {}
    for fact in facts:
        first.setdefault(fact.env.task_id, fact)
    if not first:
        return set()
    rows = [first[task_id] for task_id in sorted(first)]  # locks in task id order: no deadlock
    along_sql, along_params = alongside or ("", {})
    result = await conn.fetch(
        (
            (f"WITH alongside AS ({along_sql}) " if along_sql else "")
            + "INSERT INTO completions (task_id, business, status, status_reason, version, envelope, finished_at, recorded_at,"
            " callback_url, notify_state, notify_next_at, reconcile_state, reconcile_next_at,"
            " reconciled_at, trace)"
            " SELECT v.task_id, v.business, v.status, v.reason, v.version, v.envelope, v.finished_at, :now,"
            " v.callback, v.notify, CASE WHEN v.notify = 'pending' THEN CAST(:now AS timestamptz) END,"
            " v.reconcile, CASE WHEN v.reconcile = 'pending' THEN CAST(:reconcile_at AS timestamptz) END,"
            " CASE WHEN v.reconcile <> 'pending' THEN CAST(:now AS timestamptz) END, v.trace"
            " FROM unnest(CAST(:ids AS text[]), CAST(:business AS text[]), CAST(:status AS text[]),"
            " CAST(:reason AS text[]), CAST(:version AS bigint[]), CAST(:env AS bytea[]),"
            " CAST(:finished_at AS timestamptz[]), CAST(:callback AS text[]), CAST(:notify AS text[]),"
            " CAST(:reconcile AS text[]), CAST(:trace AS text[]))"
            " AS v(task_id, business, status, reason, version, envelope, finished_at, callback, notify,"
            " reconcile, trace)"
            " ON CONFLICT (task_id) DO NOTHING RETURNING task_id"
        ),
        {
            "ids": [f.env.task_id for f in rows],
            "business": [f.env.business for f in rows],
            "status": [f.status.lower() for f in rows],
            "reason": [truncate_error(f.env.status_reason) for f in rows],
            "version": [f.env.version for f in rows],
            "env": [f.env.SerializeToString() for f in rows],
            "finished_at": [f.finished_at for f in rows],
            "callback": [f.env.callback_url for f in rows],
            "notify": [f.notify.value for f in rows],
            "reconcile": [f.reconcile.value for f in rows],
            "trace": [f.trace for f in rows],
            "now": now,
            "reconcile_at": reconcile_at,
            **along_params,
        },
    )
    return {row[0] for row in result}


async def completion_get(conn: Conn, task_id: str) -> Row | None:
    rows = await conn.fetch("SELECT * FROM completions WHERE task_id = :id", {"id": task_id})
    return rows[0] if rows else None


async def completions_claim_notify(
    conn: Conn,
    now: datetime,
    lease_until: datetime,
    limit: int,
    *,
    per_business: int,
    busy: Mapping[str, int] | None = None,
) -> list[Row]:
    """Due deliveries, oldest due first, claimed until ``lease_until`` (other replicas skip
    them meanwhile): at most ``limit``, and of each business at most ``per_business`` less
    what it has under way already (``busy``), so a business with many due deliveries takes
    no more than its share and the others' are claimed beside them."""
    busy = dict(busy or {})
    return await conn.fetch(
        (
            "UPDATE completions c SET notify_next_at = :lease FROM ("
            "  SELECT task_id FROM completions WHERE task_id IN ("
            "   SELECT task_id FROM ("
            "    SELECT d.task_id, d.notify_next_at, row_number() OVER ("
            "     PARTITION BY d.business ORDER BY d.notify_next_at, d.task_id)"
            "     + coalesce(b.n, 0) AS place"
            "    FROM completions d LEFT JOIN unnest(CAST(:busy AS text[]), CAST(:busy_n AS integer[]))"
            "     AS b(business, n) ON b.business = d.business"
            "    WHERE d.notify_state = 'pending' AND d.notify_next_at <= :now) ranked"
            "   WHERE place <= :per_business ORDER BY notify_next_at, task_id LIMIT :limit)"
            "  AND notify_state = 'pending' AND notify_next_at <= :now"
            "  FOR UPDATE SKIP LOCKED) due"
            " WHERE c.task_id = due.task_id RETURNING c.*"
        ),
        {
            "now": now,
            "lease": lease_until,
            "limit": limit,
            "per_business": per_business,
            "busy": list(busy),
            "busy_n": list(busy.values()),
        },
    )


async def delivery_add(
    conn: Conn,
    task_id: str,
    attempt: int,
    target: str,
    now: datetime,
    ok: bool,
    status_code: int | None,
    error: str,
) -> None:
    await conn.fetch(
        (
            "INSERT INTO deliveries (task_id, attempt, target, at, ok, status_code, error)"
            " VALUES (:id, :attempt, :target, :now, :ok, :code, :error)"
        ),
        {
            "id": task_id,
            "attempt": attempt,
            "target": target,
            "now": now,
            "ok": ok,
            "code": status_code,
            "error": truncate_error(error),
        },
    )


async def completion_set_notify_if(
    conn: Conn,
    task_id: str,
    attempts_read: int,
    new: NotifyState,
    now: datetime,
    next_at: datetime | None,
    error: str,
) -> bool:
    """Record the outcome of attempt ``attempts_read + 1`` if no one recorded it first."""
    NOTIFY_TRANSITIONS.check(NotifyState.PENDING, new)
    moved = await conn.fetch(
        (
            "UPDATE completions SET notify_state = :new, notify_attempts = notify_attempts + 1, notify_next_at = :next,"
            " notify_last_error = :error, notified_at = CASE WHEN :new = 'delivered' THEN CAST(:now AS timestamptz) END"
            " WHERE task_id = :id AND notify_state = 'pending' AND notify_attempts = :attempts"
            " RETURNING task_id"
        ),
        {
            "id": task_id,
            "attempts": attempts_read,
            "new": new.value,
            "now": now,
            "next": next_at,
            "error": truncate_error(error),
        },
    )
    return bool(moved)


async def deliveries_get(conn: Conn, task_id: str) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM deliveries WHERE task_id = :id ORDER BY id", {"id": task_id}
    )


async def completions_claim_reconcile(
    conn: Conn, now: datetime, lease_until: datetime, limit: int
) -> list[Row]:
    """Finished tasks due for the reconcile sweep, oldest due first, claimed until
    ``lease_until`` (other replicas skip them meanwhile)."""
    return await conn.fetch(
        (
            "UPDATE completions c SET reconcile_next_at = :lease FROM ("
            "  SELECT task_id FROM completions WHERE reconcile_state = 'pending' AND reconcile_next_at <= :now"
            "  ORDER BY reconcile_next_at LIMIT :limit FOR UPDATE SKIP LOCKED) due"
            " WHERE c.task_id = due.task_id RETURNING c.*"
        ),
        {"now": now, "lease": lease_until, "limit": limit},
    )


async def completions_set_reconcile_if_many(
    conn: Conn,
    outcomes: Sequence[tuple[str, int, ReconcileState, datetime | None]],
    now: datetime,
) -> set[str]:
    """Record a reconcile sweep's outcomes — ``(task_id, attempts_read, new state, next
    attempt at)`` — with one statement; each row moves only if it is still ``pending`` at
    the attempts read (another sweep did not get there first). Returns the ids moved."""
    for _, _, new, _ in outcomes:
        RECONCILE_TRANSITIONS.check(ReconcileState.PENDING, new)
    if not outcomes:
        return set()
    result = await conn.fetch(
        (
            "UPDATE completions c SET reconcile_state = o.new,"
            " reconcile_attempts = c.reconcile_attempts + 1, reconcile_next_at = o.next,"
            " reconciled_at = CASE WHEN o.new = 'pending' THEN NULL"
            " ELSE CAST(:now AS timestamptz) END"
            " FROM unnest(CAST(:ids AS text[]), CAST(:attempts AS integer[]),"
            " CAST(:news AS text[]), CAST(:nexts AS timestamptz[])) AS o(id, attempts, new, next)"
            " WHERE c.task_id = o.id AND c.reconcile_state = 'pending'"
            " AND c.reconcile_attempts = o.attempts RETURNING c.task_id"
        ),
        {
            "ids": [o[0] for o in outcomes],
            "attempts": [o[1] for o in outcomes],
            "news": [o[2].value for o in outcomes],
            "nexts": [o[3] for o in outcomes],
            "now": now,
        },
    )
    return {row.task_id for row in result}


class Finding(NamedTuple):
    """One disagreement between a node's recorded status and what its probe observed."""

    task_id: str
    node_id: str
    downstream: str
    recorded: str
    observed: str
    detail: str


async def findings_add_many(conn: Conn, findings: Sequence[Finding], now: datetime) -> None:
    """Record the findings with one statement; a node's finding recorded before stays."""
    if not findings:
        return
    await conn.fetch(
        "INSERT INTO findings (task_id, node_id, downstream, recorded_status, observed, detail, found_at)"
        " SELECT f.task_id, f.node_id, f.downstream, f.recorded, f.observed, f.detail, :now"
        " FROM unnest(CAST(:ids AS text[]), CAST(:nodes AS text[]), CAST(:downstreams AS text[]),"
        " CAST(:recorded AS text[]), CAST(:observed AS text[]), CAST(:details AS text[]))"
        " AS f(task_id, node_id, downstream, recorded, observed, detail)"
        " ON CONFLICT DO NOTHING",
        {
            "ids": [f.task_id for f in findings],
            "nodes": [f.node_id for f in findings],
            "downstreams": [f.downstream for f in findings],
            "recorded": [f.recorded.lower() for f in findings],
            "observed": [f.observed for f in findings],
            "details": [truncate_error(f.detail) for f in findings],
            "now": now,
        },
    )


async def findings_list(conn: Conn, task_id: str, limit: int, offset: int) -> list[Row]:
    where = "WHERE task_id = :id" if task_id else ""
    return await conn.fetch(
        f"SELECT * FROM findings {where} ORDER BY id LIMIT :limit OFFSET :offset",
        {"id": task_id, "limit": limit, "offset": offset},
    )


# ---- retention (ADR-0105) ---------------------------------------------------------------
# A finished task the completion facts are done with: its caller notified (or given up on,
# or none asked for) and its reconciliation ended, and not parked here again since (a
# resumed task that failed again is recovery's work).
_DONE = (
    "t.finished_at < p.cutoff"
    f" AND t.notify_state <> '{NotifyState.PENDING.value}'"
    f" AND t.reconcile_state <> '{ReconcileState.PENDING.value}'"
    " AND NOT EXISTS (SELECT 1 FROM recovery_tasks r WHERE r.task_id = t.task_id"
    " AND r.state = ANY(CAST(:parked AS text[])))"
)
_BUSINESSES_FINISHED = Statement(businesses_statement("completions"))
_DELETE_IF_DONE = Statement(
    f"WITH {past_cutoff('completions', 'finished_at', _DONE)},"
    " gone_deliveries AS (DELETE FROM deliveries x USING doomed d"
    " WHERE x.task_id = d.task_id RETURNING 1),"
    " gone_findings AS (DELETE FROM findings x USING doomed d WHERE x.task_id = d.task_id"
    " RETURNING 1),"
    " gone AS (DELETE FROM completions c USING doomed d WHERE c.task_id = d.task_id"
    " RETURNING c.task_id)"
    " SELECT task_id, (SELECT count(*) FROM gone_deliveries) AS deliveries,"
    " (SELECT count(*) FROM gone_findings) AS findings FROM gone"
)
_DUE = Statement(due_statement("completions", "finished_at", _DONE))


async def completions_businesses_finished(conn: Conn) -> list[str]:
    """The businesses with finished tasks recorded."""
    return list(await _BUSINESSES_FINISHED.scalars(conn))


async def completions_delete_if_done_many(
    conn: Conn, cutoffs: Mapping[str, datetime], limit: int
) -> tuple[list[str], dict[str, int]]:
    """Delete at most ``limit`` completion facts of tasks finished before their business's
    cutoff, oldest first, with their deliveries and findings, in one statement; a fact whose
    notification or reconciliation is still pending, or whose task is parked again, is
    kept. The ids deleted and the rows deleted by table."""
    rows = await _DELETE_IF_DONE.fetch(
        conn, {**cutoff_params(cutoffs, limit), "parked": [s.value for s in PARKED]}
    )
    counts = {
        "completions": len(rows),
        "deliveries": rows[0].deliveries if rows else 0,
        "findings": rows[0].findings if rows else 0,
    }
    return [r.task_id for r in rows], counts


async def completions_due(conn: Conn, cutoffs: Mapping[str, datetime]) -> dict[str, int]:
    """How many completion facts of each business are past its cutoff and done with."""
    rows = await _DUE.fetch(conn, {**cutoff_params(cutoffs), "parked": [s.value for s in PARKED]})
    return {r.business: r.due for r in rows}
