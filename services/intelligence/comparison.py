"""Period comparison: fingerprint, baseline, mechanical diff, validation, narrative.

Domain work only. The ``GetComparison`` projection lives in ``evaluation_read_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispo.intelligence import store
from dispo.intelligence.analysis import evaluation_not_found, require_finished, resolve_model
from dispo.intelligence.analysis_models import AnalysisModel, ModelRegistry
from dispo.intelligence.evaluations import Evaluation, EvaluationRecordStatus
from dispo.intelligence.job_rules import Job, JobKind, JobValidationError, WorkResult
from dispo.intelligence.job_settlement import JobAdapter, JobDeps, JobPlan
from dispo.intelligence.stats import COMPARED_METRICS, compute_stats, metric_value
from dispo.libs.evaluation import NO_BASELINE


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move and still be unchanged: the larger of ``absolute`` (in the
    metric's unit) and ``relative`` (a share of the baseline's value)."""

    absolute: float
    relative: float = 0.0

    def holds(self, baseline: float, delta: float) -> bool:
        return abs(delta) <= max(self.absolute, self.relative * abs(baseline)) + 1e-9


# Noise is no regression: a rate or a score (0..1) must move by more than a point, a latency
# by more than 5 ms and 5 % of the baseline's, to be improved or regressed.
RATE_TOLERANCE = Tolerance(0.01)
LATENCY_TOLERANCE = Tolerance(5.0, relative=0.05)
TOLERANCES: dict[str, Tolerance] = {
    metric: LATENCY_TOLERANCE if metric.startswith("latency.") else RATE_TOLERANCE
    for metric in COMPARED_METRICS
}


def metric_delta(
    metric: str, baseline: float, current: float, higher_is_better: bool
) -> dict[str, Any]:
    delta = current - baseline
    if TOLERANCES.get(metric, Tolerance(0.0)).holds(baseline, delta):
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
    evaluation: Evaluation | None,
    evaluation_id: str,
    baseline: Evaluation | None,
    models: ModelRegistry,
) -> AnalysisModel:
    """Evaluation finished -> model resolvable -> a baseline period exists -> both have runs."""
    if evaluation is None:
        raise evaluation_not_found(evaluation_id)
    require_finished(evaluation, "period comparison")
    model = resolve_model(evaluation, models)
    fingerprint = evaluation.fingerprint
    if baseline is None:
        raise JobValidationError(
            f"{NO_BASELINE} {evaluation_id!r}: series {evaluation.series!r} ({evaluation.line.value} line) "
            f"has no completed period before {evaluation.period!r} with configuration fingerprint {fingerprint}",
            fields={"fingerprint": fingerprint, "analysis_model": model.name},
        )
    fields = {
        "fingerprint": fingerprint,
        "baseline_evaluation_id": baseline.evaluation_id,
        "analysis_model": model.name,
    }
    for side in (evaluation, baseline):
        if side.run_count == 0:
            raise JobValidationError(
                f"cannot compare: evaluation {side.evaluation_id!r} has no run results",
                fields=fields,
            )
    return model


async def load_and_validate(
    deps: JobDeps, evaluation_id: str
) -> tuple[Evaluation, Evaluation, AnalysisModel]:
    async with deps.db.connection() as conn:
        evaluation = await store.evaluation_get(conn, evaluation_id)
        baseline = None
        if evaluation is not None:
            baseline = await store.evaluation_find_baseline(conn, evaluation)
    model = validate_comparison_request(evaluation, evaluation_id, baseline, deps.models)
    assert evaluation is not None and baseline is not None
    return evaluation, baseline, model


# --- adapters ---------------------------------------------------------------------------


async def ensure_queued(deps: JobDeps, evaluation_id: str) -> tuple[Job | None, bool]:
    """Create the row as queued; an existing row comes back as it is (only a trigger re-queues a failed one)."""
    async with deps.db.connection() as conn:
        return await store.job_ensure_queued(
            conn, JobKind.COMPARISON, evaluation_id, deps.clock.now()
        )


async def validate(deps: JobDeps, evaluation_id: str) -> JobPlan:
    evaluation, baseline, model = await load_and_validate(deps, evaluation_id)
    return JobPlan(
        {"model": model.name, "baseline_evaluation_id": baseline.evaluation_id},
        {
            "fingerprint": evaluation.fingerprint,
            "baseline_evaluation_id": baseline.evaluation_id,
            "analysis_model": model.name,
        },
    )


async def work_fn(deps: JobDeps, evaluation_id: str, plan: JobPlan) -> WorkResult:
    async with deps.db.connection() as conn:
        evaluation = await store.evaluation_get(conn, evaluation_id)
        baseline = await store.evaluation_get(conn, plan.data["baseline_evaluation_id"])
        model = deps.models.get(plan.data["model"])
        if evaluation is None or baseline is None or model is None:
            raise RuntimeError("evaluation, baseline or model disappeared after validation")
        if baseline.status != EvaluationRecordStatus.COMPLETED:
            raise RuntimeError(f"baseline {baseline.evaluation_id!r} is no longer completed")
        current_runs = await store.runs_of(conn, evaluation_id)
        baseline_runs = await store.runs_of(conn, baseline.evaluation_id)
    current_stats = compute_stats(current_runs)
    baseline_stats = compute_stats(baseline_runs)
    comparison = {
        "evaluation_id": evaluation_id,
        "period": evaluation.period,
        "baseline_evaluation_id": baseline.evaluation_id,
        "baseline_period": baseline.period,
        "fingerprint": evaluation.fingerprint,
        "deltas": diff_stats(baseline_stats, current_stats),
    }
    narrative = await model.narrate_comparison(comparison)
    return WorkResult(
        {**comparison, "narrative": narrative, "model": model.name},
        {
            "fingerprint": evaluation.fingerprint,
            "baseline_evaluation_id": baseline.evaluation_id,
            "analysis_model": model.name,
        },
    )


COMPARISON = JobAdapter(JobKind.COMPARISON, ensure_queued, validate, work_fn)
