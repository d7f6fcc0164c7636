"""All SQL of the intelligence context: the evaluation read model and the job rows, on the
driver port (:mod:`dispo.libs.db.driver`, ADR-0088). Functions take a
:class:`~dispo.libs.db.driver.Conn`; every use case of the context is single statements,
each committing alone, so callers take ``db.connection()``.

Names say the entity first and the guard second. Every state-changing UPDATE first checks
its move against the declared table (``TRANSITIONS`` / ``EVALUATION_TRANSITIONS``; an
undeclared move raises ``IllegalTransition`` and writes nothing), then carries the state it
expects in its WHERE; ``False`` / ``None`` back means the race was lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from dispo.intelligence.evaluations import (
    EVALUATION_TRANSITIONS,
    Evaluation,
    EvaluationRecordStatus,
    RunResult,
)
from dispo.intelligence.job_rules import REQUEUE_FROM, TRANSITIONS, Job, JobKind, JobStatus
from dispo.libs.db.driver import Conn, Row
from dispo.libs.evaluation import Line, Verdict
from dispo.libs.states import EnumCheck

# Every enum mirrored by a CHECK constraint (tests/intelligence/test_schema.py compares).
CHECKED_COLUMNS = (
    EnumCheck("evaluations", "status", "ck_evaluation_status", EvaluationRecordStatus),
    EnumCheck("evaluations", "line", "ck_evaluation_line", Line),
    EnumCheck("evaluation_runs", "verdict", "ck_run_verdict", Verdict),
    EnumCheck("intelligence_jobs", "kind", "ck_job_kind", JobKind),
    EnumCheck("intelligence_jobs", "status", "ck_job_status", JobStatus),
)

_EVALUATION_COLUMNS = """c.evaluation_id, c.series, c.line, c.status, c.period, c.configuration, c.analysis_model,
    c.created_at, c.completed_at,
    (SELECT count(*) FROM evaluation_runs r WHERE r.evaluation_id = c.evaluation_id) AS run_count"""
_JOB_COLUMNS = """kind, evaluation_id, status, error, attempts, recovery_attempts, analysis_model,
    baseline_evaluation_id, fingerprint, result, claim_token, heartbeat_at, created_at, updated_at, started_at,
    finished_at"""


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _evaluation(row: Row) -> Evaluation:
    return Evaluation(
        evaluation_id=row["evaluation_id"],
        series=row["series"],
        line=Line(row["line"]),
        status=EvaluationRecordStatus(row["status"]),
        period=row["period"],
        configuration=_json(row["configuration"]),
        analysis_model=row["analysis_model"],
        created_at=row["created_at"],
        completed_at=row["completed_at"],
        run_count=row["run_count"],
    )


def _job(row: Row) -> Job:
    return Job(
        kind=JobKind(row["kind"]),
        evaluation_id=row["evaluation_id"],
        status=JobStatus(row["status"]),
        error=row["error"],
        attempts=row["attempts"],
        recovery_attempts=row["recovery_attempts"],
        analysis_model=row["analysis_model"],
        baseline_evaluation_id=row["baseline_evaluation_id"],
        fingerprint=row["fingerprint"],
        result=_json(row["result"]),
        claim_token=row["claim_token"],
        heartbeat_at=row["heartbeat_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


def _set_fields(fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``, col = :f_col`` for each settlement field (names come from SETTLEMENT_FIELDS only)."""
    sql = "".join(f", {name} = :f_{name}" for name in sorted(fields))
    return sql, {f"f_{name}": value for name, value in fields.items()}


async def _one(conn: Conn, sql: str, **params: Any) -> Row | None:
    rows = await conn.fetch(sql, params)
    return rows[0] if rows else None


async def _all(conn: Conn, sql: str, **params: Any) -> list[Row]:
    return await conn.fetch(sql, params)


# --- evaluations ---------------------------------------------------------------------


async def evaluation_insert(conn: Conn, evaluation: Evaluation, now: datetime) -> bool:
    """Insert a running evaluation; ``False`` when the id already exists (nothing changed)."""
    row = await _one(
        conn,
        """INSERT INTO evaluations (evaluation_id, series, line, status, period, configuration, fingerprint,
               analysis_model, created_at, updated_at)
           VALUES (:id, :series, :line, 'running', :period, CAST(:configuration AS jsonb), :fingerprint,
               :model, :now, :now)
           ON CONFLICT (evaluation_id) DO NOTHING RETURNING evaluation_id""",
        id=evaluation.evaluation_id,
        series=evaluation.series,
        line=evaluation.line.value,
        period=evaluation.period,
        configuration=json.dumps(evaluation.configuration),
        fingerprint=evaluation.fingerprint,
        model=evaluation.analysis_model,
        now=now,
    )
    return row is not None


