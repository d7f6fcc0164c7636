"""Analysis of one campaign: its shared validation entry and its three settlement adapters."""

from __future__ import annotations

from typing import Any

from dispo.intelligence.campaigns import Campaign
from dispo.intelligence.intelligence_jobs import JobAdapter, JobDeps, Plan
from dispo.intelligence.jobs import Job, JobKind, JobValidationError, ValidationKind, WorkResult
from dispo.intelligence.models import AnalysisModel, ModelRegistry
from dispo.intelligence.stats import compute_stats

MODEL_HINT = (
    "; configure a default analysis model (DISPO_INTELLIGENCE_DEFAULT_ANALYSIS_MODEL) "
    "or assign an analysis model to the campaign (AssignAnalysisModel)"
)


def campaign_not_found(campaign_id: str) -> JobValidationError:
    return JobValidationError(f"campaign {campaign_id!r} not found", ValidationKind.NOT_FOUND)


def require_finished(campaign: Campaign, job: str) -> None:
    if not campaign.is_terminal:
        raise JobValidationError(
            f"campaign {campaign.campaign_id!r} is {campaign.status.value}; {job} needs a finished "
            "campaign (completed, failed or cancelled)"
        )


def resolve_model(campaign: Campaign, models: ModelRegistry) -> AnalysisModel:
    resolution = models.resolve(campaign.analysis_model)
    if resolution.model is None:
        raise JobValidationError(
            f"{resolution.problem}{MODEL_HINT}", fields={"analysis_model": resolution.requested}
        )
    return resolution.model


def validate_analysis_request(
    campaign: Campaign | None, campaign_id: str, models: ModelRegistry
) -> AnalysisModel:
    """The one check before an analysis runs: campaign finished, then model resolvable.

    The gRPC handler maps the error to a status; ``execute`` records it on the failed row.
    """
    if campaign is None:
        raise campaign_not_found(campaign_id)
    require_finished(campaign, "analysis")
    return resolve_model(campaign, models)


def campaign_summary(campaign: Campaign) -> dict[str, Any]:
    return {
        "campaign_id": campaign.campaign_id,
        "series": campaign.series,
        "line": campaign.line.value,
        "period": campaign.period,
        "status": campaign.status.value,
        "fingerprint": campaign.fingerprint,
    }


# --- adapters ---------------------------------------------------------------------------


async def ensure_queued(deps: JobDeps, campaign_id: str) -> tuple[Job | None, bool]:
    """Create the row as queued; an existing row comes back as it is (only a trigger re-queues a failed one)."""
    return await deps.repo.job_ensure_queued(JobKind.ANALYSIS, campaign_id, deps.clock.now())


async def validate(deps: JobDeps, campaign_id: str) -> Plan:
    campaign = await deps.repo.campaign_get(campaign_id)
    model = validate_analysis_request(campaign, campaign_id, deps.models)
    return Plan({"model": model.name}, {"analysis_model": model.name})


async def work_fn(deps: JobDeps, campaign_id: str, plan: Plan) -> WorkResult:
    campaign = await deps.repo.campaign_get(campaign_id)
    assert campaign is not None  # validated after the claim; campaigns are never deleted
    model = deps.models.get(plan.data["model"])
    if model is None:
        raise RuntimeError(f"analysis model {plan.data['model']!r} disappeared")
    stats = compute_stats(await deps.repo.runs_of(campaign_id))
    narrative = await model.narrate_analysis(campaign_summary(campaign), stats)
    return WorkResult(
        {"model": model.name, "stats": stats, "narrative": narrative},
        {"analysis_model": model.name},
    )


ANALYSIS = JobAdapter(JobKind.ANALYSIS, ensure_queued, validate, work_fn)
