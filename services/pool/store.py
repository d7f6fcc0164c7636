"""All SQL of the pool context, on the driver port (:mod:`dispo.libs.db.driver`, ADR-0088).
Functions take a :class:`~dispo.libs.db.driver.Conn` (the caller owns the transaction:
``db.transaction()``, or ``db.connection()`` for reads and single statements) and ``now``;
names say the entity first and the guard second.

Every state-changing UPDATE first checks its move against the declared table
(``EVALUATION_TRANSITIONS`` / ``CRON_TRANSITIONS``; an undeclared move raises
``IllegalTransition`` and writes nothing), then carries its expected state in WHERE; a
function whose guard did not match returns None / False (its ``RETURNING`` came back
empty) and the caller decides what a lost race means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.libs.db.driver import Conn, Row
from dispo.libs.evaluation import Line
from dispo.libs.outbox import outbox_table
from dispo.pool.domain import (
    CRON_TRANSITIONS,
    EVALUATION_TRANSITIONS,
    SERVABLE,
    Assignment,
    Cron,
    CronStatus,
    Evaluation,
    EvaluationStatus,
    QueueKey,
    Rule,
    RunResult,
    Schedule,
    TestCase,
)
from sqlalchemy import MetaData

# The events of the pool, written in the transaction that changes what they report
# (see events.py); the shared shape of libs/outbox.py.
outbox = outbox_table(MetaData())

_SERVABLE = ", ".join(f"'{s.value}'" for s in SERVABLE)
# The slot now running, -1 before the window (mirrors Schedule.current_slot).
SLOT_SQL = (
    "GREATEST(-1, LEAST(e.slot_count - 1, FLOOR(EXTRACT(EPOCH FROM (CAST(:now AS timestamptz)"
    " - e.window_start)) * e.slot_count / e.window_seconds)))::int"
)
DEBT_SQL = f"GREATEST(0, e.runs_per_slot * ({SLOT_SQL} + 1) - e.runs_done)"
SLOT_DUE_SQL = f"({DEBT_SQL} > 0 AND e.runs_done <= e.runs_per_slot * {SLOT_SQL})"
QUEUE_WHERE = f"e.status IN ({_SERVABLE}) AND e.assigned_cron_id IS NULL AND {DEBT_SQL} > 0"
# Operator boost, then slot due > debt > waiting time (seed: 时段到期 > 欠账多 > 等待时间长).
QUEUE_ORDER = (
    f"e.priority_boost DESC, {SLOT_DUE_SQL} DESC, {DEBT_SQL} DESC, e.waiting_since ASC, e.id ASC"
)

_EVAL_COLUMNS = """e.id, e.series, e.line, e.period, e.configuration_json, e.analysis_model, e.target_url,
    e.cases, e.window_start, e.window_seconds, e.slot_count, e.runs_per_slot, e.status, e.priority_boost,
    e.runs_done, e.assigned_cron_id, e.assigned_at, e.waiting_since, e.created_at, e.started_at, e.completed_at"""


def _cases_to_json(cases: tuple[TestCase, ...]) -> str:
    return json.dumps(
        [
            {
                "id": c.id,
                "method": c.method,
                "path": c.path,
                "body": c.body,
                "rules": [{"kind": r.kind, "path": r.path, "value": r.value} for r in c.rules],
            }
            for c in cases
        ]
    )


def _cases_from_json(raw: str | list[dict[str, Any]]) -> tuple[TestCase, ...]:
    data = json.loads(raw) if isinstance(raw, str) else raw
    return tuple(
        TestCase(
            c["id"],
            c["method"],
            c["path"],
            c["body"],
            tuple(Rule(r["kind"], r["value"], r["path"]) for r in c["rules"]),
        )
        for c in data
    )


def _evaluation(m: Row) -> Evaluation:
    return Evaluation(
        id=m["id"],
        series=m["series"],
        line=Line(m["line"]),
        period=m["period"],
        configuration_json=m["configuration_json"],
        analysis_model=m["analysis_model"],
        target_url=m["target_url"],
        cases=_cases_from_json(m["cases"]),
        schedule=Schedule(
            m["window_start"], m["window_seconds"], m["slot_count"], m["runs_per_slot"]
        ),
        status=EvaluationStatus(m["status"]),
        priority_boost=m["priority_boost"],
        runs_done=m["runs_done"],
        assigned_cron_id=m["assigned_cron_id"],
        assigned_at=m["assigned_at"],
        waiting_since=m["waiting_since"],
        created_at=m["created_at"],
        started_at=m["started_at"],
        completed_at=m["completed_at"],
    )


def _cron(m: Row) -> Cron:
    return Cron(
        m["id"], CronStatus(m["status"]), m["evaluation_id"], m["last_activity"], m["created_at"]
    )


async def evaluation_insert(conn: Conn, ev: Evaluation, now: datetime) -> Evaluation | None:
    """Insert a queued evaluation; returns the row as stored (window starting ``now``), or
    None when an evaluation with its id exists (nothing changed)."""
    rows = await conn.fetch(
        f"""
        INSERT INTO evaluations AS e (id, series, line, period, configuration_json, analysis_model,
            target_url, cases, window_start, window_seconds, slot_count, runs_per_slot, status,
            waiting_since, created_at)
        VALUES (:id, :series, :line, :period, :cfg, :model, :target, CAST(:cases AS jsonb), :now,
            :window, :slots, :rps, 'queued', :now, :now)
        ON CONFLICT (id) DO NOTHING
        RETURNING {_EVAL_COLUMNS}""",
        {
            "id": ev.id,
            "series": ev.series,
            "line": ev.line.value,
            "period": ev.period,
            "cfg": ev.configuration_json,
            "model": ev.analysis_model,
            "target": ev.target_url,
            "cases": _cases_to_json(ev.cases),
            "now": now,
            "window": ev.schedule.window_seconds,
            "slots": ev.schedule.slot_count,
            "rps": ev.schedule.runs_per_slot,
        },
    )
    return _evaluation(rows[0]) if rows else None


async def evaluation_get(
    conn: Conn, evaluation_id: str, *, lock: bool = False
) -> Evaluation | None:
    sql = f"SELECT {_EVAL_COLUMNS} FROM evaluations e WHERE e.id = :id" + (
        " FOR UPDATE" if lock else ""
    )
    rows = await conn.fetch(sql, {"id": evaluation_id})
    return _evaluation(rows[0]) if rows else None


async def evaluation_set_status_if(
    conn: Conn,
    evaluation_id: str,
    expected: tuple[EvaluationStatus, ...],
    new: EvaluationStatus,
    now: datetime,
) -> bool:
    """Move an unassigned evaluation between statuses (pause / resume / cancel / complete)."""
    EVALUATION_TRANSITIONS.check(expected, new)
    done = new in (EvaluationStatus.COMPLETED, EvaluationStatus.CANCELLED)
    rows = await conn.fetch(
        """
        UPDATE evaluations SET status = :new, waiting_since = :now,
            completed_at = CASE WHEN :done THEN CAST(:now AS timestamptz) ELSE completed_at END
        WHERE id = :id AND assigned_cron_id IS NULL AND status = ANY(CAST(:expected AS text[]))
        RETURNING id""",
        {
            "id": evaluation_id,
            "new": new.value,
            "now": now,
            "done": done,
            "expected": [s.value for s in expected],
        },
    )
    return len(rows) == 1


async def evaluation_set_boost(conn: Conn, evaluation_id: str, boost: int) -> bool:
    rows = await conn.fetch(
        "UPDATE evaluations SET priority_boost = :b"
        " WHERE id = :id AND status NOT IN ('completed', 'cancelled') RETURNING id",
        {"id": evaluation_id, "b": boost},
    )
    return len(rows) == 1


# Servable statuses a claim moves to executing (an executing one just changes cron).
_CLAIMED_FROM = tuple(s for s in SERVABLE if s is not EvaluationStatus.EXECUTING)


@dataclass(frozen=True)
class Claim:
    evaluation: Evaluation
    previous_status: EvaluationStatus


async def evaluation_claim_top_for_cron(
    conn: Conn, cron_id: str, now: datetime, evaluation_id: str | None = None
) -> Claim | None:
    """Hand the top queue item (or the named one) to an idle cron, in one statement.

    The cron row is locked and must be idle; the evaluation row is taken with SKIP LOCKED,
    so of any number of racing crons exactly one gets each item. An executing evaluation
    between crons stays executing; a queued or stuck one starts executing.
    """
    EVALUATION_TRANSITIONS.check(_CLAIMED_FROM, EvaluationStatus.EXECUTING)
    CRON_TRANSITIONS.check(CronStatus.IDLE, CronStatus.BUSY)
    only = "AND e.id = :eid" if evaluation_id else ""
    rows = await conn.fetch(
        f"""
        WITH cron AS (
            SELECT id FROM crons WHERE id = :cron AND status = 'idle' FOR UPDATE
        ), pick AS (
            SELECT e.id, e.status AS previous_status FROM evaluations e, cron
            WHERE {QUEUE_WHERE} {only}
            ORDER BY {QUEUE_ORDER} LIMIT 1 FOR UPDATE OF e SKIP LOCKED
        ), took AS (
            UPDATE evaluations e SET status = 'executing', assigned_cron_id = :cron, assigned_at = :now,
                started_at = COALESCE(e.started_at, :now)
            FROM pick WHERE e.id = pick.id
            RETURNING e.id, pick.previous_status
        ), busy AS (
            UPDATE crons c SET status = 'busy', evaluation_id = took.id, last_activity = :now
            FROM took WHERE c.id = :cron AND c.status = 'idle'
            RETURNING c.id
        )
        INSERT INTO assignments (cron_id, evaluation_id, started_at)
        SELECT :cron, took.id, :now FROM took, busy
        RETURNING evaluation_id, (SELECT previous_status FROM took)""",
        {"cron": cron_id, "now": now, "eid": evaluation_id},
    )
    if not rows:
        return None
    ev = await evaluation_get(conn, rows[0][0])
    assert ev is not None
    return Claim(ev, EvaluationStatus(rows[0][1]))


async def queue_list(conn: Conn, now: datetime, limit: int = 100) -> list[QueueKey]:
    rows = await conn.fetch(
        f"""
        SELECT e.id, e.priority_boost, {SLOT_DUE_SQL}, {DEBT_SQL}, e.waiting_since, e.status
        FROM evaluations e WHERE {QUEUE_WHERE} ORDER BY {QUEUE_ORDER} LIMIT :limit""",
        {"now": now, "limit": limit},
    )
    return [QueueKey(r[1], r[2], r[3], r[4], r[0], r[5]) for r in rows]


async def queue_depth(conn: Conn, now: datetime) -> tuple[int, datetime | None]:
    [row] = await conn.fetch(
        f"SELECT count(*), min(e.waiting_since) FROM evaluations e WHERE {QUEUE_WHERE}",
        {"now": now},
    )
    return row[0], row[1]


async def evaluations_held_longer_than(
    conn: Conn, cutoff: datetime, limit: int
) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        """
        SELECT id, assigned_cron_id FROM evaluations
        WHERE assigned_cron_id IS NOT NULL AND assigned_at <= :cutoff ORDER BY assigned_at LIMIT :limit""",
        {"cutoff": cutoff, "limit": limit},
    )
    return [(r[0], r[1]) for r in rows]


async def evaluation_count_by_status(conn: Conn, status: EvaluationStatus) -> int:
    [count] = await conn.scalars(
        "SELECT count(*) FROM evaluations WHERE status = :s", {"s": status.value}
    )
    return int(count)


# --- runs ------------------------------------------------------------------------------


async def run_exists(conn: Conn, evaluation_id: str, run_index: int) -> str | None:
    ids = await conn.scalars(
        "SELECT run_id FROM runs WHERE evaluation_id = :e AND run_index = :i",
        {"e": evaluation_id, "i": run_index},
    )
    return ids[0] if ids else None


async def run_record_if_next(
    conn: Conn,
    ev: Evaluation,
    cron_id: str,
    run_index: int,
    case_id: str,
    result: RunResult,
    now: datetime,
) -> bool:
    """Insert run ``run_index`` and count it, only if it is the next one and the cron holds the evaluation."""
    counted = await conn.fetch(
        """
        UPDATE evaluations SET runs_done = runs_done + 1
        WHERE id = :e AND assigned_cron_id = :cron AND status = 'executing' AND runs_done = :i
        RETURNING id""",
        {"e": ev.id, "cron": cron_id, "i": run_index},
    )
    if len(counted) != 1:
        return False
    await conn.fetch(
        """
        INSERT INTO runs (run_id, evaluation_id, run_index, case_id, cron_id, verdict, score, latency_ms,
            failure_reason, recorded_at)
        VALUES (:rid, :e, :i, :case, :cron, :verdict, :score, :lat, :reason, :now)""",
        {
            "rid": ev.run_id(run_index),
            "e": ev.id,
            "i": run_index,
            "case": case_id,
            "cron": cron_id,
            "verdict": result.verdict.value,
            "score": result.score,
            "lat": result.latency_ms,
            "reason": result.failure_reason,
            "now": now,
        },
    )
    await conn.fetch(
        "UPDATE crons SET last_activity = :now WHERE id = :cron AND status = 'busy'",
        {"cron": cron_id, "now": now},
    )
    return True


# --- crons and assignments -------------------------------------------------------------


async def cron_insert(conn: Conn, cron_id: str, now: datetime) -> None:
    await conn.fetch(
        "INSERT INTO crons (id, status, last_activity, created_at) VALUES (:id, 'idle', :now, :now)",
        {"id": cron_id, "now": now},
    )


async def cron_get(conn: Conn, cron_id: str) -> Cron | None:
    rows = await conn.fetch("SELECT * FROM crons WHERE id = :id", {"id": cron_id})
    return _cron(rows[0]) if rows else None


async def crons_list(conn: Conn) -> list[Cron]:
    return [_cron(r) for r in await conn.fetch("SELECT * FROM crons ORDER BY created_at, id")]


async def cron_ids_with_status(conn: Conn, status: CronStatus) -> list[str]:
    return await conn.scalars(
        "SELECT id FROM crons WHERE status = :s ORDER BY created_at, id", {"s": status.value}
    )


async def cron_touch_if_live(conn: Conn, cron_id: str, now: datetime) -> Cron | None:
    rows = await conn.fetch(
        """
        UPDATE crons SET last_activity = GREATEST(last_activity, CAST(:now AS timestamptz))
        WHERE id = :id AND status IN ('idle', 'busy') RETURNING *""",
        {"id": cron_id, "now": now},
    )
    return _cron(rows[0]) if rows else None


async def cron_release_if_holding(
    conn: Conn,
    cron_id: str,
    evaluation_id: str,
    reason: str,
    now: datetime,
    *,
    touch: bool = True,
) -> bool:
    """End the assignment of ``evaluation_id`` to ``cron_id``: cron idle, evaluation back in the queue."""
    CRON_TRANSITIONS.check(CronStatus.BUSY, CronStatus.IDLE)
    # The evaluation row first, then the cron row (the pool's lock order).
    await evaluation_unassign_if(conn, evaluation_id, cron_id, now)
    freed = await conn.fetch(
        """
        UPDATE crons SET status = 'idle', evaluation_id = NULL,
            last_activity = CASE WHEN :touch THEN CAST(:now AS timestamptz) ELSE last_activity END
        WHERE id = :cron AND status = 'busy' AND evaluation_id = :e RETURNING id""",
        {"cron": cron_id, "e": evaluation_id, "now": now, "touch": touch},
    )
    await assignment_end(conn, cron_id, evaluation_id, reason, now)
    return len(freed) == 1


async def evaluation_unassign_if(
    conn: Conn,
    evaluation_id: str,
    cron_id: str,
    now: datetime,
    new_status: EvaluationStatus | None = None,
) -> bool:
    """Take ``cron_id`` off the evaluation it holds (which is executing: the schema allows an
    assignment only then), moving it to ``new_status`` if one is given."""
    if new_status is not None:
        EVALUATION_TRANSITIONS.check(EvaluationStatus.EXECUTING, new_status)
    rows = await conn.fetch(
        """
        UPDATE evaluations SET assigned_cron_id = NULL, assigned_at = NULL, waiting_since = :now,
            status = COALESCE(CAST(:status AS text), status)
        WHERE id = :e AND assigned_cron_id = :cron AND status = 'executing' RETURNING id""",
        {
            "e": evaluation_id,
            "cron": cron_id,
            "now": now,
            "status": new_status.value if new_status else None,
        },
    )
    return len(rows) == 1


async def assignment_end(
    conn: Conn, cron_id: str, evaluation_id: str, reason: str, now: datetime
) -> None:
    await conn.fetch(
        """
        UPDATE assignments SET ended_at = :now, end_reason = :reason
        WHERE cron_id = :cron AND evaluation_id = :e AND ended_at IS NULL""",
        {"cron": cron_id, "e": evaluation_id, "reason": reason, "now": now},
    )


async def crons_silent_before(conn: Conn, cutoff: datetime, limit: int) -> list[Cron]:
    rows = await conn.fetch(
        """
        SELECT * FROM crons WHERE status IN ('idle', 'busy') AND last_activity <= :cutoff
        ORDER BY last_activity LIMIT :limit""",
        {"cutoff": cutoff, "limit": limit},
    )
    return [_cron(r) for r in rows]


async def cron_mark_stuck_if_silent(conn: Conn, cron: Cron, cutoff: datetime) -> bool:
    CRON_TRANSITIONS.check(cron.status, CronStatus.STUCK)
    rows = await conn.fetch(
        """
        UPDATE crons SET status = 'stuck', evaluation_id = NULL
        WHERE id = :id AND status = :status AND last_activity <= :cutoff
          AND evaluation_id IS NOT DISTINCT FROM CAST(:e AS text) RETURNING id""",
        {"id": cron.id, "status": cron.status.value, "cutoff": cutoff, "e": cron.evaluation_id},
    )
    return len(rows) == 1


async def cron_delete_if(conn: Conn, cron_id: str, status: CronStatus) -> bool:
    rows = await conn.fetch(
        "DELETE FROM crons WHERE id = :id AND status = :s RETURNING id",
        {"id": cron_id, "s": status.value},
    )
    return len(rows) == 1


async def crons_idle_for_removal(conn: Conn, count: int) -> list[str]:
    return await conn.scalars(
        "SELECT id FROM crons WHERE status = 'idle' ORDER BY created_at DESC, id DESC LIMIT :n",
        {"n": count},
    )


async def crons_idle_to_wake(conn: Conn, count: int) -> list[str]:
    return await conn.scalars(
        "SELECT id FROM crons WHERE status = 'idle' ORDER BY last_activity, id LIMIT :n",
        {"n": count},
    )


async def cron_counts(conn: Conn) -> dict[CronStatus, int]:
    rows = await conn.fetch("SELECT status, count(*) FROM crons GROUP BY status")
    counts = {s: 0 for s in CronStatus}
    counts.update({CronStatus(r[0]): r[1] for r in rows})
    return counts


async def assignments_list(
    conn: Conn, cron_id: str = "", evaluation_id: str = "", limit: int = 100
) -> list[Assignment]:
    rows = await conn.fetch(
        """
        SELECT * FROM assignments
        WHERE (CAST(:c AS text) = '' OR cron_id = :c) AND (CAST(:e AS text) = '' OR evaluation_id = :e)
        ORDER BY id DESC LIMIT :limit""",
        {"c": cron_id, "e": evaluation_id, "limit": limit},
    )
    return [
        Assignment(r.id, r.cron_id, r.evaluation_id, r.started_at, r.ended_at, r.end_reason)
        for r in rows
    ]


async def evaluations_assigned_or_named(conn: Conn) -> list[tuple[str, str, str | None]]:
    """(id, status, assigned cron) of evaluations holding a cron or named by a cron."""
    rows = await conn.fetch(
        """
        SELECT e.id, e.status, e.assigned_cron_id FROM evaluations e
        WHERE e.assigned_cron_id IS NOT NULL OR e.id IN (SELECT evaluation_id FROM crons WHERE evaluation_id IS NOT NULL)
        ORDER BY e.id"""
    )
    return [(r[0], r[1], r[2]) for r in rows]


# --- bounds, resizes -------------------------------------------------------------------


async def bounds_get(conn: Conn, default: tuple[int, int]) -> tuple[int, int]:
    rows = await conn.fetch("SELECT min_size, max_size FROM bounds")
    return (rows[0][0], rows[0][1]) if rows else default


async def bounds_set(conn: Conn, min_size: int, max_size: int) -> None:
    await conn.fetch(
        """
        INSERT INTO bounds (singleton, min_size, max_size) VALUES (true, :lo, :hi)
        ON CONFLICT (singleton) DO UPDATE SET min_size = :lo, max_size = :hi""",
        {"lo": min_size, "hi": max_size},
    )


async def resize_record(
    conn: Conn, from_size: int, to_size: int, reason: str, now: datetime
) -> None:
    await conn.fetch(
        "INSERT INTO resizes (from_size, to_size, reason, at) VALUES (:f, :t, :r, :now)",
        {"f": from_size, "t": to_size, "r": reason, "now": now},
    )


async def resizes_list(conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM resizes ORDER BY id DESC LIMIT :n", {"n": limit})
    return [dict(r) for r in rows]


async def evaluations_next_slot_at(conn: Conn, now: datetime) -> datetime | None:
    """When the next slot of a waiting evaluation that owes nothing now falls due."""
    [due] = await conn.scalars(
        f"""
        SELECT min(e.window_start + make_interval(secs => ({SLOT_SQL} + 1) * e.window_seconds::float8 / e.slot_count))
        FROM evaluations e
        WHERE e.status IN ({_SERVABLE}) AND e.assigned_cron_id IS NULL AND {DEBT_SQL} = 0
          AND {SLOT_SQL} < e.slot_count - 1""",
        {"now": now},
    )
    return due


async def crons_touch_all_live(conn: Conn, now: datetime) -> int:
    """After the pool itself was away, its crons could not report: restart their silence clocks."""
    [touched] = await conn.scalars(
        """
        WITH touched AS (
            UPDATE crons SET last_activity = :now
            WHERE status IN ('idle', 'busy') AND last_activity < :now RETURNING 1
        ) SELECT count(*) FROM touched""",
        {"now": now},
    )
    return int(touched)
