"""Projections served to readers: what ``GetAnalysis`` and ``GetComparison`` return.

Built here from the job rows and the campaign read model, not by the analysis or
comparison modules (they only do the work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispo.intelligence.jobs import Job, JobKind, JobStatus
from dispo.intelligence.repository import IntelligenceRepository
from dispo.libs.errors import NotFound


@dataclass(frozen=True)
class AnalysisView:
    job: Job
    stats: dict[str, Any] | None
    narrative: str


@dataclass(frozen=True)
class ComparisonView:
    job: Job
    campaign_id: str
    period: str
    baseline_campaign_id: str
    baseline_period: str
    fingerprint: str
    deltas: list[dict[str, Any]]
    narrative: str


async def _job(repo: IntelligenceRepository, kind: JobKind, campaign_id: str) -> Job:
    job = await repo.job_get(kind, campaign_id)
    if job is None:
        raise NotFound(f"no {kind.value} job for campaign {campaign_id!r}")
    return job


async def load_analysis_view(repo: IntelligenceRepository, campaign_id: str) -> AnalysisView:
    job = await _job(repo, JobKind.ANALYSIS, campaign_id)
    result = job.result if job.status == JobStatus.COMPLETED and job.result else {}
    return AnalysisView(job=job, stats=result.get("stats"), narrative=result.get("narrative", ""))


async def load_comparison_view(repo: IntelligenceRepository, campaign_id: str) -> ComparisonView:
    job = await _job(repo, JobKind.COMPARISON, campaign_id)
    result = job.result if job.status == JobStatus.COMPLETED and job.result else {}
    campaign = await repo.campaign_get(campaign_id)
    baseline_id = result.get("baseline_campaign_id") or job.baseline_campaign_id or ""
    baseline = await repo.campaign_get(baseline_id) if baseline_id else None
    return ComparisonView(
        job=job,
        campaign_id=campaign_id,
        period=campaign.period if campaign else "",
        baseline_campaign_id=baseline_id,
        baseline_period=baseline.period if baseline else "",
        fingerprint=result.get("fingerprint")
        or job.fingerprint
        or (campaign.fingerprint if campaign else ""),
        deltas=list(result.get("deltas", [])),
        narrative=result.get("narrative", ""),
    )