async def evaluation_get(conn: Conn, evaluation_id: str) -> Evaluation | None:
    row = await _one(
        conn,
        f"SELECT {_EVALUATION_COLUMNS} FROM evaluations c WHERE c.evaluation_id = :id",
        id=evaluation_id,
    )
    return _evaluation(row) if row else None


async def evaluation_complete_if_running(
    conn: Conn, evaluation_id: str, status: EvaluationRecordStatus, now: datetime
) -> bool:
    EVALUATION_TRANSITIONS.check(EvaluationRecordStatus.RUNNING, status)
    row = await _one(
        conn,
        """UPDATE evaluations SET status = :status, completed_at = :now, updated_at = :now
           WHERE evaluation_id = :id AND status = 'running' RETURNING evaluation_id""",
        id=evaluation_id,
        status=status.value,
        now=now,
    )
    return row is not None


async def evaluation_set_analysis_model(
    conn: Conn, evaluation_id: str, model: str | None, now: datetime
) -> bool:
    row = await _one(
        conn,
        """UPDATE evaluations SET analysis_model = :model, updated_at = :now
           WHERE evaluation_id = :id RETURNING evaluation_id""",
        id=evaluation_id,
        model=model,
        now=now,
    )
    return row is not None


async def evaluation_find_baseline(conn: Conn, evaluation: Evaluation) -> Evaluation | None:
    """The latest completed period of the evaluation's series and line before its period,
    with the same configuration fingerprint."""
    row = await _one(
        conn,
        f"""SELECT {_EVALUATION_COLUMNS} FROM evaluations c
            WHERE c.series = :series AND c.line = :line AND c.fingerprint = :fingerprint
              AND c.status = 'completed' AND c.period < :period AND c.evaluation_id <> :exclude
            ORDER BY c.period DESC, c.completed_at DESC, c.evaluation_id DESC LIMIT 1""",
        series=evaluation.series,
        line=evaluation.line.value,
        fingerprint=evaluation.fingerprint,
        period=evaluation.period,
        exclude=evaluation.evaluation_id,
    )
    return _evaluation(row) if row else None


async def evaluation_baseline_to_come(conn: Conn, evaluation: Evaluation) -> Evaluation | None:
    """The latest period before the evaluation's, of its series and line and with its
    configuration fingerprint, when that period is still running (once it completes it
    is the baseline :meth:`evaluation_find_baseline` finds); None when the latest such
    period is completed, or there is none. Of a completed and a running evaluation of one
    period, the completed one counts."""
    row = await _one(
        conn,
        f"""SELECT {_EVALUATION_COLUMNS} FROM evaluations c
            WHERE c.series = :series AND c.line = :line AND c.fingerprint = :fingerprint
              AND c.status IN ('completed', 'running') AND c.period < :period
              AND c.evaluation_id <> :exclude
            ORDER BY c.period DESC, c.status = 'completed' DESC LIMIT 1""",
        series=evaluation.series,
        line=evaluation.line.value,
        fingerprint=evaluation.fingerprint,
        period=evaluation.period,
        exclude=evaluation.evaluation_id,
    )
    return _evaluation(row) if row and row.status == "running" else None


async def evaluations_completed_without_job(
    conn: Conn, kind: JobKind, prerequisite: JobKind | None, limit: int
) -> list[Evaluation]:
    """Completed formal evaluations with no ``kind`` row (and, if given, a completed
    ``prerequisite`` row): automatic triggers that a crash may have lost."""
    prerequisite_sql = (
        (
            "AND EXISTS (SELECT 1 FROM intelligence_jobs p WHERE p.evaluation_id = c.evaluation_id "
            "AND p.kind = :prerequisite AND p.status = 'completed')"
        )
        if prerequisite
        else ""
    )
    rows = await _all(
        conn,
        f"""SELECT {_EVALUATION_COLUMNS} FROM evaluations c
            WHERE c.status = 'completed' AND c.line = 'formal'
              AND NOT EXISTS (SELECT 1 FROM intelligence_jobs j WHERE j.evaluation_id = c.evaluation_id
                              AND j.kind = :kind) {prerequisite_sql}
            ORDER BY c.completed_at, c.evaluation_id LIMIT :limit""",
        kind=kind.value,
        prerequisite=prerequisite.value if prerequisite else None,
        limit=limit,
    )
    return [_evaluation(r) for r in rows]


