"""The gRPC surface: feed, triggers, reads, and precise errors that change nothing."""

from __future__ import annotations

import json

import grpc
import pytest
from dispo.intelligence import analysis, comparison
from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.job_rules import JobKind
from dispo.intelligence.job_settlement import execute
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as pb
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from .conftest import CONFIG, store_of


def run(
    i: int, case: str, verdict: int, score: float, latency: int, reason: str = ""
) -> pb.RunResult:
    return pb.RunResult(
        run_id=f"run-{i}",
        case_id=case,
        verdict=verdict,
        score=score,
        latency_ms=latency,
        failure_reason=reason,
    )


async def feed_evaluation(
    stub,
    evaluation_id: str,
    period: str,
    line=common_pb2.LINE_FORMAL,
    complete=True,
    runs=None,
    analysis_model: str = "",
):
    await stub.CreateEvaluation(
        pb.CreateEvaluationRequest(
            evaluation_id=evaluation_id,
            series="api",
            line=line,
            period=period,
            configuration_json=json.dumps(CONFIG),
            analysis_model=analysis_model,
        )
    )
    runs = (
        runs
        if runs is not None
        else [
            run(0, "c1", common_pb2.VERDICT_PASS, 1, 100),
            run(1, "c2", common_pb2.VERDICT_FAIL, 0, 200, "bad"),
        ]
    )
    for r in runs:
        r.run_id = f"{evaluation_id}-{r.run_id}"
    if runs:
        await stub.RecordRunResults(
            pb.RecordRunResultsRequest(evaluation_id=evaluation_id, runs=runs)
        )
    if complete:
        await stub.CompleteEvaluation(
            pb.CompleteEvaluationRequest(
                evaluation_id=evaluation_id, status=pb.EVALUATION_STATUS_COMPLETED
            )
        )


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(error)
    found = {}
    for detail in status.details if status else []:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            found.update({v.field: v.description for v in bad.field_violations})
    return found


async def test_feed_trigger_and_read_over_grpc(app, serve_app):
    stub = await serve_app(app)
    await feed_evaluation(stub, "g1", "2026-01", line=common_pb2.LINE_TRIAL)

    evaluation = await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="g1"))
    assert (
        evaluation.status == pb.EVALUATION_STATUS_COMPLETED
        and evaluation.run_count == 2
        and evaluation.fingerprint
    )
    reply = await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="g1"))
    assert reply.started and reply.job.status == pb.JOB_STATUS_QUEUED
    await app.jobs.wait_idle()

    result = await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="g1"))
    assert result.job.status == pb.JOB_STATUS_COMPLETED and result.job.analysis_model == "stats"
    assert result.stats.run_count == 2 and result.stats.pass_rate == 0.5
    assert result.stats.failure_clusters[0].signature == "bad"
    assert "Evaluation g1" in result.narrative
    again = await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="g1"))
    assert not again.started and again.job.status == pb.JOB_STATUS_COMPLETED


async def test_comparison_projection_over_grpc(app, serve_app):
    stub = await serve_app(app)
    await feed_evaluation(stub, "k1", "2026-01")
    await feed_evaluation(
        stub, "k2", "2026-02", runs=[run(0, "c1", common_pb2.VERDICT_PASS, 1, 50)]
    )
    await app.jobs.wait_idle()

    comparison = await stub.GetComparison(pb.GetJobRequest(evaluation_id="k2"))

    assert comparison.job.status == pb.JOB_STATUS_COMPLETED
    assert (comparison.baseline_evaluation_id, comparison.baseline_period, comparison.period) == (
        "k1",
        "2026-01",
        "2026-02",
    )
    deltas = {d.metric: d for d in comparison.deltas}
    assert deltas["pass_rate"].direction == pb.DIRECTION_IMPROVED
    assert deltas["pass_rate"].relative_delta == pytest.approx(1.0)
    assert deltas["latency.p50_ms"].direction == pb.DIRECTION_IMPROVED
    failed = await stub.GetComparison(pb.GetJobRequest(evaluation_id="k1"))
    assert failed.job.status == pb.JOB_STATUS_FAILED and failed.job.error.startswith("no baseline")
    assert not failed.deltas


