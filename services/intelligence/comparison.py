"""Period comparison: fingerprint, baseline, mechanical diff, validation, narrative.

Domain work only. The ``GetComparison`` projection lives in ``campaign_read_model``.
"""

from __future__ import annotations

from typing import Any

from dispo.intelligence.analysis import campaign_not_found, require_finished, resolve_model
from dispo.intelligence.campaigns import Campaign, CampaignStatus
from dispo.intelligence.intelligence_jobs import JobAdapter, JobDeps, Plan
from dispo.intelligence.jobs import Job, JobKind, JobValidationError, WorkResult
from dispo.intelligence.models import AnalysisModel, ModelRegistry
from dispo.intelligence.stats import COMPARED_METRICS, compute_stats, metric_value

UNCHANGED_EPSILON = 1e-9


def metric_delta(
    metric: str, baseline: float, current: float, higher_is_better: bool
) -> dict[str, Any]:
    delta = current - baseline
    if abs(delta) <= UNCHANGED_EPSILON:
        direction = "unchanged"
    else:
        direction = "improved" if (delta > 0) == higher_is_better else "regressed"
    return {
        "metric": metric,
        "baseline": baseline,
        "current": current,
        "absolute_delta": round(delta, 9),
        "relative_delta": round(delta / abs(baseline), 9) if baseline else None,
        "direction": direction,
    }


def diff_stats(baseline: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """Every compared metric, baseline against current, with its direction."""
    return [
        metric_delta(metric, metric_value(baseline, metric), metric_value(current, metric), higher)
        for metric, higher in COMPARED_METRICS.items()
    ]


def validate_comparison_request(
    campaign: Campaign | None, campaign_id: str, baseline: Campaign | None, models: ModelRegistry
) -> AnalysisModel:
    """Campaign finished -> model resolvable -> a baseline period exists -> both have runs."""
    if campaign is None:
        raise campaign_not_found(campaign_id)
    require_finished(campaign, "period comparison")
    model = resolve_model(campaign, models)
    fingerprint = campaign.fingerprint
    if baseline is None:
        raise JobValidationError(
            f"no baseline for campaign {campaign_id!r}: series {campaign.series!r} ({campaign.line.value} line) "
            f"has no completed period before {campaign.period!r} with configuration fingerprint {fingerprint}",
            fields={"fingerprint": fingerprint, "analysis_model": model.name},
        )
    fields = {
        "fingerprint": fingerprint,
        "baseline_campaign_id": baseline.campaign_id,
        "analysis_model": model.name,
    }
    for side in (campaign, baseline):
        if side.run_count == 0:
            raise JobValidationError(
                f"cannot compare: campaign {side.campaign_id!r} has no run results", fields=fields
            )
    return model


async def load_and_validate(
    deps: JobDeps, campaign_id: str
) -> tuple[Campaign, Campaign, AnalysisModel]:
    campaign = await deps.repo.campaign_get(campaign_id)
    baseline = None
    if campaign is not None:
        baseline = await deps.repo.campaign_find_baseline(campaign)
    model = validate_comparison_request(campaign, campaign_id, baseline, deps.models)
    assert campaign is not None and baseline is not None
    return campaign, baseline, model


# --- adapters ---------------------------------------------------------------------------


async def ensure_queued(deps: JobDeps, campaign_id: str) -> tuple[Job | None, bool]:
    """Create the row as queued; an existing row comes back as it is (only a trigger re-queues a failed one)."""
    return await deps.repo.job_ensure_queued(JobKind.COMPARISON, campaign_id, deps.clock.now())


async def validate(deps: JobDeps, campaign_id: str) -> Plan:
    campaign, baseline, model = await load_and_validate(deps, campaign_id)
    return Plan(
        {"model": model.name, "baseline_campaign_id": baseline.campaign_id},
        {
            "fingerprint": campaign.fingerprint,
            "baseline_campaign_id": baseline.campaign_id,
            "analysis_model": model.name,
        },
    )


async def work_fn(deps: JobDeps, campaign_id: str, plan: Plan) -> WorkResult:
    campaign = await deps.repo.campaign_get(campaign_id)
    baseline = await deps.repo.campaign_get(plan.data["baseline_campaign_id"])
    model = deps.models.get(plan.data["model"])
    if campaign is None or baseline is None or model is None:
        raise RuntimeError("campaign, baseline or model disappeared after validation")
    if baseline.status != CampaignStatus.COMPLETED:
        raise RuntimeError(f"baseline {baseline.campaign_id!r} is no longer completed")
    current_stats = compute_stats(await deps.repo.runs_of(campaign_id))
    baseline_stats = compute_stats(await deps.repo.runs_of(baseline.campaign_id))
    comparison = {
        "campaign_id": campaign_id,
        "period": campaign.period,
        "baseline_campaign_id": baseline.campaign_id,
        "baseline_period": baseline.period,
        "fingerprint": campaign.fingerprint,
        "deltas": diff_stats(baseline_stats, current_stats),
    }
    narrative = await model.narrate_comparison(comparison)
    return WorkResult(
        {**comparison, "narrative": narrative, "model": model.name},
        {
            "fingerprint": campaign.fingerprint,
            "baseline_campaign_id": baseline.campaign_id,
            "analysis_model": model.name,
        },
    )


COMPARISON = JobAdapter(JobKind.COMPARISON, ensure_queued, validate, work_fn)
