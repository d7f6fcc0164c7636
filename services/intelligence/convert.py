"""Proto <-> domain conversion, at the edge only."""

from __future__ import annotations

import json
from typing import Any

from dispo.intelligence.evaluation_read_model import AnalysisView, ComparisonView
from dispo.intelligence.evaluations import Evaluation, EvaluationRecordStatus
from dispo.intelligence.job_rules import Job, JobKind, JobStatus, JobValidationError, ValidationKind
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as pb
from dispo.libs.errors import DomainError, FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.evaluation import LINE_FROM_PB, LINE_TO_PB, VERDICT_FROM_PB
from dispo.libs.proto_enums import from_short_name
from dispo.libs.timestamps import to_timestamp

EVALUATION_STATUS_TO_PB = {
    EvaluationRecordStatus.RUNNING: pb.EVALUATION_STATUS_RUNNING,
    EvaluationRecordStatus.COMPLETED: pb.EVALUATION_STATUS_COMPLETED,
    EvaluationRecordStatus.FAILED: pb.EVALUATION_STATUS_FAILED,
    EvaluationRecordStatus.CANCELLED: pb.EVALUATION_STATUS_CANCELLED,
}
EVALUATION_STATUS_FROM_PB = {v: k for k, v in EVALUATION_STATUS_TO_PB.items()}
JOB_KIND_TO_PB = {
    JobKind.ANALYSIS: pb.JOB_KIND_ANALYSIS,
    JobKind.COMPARISON: pb.JOB_KIND_COMPARISON,
}
JOB_KIND_FROM_PB = {v: k for k, v in JOB_KIND_TO_PB.items()}
JOB_STATUS_TO_PB = {
    JobStatus.QUEUED: pb.JOB_STATUS_QUEUED,
    JobStatus.GENERATING: pb.JOB_STATUS_GENERATING,
    JobStatus.COMPLETED: pb.JOB_STATUS_COMPLETED,
    JobStatus.FAILED: pb.JOB_STATUS_FAILED,
}
JOB_STATUS_FROM_PB = {v: k for k, v in JOB_STATUS_TO_PB.items()}
DIRECTION_TO_PB = {
    "improved": pb.DIRECTION_IMPROVED,
    "regressed": pb.DIRECTION_REGRESSED,
    "unchanged": pb.DIRECTION_UNCHANGED,
}


def evaluation_to_pb(evaluation: Evaluation) -> pb.Evaluation:
    return pb.Evaluation(
        evaluation_id=evaluation.evaluation_id,
        series=evaluation.series,
        line=LINE_TO_PB[evaluation.line],
        status=EVALUATION_STATUS_TO_PB[evaluation.status],
        period=evaluation.period,
        configuration_json=json.dumps(evaluation.configuration, sort_keys=True),
        analysis_model=evaluation.analysis_model or "",
        run_count=evaluation.run_count,
        created_at=to_timestamp(evaluation.created_at),
        completed_at=to_timestamp(evaluation.completed_at),
        fingerprint=evaluation.fingerprint,
    )


def job_to_pb(job: Job) -> pb.Job:
    return pb.Job(
        kind=JOB_KIND_TO_PB[job.kind],
        evaluation_id=job.evaluation_id,
        status=JOB_STATUS_TO_PB[job.status],
        error=job.error or "",
        attempts=job.attempts,
        recovery_attempts=job.recovery_attempts,
        analysis_model=job.analysis_model or "",
        baseline_evaluation_id=job.baseline_evaluation_id or "",
        fingerprint=job.fingerprint or "",
        created_at=to_timestamp(job.created_at),
        updated_at=to_timestamp(job.updated_at),
        started_at=to_timestamp(job.started_at),
        finished_at=to_timestamp(job.finished_at),
    )


def stats_to_pb(stats: dict[str, Any]) -> pb.AnalysisStats:
    return pb.AnalysisStats(
        run_count=stats["run_count"],
        case_count=stats["case_count"],
        pass_rate=stats["pass_rate"],
        fail_rate=stats["fail_rate"],
        error_rate=stats["error_rate"],
        score=pb.ScoreDistribution(**stats["score"]),
        latency=pb.LatencyPercentiles(**stats["latency"]),
        failure_clusters=[pb.FailureCluster(**c) for c in stats["failure_clusters"]],
        worst_cases=[pb.WorstCase(**c) for c in stats["worst_cases"]],
    )


def analysis_to_pb(view: AnalysisView) -> pb.Analysis:
    return pb.Analysis(
        job=job_to_pb(view.job),
        stats=stats_to_pb(view.stats) if view.stats else None,
        narrative=view.narrative,
    )


def delta_to_pb(delta: dict[str, Any]) -> pb.MetricDelta:
    message = pb.MetricDelta(
        metric=delta["metric"],
        baseline=delta["baseline"],
        current=delta["current"],
        absolute_delta=delta["absolute_delta"],
        direction=DIRECTION_TO_PB[delta["direction"]],
    )
    if delta["relative_delta"] is not None:
        message.relative_delta = delta["relative_delta"]
    return message


def comparison_to_pb(view: ComparisonView) -> pb.Comparison:
    return pb.Comparison(
        job=job_to_pb(view.job),
        evaluation_id=view.evaluation_id,
        period=view.period,
        baseline_evaluation_id=view.baseline_evaluation_id,
        baseline_period=view.baseline_period,
        fingerprint=view.fingerprint,
        deltas=[delta_to_pb(d) for d in view.deltas],
        narrative=view.narrative,
    )


def analysis_model_kind(kind: str) -> pb.AnalysisModelKind.ValueType:
    """The proto kind of a model's ``kind`` (``builtin``, ``chat-completions``)."""
    return from_short_name(pb.AnalysisModelKind, kind.upper().replace("-", "_"))


def line_name(line: common_pb2.Line.ValueType) -> str:
    """The domain value of a proto line; "" (refused by validation) when not one."""
    return LINE_FROM_PB[line].value if line in LINE_FROM_PB else ""


def verdict_name(verdict: common_pb2.Verdict.ValueType) -> str:
    """The domain value of a proto verdict; "" (refused by validation) when not one."""
    return VERDICT_FROM_PB[verdict].value if verdict in VERDICT_FROM_PB else ""


def validation_to_domain(error: JobValidationError) -> DomainError:
    """The caller sees exactly the wording ``execute`` records on a failed row."""
    if error.kind == ValidationKind.NOT_FOUND:
        return NotFound(error.message)
    if error.kind == ValidationKind.INVALID_ARGUMENT:
        return InvalidArgument(error.field, error.message)
    return FailedPrecondition(error.message)