# --- runs ----------------------------------------------------------------------------


async def runs_insert(
    conn: Conn, evaluation_id: str, runs: Iterable[RunResult], now: datetime
) -> int:
    """Store runs; a run_id already stored is skipped. Returns how many were new."""
    rows = [
        {
            "run_id": r.run_id,
            "evaluation_id": evaluation_id,
            "case_id": r.case_id,
            "verdict": r.verdict.value,
            "score": r.score,
            "latency_ms": r.latency_ms,
            "failure_reason": r.failure_reason,
            "recorded_at": r.recorded_at or now,
        }
        for r in runs
    ]
    if not rows:
        return 0
    [inserted] = await conn.scalars(
        """WITH inserted AS (
               INSERT INTO evaluation_runs (run_id, evaluation_id, case_id, verdict, score, latency_ms,
                   failure_reason, recorded_at)
               SELECT * FROM unnest(CAST(:run_id AS text[]), CAST(:evaluation_id AS text[]),
                   CAST(:case_id AS text[]), CAST(:verdict AS text[]), CAST(:score AS float8[]),
                   CAST(:latency_ms AS int8[]), CAST(:failure_reason AS text[]),
                   CAST(:recorded_at AS timestamptz[]))
               ON CONFLICT (run_id) DO NOTHING
               RETURNING 1)
           SELECT count(*) FROM inserted""",
        {key: [row[key] for row in rows] for key in rows[0]},
    )
    return int(inserted)


async def runs_known(conn: Conn, run_ids: list[str]) -> int:
    row = await _one(
        conn,
        "SELECT count(*) AS n FROM evaluation_runs WHERE run_id = ANY(CAST(:ids AS text[]))",
        ids=run_ids,
    )
    return int(row["n"]) if row else 0


async def runs_of(conn: Conn, evaluation_id: str) -> list[RunResult]:
    rows = await _all(
        conn,
        """SELECT run_id, case_id, verdict, score, latency_ms, failure_reason, recorded_at
           FROM evaluation_runs WHERE evaluation_id = :id ORDER BY run_id""",
        id=evaluation_id,
    )
    return [
        RunResult(
            run_id=r["run_id"],
            case_id=r["case_id"],
            verdict=Verdict(r["verdict"]),
            score=r["score"],
            latency_ms=r["latency_ms"],
            failure_reason=r["failure_reason"],
            recorded_at=r["recorded_at"],
        )
        for r in rows
    ]


# --- jobs ----------------------------------------------------------------------------


async def job_counts_unfinished(conn: Conn) -> list[tuple[str, str, int]]:
    """(kind, status, count) of the jobs not completed (the index on status)."""
    rows = await _all(
        conn,
        """SELECT kind, status, count(*) AS n FROM intelligence_jobs
           WHERE status IN ('queued', 'generating', 'failed') GROUP BY kind, status""",
    )
    return [(r["kind"], r["status"], int(r["n"])) for r in rows]


async def job_get(conn: Conn, kind: JobKind, evaluation_id: str) -> Job | None:
    row = await _one(
        conn,
        f"SELECT {_JOB_COLUMNS} FROM intelligence_jobs WHERE kind = :kind AND evaluation_id = :id",
        kind=kind.value,
        id=evaluation_id,
    )
    return _job(row) if row else None


