"""gRPC servicer: converts at the edge, calls the feed / jobs / read model, raises domain errors."""

from __future__ import annotations

from datetime import datetime

import grpc
from dispo.intelligence import convert, store
from dispo.intelligence.evaluation_read_model import load_analysis_view, load_comparison_view
from dispo.intelligence.evaluations import MAX_RUNS_PER_CALL, new_evaluation, new_run_result
from dispo.intelligence.feed import EvaluationFeed
from dispo.intelligence.job_rules import JobKind, JobValidationError
from dispo.intelligence.runtime import IntelligenceJobs
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as pb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc as pb_grpc
from dispo.libs.db.driver import Database
from dispo.libs.errors import FieldViolation, InvalidArgument, ResourceExhausted
from dispo.libs.evaluation import MAX_ID_CHARS
from dispo.libs.paging import (
    decode_page_token,
    encode_page_token,
    page_size,
    page_size_violation,
)
from dispo.libs.timestamps import from_timestamp

MAX_PAGE_SIZE = 500


def _evaluation_id(value: str, field: str = "evaluation_id") -> str:
    if not value.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgument(field, f"must be at most {MAX_ID_CHARS} characters")
    return value


class IntelligenceServicer(pb_grpc.IntelligenceServiceServicer):
    def __init__(self, feed: EvaluationFeed, jobs: IntelligenceJobs, db: Database) -> None:
        self.feed = feed
        self.jobs = jobs
        self.db = db

    async def CreateEvaluation(
        self, request: pb.CreateEvaluationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Evaluation:
        evaluation = new_evaluation(
            request.evaluation_id,
            request.series,
            convert.line_name(request.line),
            request.period,
            request.configuration_json,
            request.analysis_model,
        )
        self.feed.require_registered_model(evaluation.analysis_model)
        stored, _ = await self.feed.create(evaluation)
        return convert.evaluation_to_pb(stored)

    async def RecordRunResults(
        self, request: pb.RecordRunResultsRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordRunResultsResponse:
        evaluation_id = _evaluation_id(request.evaluation_id)
        if not request.runs:
            raise InvalidArgument("runs", "must contain at least one run")
        if len(request.runs) > MAX_RUNS_PER_CALL:
            raise ResourceExhausted(f"at most {MAX_RUNS_PER_CALL} runs per call", "runs")
        runs, violations = [], []
        for i, run in enumerate(request.runs):
            try:
                runs.append(
                    new_run_result(
                        run.run_id,
                        run.case_id,
                        convert.verdict_name(run.verdict),
                        run.score,
                        run.latency_ms,
                        run.failure_reason,
                        from_timestamp(run.recorded_at, run.HasField("recorded_at")),
                        field_prefix=f"runs[{i}].",
                    )
                )
            except InvalidArgument as error:
                violations += error.violations
        if violations:
            raise InvalidArgument(violations=violations)
        recorded, duplicates = await self.feed.record_runs(evaluation_id, runs)
        return pb.RecordRunResultsResponse(recorded=recorded, duplicates=duplicates)

    async def CompleteEvaluation(
        self, request: pb.CompleteEvaluationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Evaluation:
        evaluation_id = _evaluation_id(request.evaluation_id)
        status = convert.EVALUATION_STATUS_FROM_PB.get(request.status)
        if status is None or status.value == "running":
            raise InvalidArgument(
                "status", "must be EVALUATION_STATUS_COMPLETED, _FAILED or _CANCELLED"
            )
        return convert.evaluation_to_pb(await self.feed.complete(evaluation_id, status))

    async def GetEvaluation(
        self, request: pb.GetEvaluationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Evaluation:
        return convert.evaluation_to_pb(await self.feed.get(_evaluation_id(request.evaluation_id)))

    async def AssignAnalysisModel(
        self, request: pb.AssignAnalysisModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.Evaluation:
        evaluation = await self.feed.assign_analysis_model(
            _evaluation_id(request.evaluation_id), request.analysis_model
        )
        return convert.evaluation_to_pb(evaluation)

    async def ListAnalysisModels(
        self, request: pb.ListAnalysisModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAnalysisModelsResponse:
        models = self.feed.models
        return pb.ListAnalysisModelsResponse(
            models=[
                pb.AnalysisModelInfo(
                    name=name,
                    kind=convert.analysis_model_kind(model.kind),
                    is_default=name == models.default,
                )
                for name in models.names()
                if (model := models.get(name)) is not None
            ]
        )

    async def _trigger(self, kind: JobKind, request: pb.TriggerJobRequest) -> pb.TriggerJobResponse:
        evaluation_id = _evaluation_id(request.evaluation_id)
        try:
            job, started = await self.jobs.trigger(kind, evaluation_id)
        except JobValidationError as error:
            raise convert.validation_to_domain(error) from None
        return pb.TriggerJobResponse(job=convert.job_to_pb(job), started=started)

    async def TriggerAnalysis(
        self, request: pb.TriggerJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.TriggerJobResponse:
        return await self._trigger(JobKind.ANALYSIS, request)

    async def TriggerComparison(
        self, request: pb.TriggerJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.TriggerJobResponse:
        return await self._trigger(JobKind.COMPARISON, request)

    async def GetAnalysis(
        self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.Analysis:
        return convert.analysis_to_pb(
            await load_analysis_view(self.db, _evaluation_id(request.evaluation_id))
        )

    async def GetComparison(
        self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.Comparison:
        return convert.comparison_to_pb(
            await load_comparison_view(self.db, _evaluation_id(request.evaluation_id))
        )

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListJobsResponse:
        violations = []
        if request.kind and request.kind not in convert.JOB_KIND_FROM_PB:
            violations.append(FieldViolation("kind", "unknown job kind"))
        if request.status and request.status not in convert.JOB_STATUS_FROM_PB:
            violations.append(FieldViolation("status", "unknown job status"))
        if (bad_size := page_size_violation(request.page)) is not None:
            violations.append(bad_size)
        if violations:
            raise InvalidArgument(violations=violations)
        size = page_size(request.page, maximum=MAX_PAGE_SIZE)
        after = decode_page_token(request.page.page_token, datetime, str, str)
        async with self.db.connection() as conn:
            jobs = await store.jobs_list(
                conn,
                evaluation_id=request.evaluation_id or None,
                kind=convert.JOB_KIND_FROM_PB.get(request.kind),
                status=convert.JOB_STATUS_FROM_PB.get(request.status),
                after=after,
                limit=size + 1,
            )
        token = ""
        if len(jobs) > size:
            jobs = jobs[:size]
            last = jobs[-1]
            assert last.created_at is not None
            token = encode_page_token(last.created_at, last.evaluation_id, last.kind.value)
        return pb.ListJobsResponse(
            jobs=[convert.job_to_pb(j) for j in jobs],
            page=common_pb2.PageResponse(next_page_token=token),
        )