async def test_validation_wording_is_identical_in_the_grpc_error_and_the_failed_row(
    make_app, serve_app
):
    app = make_app(default_analysis_model="")
    stub = await serve_app(app)
    await feed_evaluation(stub, "nm", "2026-01")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="nm"))
    await execute(JobKind.ANALYSIS, "nm", app.jobs.deps, analysis.ANALYSIS)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "nm")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == job.error
    assert "assign an analysis model to the evaluation" in job.error


async def test_running_evaluation_wording_is_identical_too(app, serve_app):
    stub = await serve_app(app)
    await feed_evaluation(stub, "live", "2026-01", complete=False)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.TriggerComparison(pb.TriggerJobRequest(evaluation_id="live"))
    assert (
        await store_of(app).job_get(JobKind.COMPARISON, "live") is None
    )  # refused: nothing changed
    await execute(JobKind.COMPARISON, "live", app.jobs.deps, comparison.COMPARISON)

    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    row = await store_of(app).job_get(JobKind.COMPARISON, "live")
    assert (
        caught.value.details()
        == row.error
        == (
            "evaluation 'live' is running; period comparison needs a finished evaluation (completed, failed or cancelled)"
        )
    )


async def test_bad_input_gets_precise_statuses_and_changes_nothing(app, serve_app):
    stub = await serve_app(app)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(
                evaluation_id="",
                series="s",
                line=common_pb2.LINE_FORMAL,
                period="p",
                configuration_json="[1]",
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(violations(caught.value)) == {"evaluation_id", "configuration_json"}

    # what intelligence could not store: NaN, Infinity, NUL inside the configuration
    for configuration, field in [
        ('{"threshold": NaN}', "configuration_json.threshold"),
        ('{"a": [1, -Infinity]}', "configuration_json.a[1]"),
        ('{"note": "a\\u0000b"}', "configuration_json.note"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateEvaluation(
                pb.CreateEvaluationRequest(
                    evaluation_id="nan",
                    series="s",
                    line=common_pb2.LINE_FORMAL,
                    period="p",
                    configuration_json=configuration,
                )
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert list(violations(caught.value)) == [field]
    # and an id with a trailing newline is not an id
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="nan\n"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(violations(caught.value)) == ["evaluation_id"]

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(evaluation_id="x", series="s", period="p")
        )
    assert set(violations(caught.value)) == {"line"}

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(
                evaluation_id="x",
                series="s",
                line=common_pb2.LINE_FORMAL,
                period="p",
                analysis_model="ghost",
            )
        )
    assert set(violations(caught.value)) == {"analysis_model"}

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="x"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    await feed_evaluation(stub, "b1", "2026-01", complete=False, runs=[])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RecordRunResults(
            pb.RecordRunResultsRequest(
                evaluation_id="b1",
                runs=[
                    run(0, "c1", common_pb2.VERDICT_PASS, 1, 10),
                    run(1, "", common_pb2.VERDICT_UNSPECIFIED, 1, 5),
                ],
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(violations(caught.value)) == {"runs[1].case_id", "runs[1].verdict"}
    # a negative number is refused at the edge, before the servicer's own checks
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RecordRunResults(
            pb.RecordRunResultsRequest(
                evaluation_id="b1", runs=[run(0, "c1", common_pb2.VERDICT_PASS, 1, -5)]
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(caught.value) == {"runs[0].latency_ms": "must not be negative"}
    assert (await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="b1"))).run_count == 0

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RecordRunResults(
            pb.RecordRunResultsRequest(
                evaluation_id="b1",
                runs=[run(i, "c", common_pb2.VERDICT_PASS, 1, 1) for i in range(1001)],
            )
        )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(
                evaluation_id="b1", series="other", line=common_pb2.LINE_FORMAL, period="2026-01"
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert violations(caught.value) == {"series": "differs from the existing one's"}

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CompleteEvaluation(
            pb.CompleteEvaluationRequest(evaluation_id="b1", status=pb.EVALUATION_STATUS_RUNNING)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="nobody"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="b1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListJobs(pb.ListJobsRequest(page=common_pb2.PageRequest(page_token="garbage")))
    assert set(violations(caught.value)) == {"page.page_token"}


async def test_evaluation_feed_is_idempotent_and_completion_is_final(app, serve_app):
    stub = await serve_app(app)
    await feed_evaluation(
        stub, "i1", "2026-01", line=common_pb2.LINE_TRIAL, complete=False, runs=[]
    )
    request = pb.CreateEvaluationRequest(
        evaluation_id="i1",
        series="api",
        line=common_pb2.LINE_TRIAL,
        period="2026-01",
        configuration_json=json.dumps(CONFIG),
    )
    assert (await stub.CreateEvaluation(request)).evaluation_id == "i1"

    runs = [
        run(1, "c1", common_pb2.VERDICT_PASS, 1, 10),
        run(2, "c1", common_pb2.VERDICT_PASS, 1, 10),
    ]
    first = await stub.RecordRunResults(pb.RecordRunResultsRequest(evaluation_id="i1", runs=runs))
    second = await stub.RecordRunResults(pb.RecordRunResultsRequest(evaluation_id="i1", runs=runs))
    assert (first.recorded, first.duplicates, second.recorded, second.duplicates) == (2, 0, 0, 2)

    done = pb.CompleteEvaluationRequest(evaluation_id="i1", status=pb.EVALUATION_STATUS_CANCELLED)
    assert (await stub.CompleteEvaluation(done)).status == pb.EVALUATION_STATUS_CANCELLED
    assert (await stub.CompleteEvaluation(done)).status == pb.EVALUATION_STATUS_CANCELLED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CompleteEvaluation(
            pb.CompleteEvaluationRequest(evaluation_id="i1", status=pb.EVALUATION_STATUS_COMPLETED)
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RecordRunResults(
            pb.RecordRunResultsRequest(
                evaluation_id="i1", runs=[run(3, "c", common_pb2.VERDICT_PASS, 1, 1)]
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # a redelivered batch of runs already stored is still accepted as duplicates
    late = await stub.RecordRunResults(pb.RecordRunResultsRequest(evaluation_id="i1", runs=runs))
    assert (late.recorded, late.duplicates) == (0, 2)


async def test_list_jobs_filters_and_pages(app, serve_app):
    stub = await serve_app(app)
    for i in range(5):
        await feed_evaluation(stub, f"l{i}", f"2026-0{i + 1}")
        await app.jobs.wait_idle()

    everything = await stub.ListJobs(pb.ListJobsRequest())
    assert len(everything.jobs) == 10 and not everything.page.next_page_token
    seen, token = [], ""
    while True:
        page = await stub.ListJobs(
            pb.ListJobsRequest(page=common_pb2.PageRequest(page_size=3, page_token=token))
        )
        seen += [(j.kind, j.evaluation_id) for j in page.jobs]
        token = page.page.next_page_token
        if not token:
            break
    assert seen == [(j.kind, j.evaluation_id) for j in everything.jobs]
    comparisons = await stub.ListJobs(
        pb.ListJobsRequest(kind=pb.JOB_KIND_COMPARISON, status=pb.JOB_STATUS_COMPLETED)
    )
    assert [j.evaluation_id for j in comparisons.jobs] == ["l1", "l2", "l3", "l4"]
    only = await stub.ListJobs(pb.ListJobsRequest(evaluation_id="l0"))
    assert {j.kind for j in only.jobs} == {pb.JOB_KIND_ANALYSIS, pb.JOB_KIND_COMPARISON}


async def test_assign_analysis_model_and_list_models(make_app, serve_app, fake_llm):
    app = make_app(models=ModelRegistry.from_configs([fake_llm.config()], default=""))
    stub = await serve_app(app)
    models = await stub.ListAnalysisModels(pb.ListAnalysisModelsRequest())
    assert [(m.name, m.kind, m.is_default) for m in models.models] == [
        ("fake-gpt", pb.ANALYSIS_MODEL_KIND_CHAT_COMPLETIONS, False),
        ("stats", pb.ANALYSIS_MODEL_KIND_BUILTIN, False),
    ]
    await feed_evaluation(stub, "a1", "2026-01", line=common_pb2.LINE_TRIAL)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="a1"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.AssignAnalysisModel(
            pb.AssignAnalysisModelRequest(evaluation_id="a1", analysis_model="ghost")
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    evaluation = await stub.AssignAnalysisModel(
        pb.AssignAnalysisModelRequest(evaluation_id="a1", analysis_model="fake-gpt")
    )
    assert evaluation.analysis_model == "fake-gpt"
    assert (await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="a1"))).started
    await app.jobs.wait_idle()

    result = await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="a1"))
    assert result.narrative == fake_llm.reply and result.job.analysis_model == "fake-gpt"