async def job_ensure_queued(
    conn: Conn, kind: JobKind, evaluation_id: str, now: datetime, *, requeue_failed: bool = False
) -> tuple[Job | None, bool]:
    """Create the job row as queued (or re-queue a failed one when asked).

    Returns the row as it now is (``None`` for an unknown evaluation) and whether this
    call created or re-queued it. The row's heartbeat is the caller's: it claims the row
    right away, and recovery leaves it alone meanwhile.
    """
    if requeue_failed:
        TRANSITIONS.check(REQUEUE_FROM, JobStatus.QUEUED)
    requeue = ", ".join(f"'{s.value}'" for s in REQUEUE_FROM) if requeue_failed else "NULL"
    row = await _one(
        conn,
        f"""INSERT INTO intelligence_jobs AS j (kind, evaluation_id, status, heartbeat_at, created_at, updated_at)
            SELECT :kind, evaluation_id, 'queued', :now, :now, :now FROM evaluations WHERE evaluation_id = :id
            ON CONFLICT (kind, evaluation_id) DO UPDATE
              SET status = 'queued', error = NULL, claim_token = NULL, claimed_at = NULL, result = NULL,
                  recovery_attempts = 0, started_at = NULL, finished_at = NULL, heartbeat_at = :now,
                  updated_at = :now
              WHERE j.status IN ({requeue})
            RETURNING {_JOB_COLUMNS}""",
        kind=kind.value,
        id=evaluation_id,
        now=now,
    )
    if row is not None:
        return _job(row), True
    return await job_get(conn, kind, evaluation_id), False


async def job_claim_if_queued(
    conn: Conn, kind: JobKind, evaluation_id: str, token: str, now: datetime
) -> bool:
    row = await _one(
        conn,
        """UPDATE intelligence_jobs SET claim_token = :token, claimed_at = :now, heartbeat_at = :now,
               attempts = attempts + 1, updated_at = :now
           WHERE kind = :kind AND evaluation_id = :id AND status = 'queued' AND claim_token IS NULL
           RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        now=now,
    )
    return row is not None


async def job_set_generating_if_claimed(
    conn: Conn, kind: JobKind, evaluation_id: str, token: str, fields: dict[str, Any], now: datetime
) -> bool:
    TRANSITIONS.check(JobStatus.QUEUED, JobStatus.GENERATING)
    set_sql, params = _set_fields(fields)
    row = await _one(
        conn,
        f"""UPDATE intelligence_jobs SET status = 'generating', started_at = :now, updated_at = :now {set_sql}
            WHERE kind = :kind AND evaluation_id = :id AND status = 'queued' AND claim_token = :token
            RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        now=now,
        **params,
    )
    return row is not None


async def job_complete_if_generating(
    conn: Conn,
    kind: JobKind,
    evaluation_id: str,
    token: str,
    result: dict[str, Any],
    fields: dict[str, Any],
    now: datetime,
) -> bool:
    TRANSITIONS.check(JobStatus.GENERATING, JobStatus.COMPLETED)
    set_sql, params = _set_fields(fields)
    row = await _one(
        conn,
        f"""UPDATE intelligence_jobs SET status = 'completed', result = CAST(:result AS jsonb), error = NULL,
                finished_at = :now, updated_at = :now {set_sql}
            WHERE kind = :kind AND evaluation_id = :id AND status = 'generating' AND claim_token = :token
            RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        result=json.dumps(result),
        now=now,
        **params,
    )
    return row is not None


async def job_fail_if_claimed(
    conn: Conn,
    kind: JobKind,
    evaluation_id: str,
    token: str,
    expected: JobStatus,
    error: str,
    fields: dict[str, Any],
    now: datetime,
) -> bool:
    TRANSITIONS.check(expected, JobStatus.FAILED)
    set_sql, params = _set_fields(fields)
    row = await _one(
        conn,
        f"""UPDATE intelligence_jobs SET status = 'failed', error = :error, finished_at = :now,
                updated_at = :now {set_sql}
            WHERE kind = :kind AND evaluation_id = :id AND status = :expected AND claim_token = :token
            RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        expected=expected.value,
        error=error,
        now=now,
        **params,
    )
    return row is not None


