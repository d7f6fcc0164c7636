"""Analysis of one evaluation: its shared validation entry and its three settlement adapters."""

from __future__ import annotations

from typing import Any

from dispo.intelligence import store
from dispo.intelligence.analysis_models import AnalysisModel, ModelRegistry
from dispo.intelligence.evaluations import Evaluation
from dispo.intelligence.job_rules import (
    Job,
    JobKind,
    JobValidationError,
    ValidationKind,
    WorkResult,
)
from dispo.intelligence.job_settlement import JobAdapter, JobDeps, JobPlan
from dispo.intelligence.stats import compute_stats

MODEL_HINT = (
    "; configure a default analysis model (DISPO_INTELLIGENCE_DEFAULT_ANALYSIS_MODEL) "
    "or assign an analysis model to the evaluation (AssignAnalysisModel)"
)


def evaluation_not_found(evaluation_id: str) -> JobValidationError:
    return JobValidationError(f"evaluation {evaluation_id!r} not found", ValidationKind.NOT_FOUND)


def require_finished(evaluation: Evaluation, job: str) -> None:
    if not evaluation.is_terminal:
        raise JobValidationError(
            f"evaluation {evaluation.evaluation_id!r} is {evaluation.status.value}; {job} needs a finished "
            "evaluation (completed, failed or cancelled)"
        )


def resolve_model(evaluation: Evaluation, models: ModelRegistry) -> AnalysisModel:
    resolution = models.resolve(evaluation.analysis_model)
    if resolution.model is None:
        raise JobValidationError(
            f"{resolution.problem}{MODEL_HINT}", fields={"analysis_model": resolution.requested}
        )
    return resolution.model


def validate_analysis_request(
    evaluation: Evaluation | None, evaluation_id: str, models: ModelRegistry
) -> AnalysisModel:
    """The one check before an analysis runs: evaluation finished, then model resolvable.

    The gRPC handler maps the error to a status; ``execute`` records it on the failed row.
    """
    if evaluation is None:
        raise evaluation_not_found(evaluation_id)
    require_finished(evaluation, "analysis")
    return resolve_model(evaluation, models)


def evaluation_summary(evaluation: Evaluation) -> dict[str, Any]:
    return {
        "evaluation_id": evaluation.evaluation_id,
        "series": evaluation.series,
        "line": evaluation.line.value,
        "period": evaluation.period,
        "status": evaluation.status.value,
        "fingerprint": evaluation.fingerprint,
    }


# --- adapters ---------------------------------------------------------------------------


async def ensure_queued(deps: JobDeps, evaluation_id: str) -> tuple[Job | None, bool]:
    """Create the row as queued; an existing row comes back as it is (only a trigger re-queues a failed one)."""
    async with deps.db.connection() as conn:
        return await store.job_ensure_queued(
            conn, JobKind.ANALYSIS, evaluation_id, deps.clock.now()
        )


async def validate(deps: JobDeps, evaluation_id: str) -> JobPlan:
    async with deps.db.connection() as conn:
        evaluation = await store.evaluation_get(conn, evaluation_id)
    model = validate_analysis_request(evaluation, evaluation_id, deps.models)
    return JobPlan({"model": model.name}, {"analysis_model": model.name})


async def work_fn(deps: JobDeps, evaluation_id: str, plan: JobPlan) -> WorkResult:
    async with deps.db.connection() as conn:
        evaluation = await store.evaluation_get(conn, evaluation_id)
        runs = await store.runs_of(conn, evaluation_id)
    assert evaluation is not None  # validated after the claim; evaluations are never deleted
    model = deps.models.get(plan.data["model"])
    if model is None:
        raise RuntimeError(f"analysis model {plan.data['model']!r} disappeared")
    stats = compute_stats(runs)
    narrative = await model.narrate_analysis(evaluation_summary(evaluation), stats)
    return WorkResult(
        {"model": model.name, "stats": stats, "narrative": narrative},
        {"analysis_model": model.name},
    )


ANALYSIS = JobAdapter(JobKind.ANALYSIS, ensure_queued, validate, work_fn)
