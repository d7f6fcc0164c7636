"""Projections served to readers: what ``GetAnalysis`` and ``GetComparison`` return.

Built here from the job rows and the evaluation read model, not by the analysis or
comparison modules (they only do the work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispo.intelligence import store
from dispo.intelligence.job_rules import Job, JobKind, JobStatus
from dispo.libs.db.driver import Conn, Database
from dispo.libs.errors import NotFound


@dataclass(frozen=True)
class AnalysisView:
    job: Job
    stats: dict[str, Any] | None
    narrative: str


@dataclass(frozen=True)
class ComparisonView:
    job: Job
    evaluation_id: str
    period: str
    baseline_evaluation_id: str
    baseline_period: str
    fingerprint: str
    deltas: list[dict[str, Any]]
    narrative: str


async def _job(conn: Conn, kind: JobKind, evaluation_id: str) -> Job:
    job = await store.job_get(conn, kind, evaluation_id)
    if job is None:
        raise NotFound(f"no {kind.value} job for evaluation {evaluation_id!r}")
    return job


async def load_analysis_view(db: Database, evaluation_id: str) -> AnalysisView:
    async with db.connection() as conn:
        job = await _job(conn, JobKind.ANALYSIS, evaluation_id)
    result = job.result if job.status == JobStatus.COMPLETED and job.result else {}
    return AnalysisView(job=job, stats=result.get("stats"), narrative=result.get("narrative", ""))


async def load_comparison_view(db: Database, evaluation_id: str) -> ComparisonView:
    async with db.connection() as conn:
        job = await _job(conn, JobKind.COMPARISON, evaluation_id)
        result = job.result if job.status == JobStatus.COMPLETED and job.result else {}
        evaluation = await store.evaluation_get(conn, evaluation_id)
        baseline_id = result.get("baseline_evaluation_id") or job.baseline_evaluation_id or ""
        baseline = await store.evaluation_get(conn, baseline_id) if baseline_id else None
    return ComparisonView(
        job=job,
        evaluation_id=evaluation_id,
        period=evaluation.period if evaluation else "",
        baseline_evaluation_id=baseline_id,
        baseline_period=baseline.period if baseline else "",
        fingerprint=result.get("fingerprint")
        or job.fingerprint
        or (evaluation.fingerprint if evaluation else ""),
        deltas=list(result.get("deltas", [])),
        narrative=result.get("narrative", ""),
    )