async def job_requeue_if_generating(
    conn: Conn, kind: JobKind, evaluation_id: str, token: str, now: datetime
) -> bool:
    """Hand a row back (its worker is stopping): nobody's (no heartbeat), so the next
    recovery of any replica picks it up."""
    TRANSITIONS.check(JobStatus.GENERATING, JobStatus.QUEUED)
    row = await _one(
        conn,
        """UPDATE intelligence_jobs SET status = 'queued', claim_token = NULL, claimed_at = NULL,
               heartbeat_at = NULL, started_at = NULL, updated_at = :now
           WHERE kind = :kind AND evaluation_id = :id AND status = 'generating' AND claim_token = :token
           RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        now=now,
    )
    return row is not None


async def job_heartbeat_if_claimed(
    conn: Conn, kind: JobKind, evaluation_id: str, token: str, now: datetime
) -> bool:
    """Extend the claim ``token`` holds (no status change); ``False``: the claim is gone."""
    row = await _one(
        conn,
        """UPDATE intelligence_jobs SET heartbeat_at = :now
           WHERE kind = :kind AND evaluation_id = :id AND claim_token = :token
             AND status IN ('queued', 'generating')
           RETURNING evaluation_id""",
        kind=kind.value,
        id=evaluation_id,
        token=token,
        now=now,
    )
    return row is not None


async def jobs_needing_recovery(
    conn: Conn, unclaimed_before: datetime, claimed_before: datetime, limit: int
) -> list[Job]:
    """Abandoned rows: unclaimed queued rows with no heartbeat (handed back) or none since
    ``unclaimed_before``; claimed rows (queued or generating) whose owner has not extended
    the claim since ``claimed_before``."""
    rows = await _all(
        conn,
        f"""SELECT {_JOB_COLUMNS} FROM intelligence_jobs
            WHERE (status = 'queued' AND claim_token IS NULL
                   AND (heartbeat_at IS NULL OR heartbeat_at <= :unclaimed_before))
               OR (status IN ('queued', 'generating') AND claim_token IS NOT NULL
                   AND (heartbeat_at IS NULL OR heartbeat_at <= :claimed_before))
            ORDER BY updated_at, evaluation_id, kind LIMIT :limit""",
        unclaimed_before=unclaimed_before,
        claimed_before=claimed_before,
        limit=limit,
    )
    return [_job(r) for r in rows]


# Nothing happened since ``job`` was read: no claim, no settlement, no heartbeat.
_UNCHANGED = """kind = :kind AND evaluation_id = :id AND status = :status
    AND claim_token IS NOT DISTINCT FROM :token AND recovery_attempts = :recovery_attempts
    AND heartbeat_at IS NOT DISTINCT FROM :heartbeat_at"""


def _unchanged_params(job: Job) -> dict[str, Any]:
    return {
        "kind": job.kind.value,
        "id": job.evaluation_id,
        "status": job.status.value,
        "token": job.claim_token,
        "recovery_attempts": job.recovery_attempts,
        "heartbeat_at": job.heartbeat_at,
    }


async def job_requeue_if_unchanged(conn: Conn, job: Job, now: datetime) -> bool:
    TRANSITIONS.check(job.status, JobStatus.QUEUED)
    row = await _one(
        conn,
        f"""UPDATE intelligence_jobs SET status = 'queued', claim_token = NULL, claimed_at = NULL,
                started_at = NULL, recovery_attempts = recovery_attempts + 1, heartbeat_at = :now,
                updated_at = :now
            WHERE {_UNCHANGED} RETURNING evaluation_id""",
        now=now,
        **_unchanged_params(job),
    )
    return row is not None


async def job_fail_if_unchanged(conn: Conn, job: Job, error: str, now: datetime) -> bool:
    TRANSITIONS.check(job.status, JobStatus.FAILED)
    row = await _one(
        conn,
        f"""UPDATE intelligence_jobs SET status = 'failed', error = :error, claim_token = NULL,
                finished_at = :now, updated_at = :now
            WHERE {_UNCHANGED} RETURNING evaluation_id""",
        error=error,
        now=now,
        **_unchanged_params(job),
    )
    return row is not None


async def jobs_list(
    conn: Conn,
    *,
    evaluation_id: str | None,
    kind: JobKind | None,
    status: JobStatus | None,
    after: tuple[datetime, str, str] | None,
    limit: int,
) -> list[Job]:
    rows = await _all(
        conn,
        f"""SELECT {_JOB_COLUMNS} FROM intelligence_jobs
            WHERE (CAST(:evaluation_id AS text) IS NULL OR evaluation_id = :evaluation_id)
              AND (CAST(:kind AS text) IS NULL OR kind = :kind)
              AND (CAST(:status AS text) IS NULL OR status = :status)
              AND (CAST(:after_at AS timestamptz) IS NULL
                   OR (created_at, evaluation_id, kind) > (:after_at, :after_evaluation, :after_kind))
            ORDER BY created_at, evaluation_id, kind LIMIT :limit""",
        evaluation_id=evaluation_id,
        kind=kind.value if kind else None,
        status=status.value if status else None,
        after_at=after[0] if after else None,
        after_evaluation=after[1] if after else None,
        after_kind=after[2] if after else None,
        limit=limit,
    )
    return [_job(r) for r in rows]
