"""A flaky analysis model: transient failures are retried inside the job, definite ones are
not, and the automatic chain goes on. The model is a real HTTP server the test starts; the
retries wait on the manual clock."""

from __future__ import annotations

import json

from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus

from .conftest import RESET, RUNS_GOOD, RUNS_WORSE, SLOW, add_evaluation, run_jobs, store_of

HEARTBEAT = 600.0  # the claim's heartbeat also waits on the clock, this long each time


def flaky_app(make_app, fake_llm, **settings):
    models = ModelRegistry.from_configs([fake_llm.config(timeout_seconds=0.5)], default="fake-gpt")
    return make_app(models=models, heartbeat_seconds=HEARTBEAT, **settings)


def retry_waits(clock) -> list[float]:
    """What the jobs waited on the clock between two model calls, in order."""
    return [seconds for seconds in clock.sleeps if seconds != HEARTBEAT]


async def test_transient_model_errors_are_retried_and_the_chain_goes_on(
    make_app, fake_llm, manual_clock
):
    app = flaky_app(make_app, fake_llm, model_max_attempts=6, model_retry_base_seconds=1)
    await add_evaluation(
        app, "w01", period="2026-W01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await run_jobs(app, manual_clock)
    before = len(fake_llm.requests)  # w01's analysis (its comparison has no baseline)
    manual_clock.sleeps.clear()

    # 429 asking for 7 s, a connection closed before the answer, a read timeout, 502, 503
    fake_llm.script = [(429, {"Retry-After": "7"}), RESET, SLOW, (502, {}), (503, {})]
    await add_evaluation(
        app, "w02", period="2026-W02", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await run_jobs(app, manual_clock)

    analysis = await store_of(app).job_get(JobKind.ANALYSIS, "w02")
    assert analysis.status == JobStatus.COMPLETED and analysis.error is None
    assert analysis.result["narrative"] == fake_llm.reply and analysis.attempts == 1
    comparison = await store_of(app).job_get(JobKind.COMPARISON, "w02")
    assert comparison.status == JobStatus.COMPLETED and comparison.baseline_evaluation_id == "w01"
    sent = [json.loads(r["messages"][1]["content"]) for r in fake_llm.requests[before:]]
    assert [s.get("evaluation", {}).get("evaluation_id") for s in sent[:6]] == ["w02"] * 6
    assert len(sent) == 7 and "deltas" in sent[6]  # six analysis calls, then the comparison
    waits = retry_waits(manual_clock)
    assert len(waits) == 5 and waits[0] == 7.0  # the 429's Retry-After, honoured
    for failure, wait in enumerate(waits[1:], start=2):  # then 1 s doubling, 20 % jitter
        assert 0.8 * 2 ** (failure - 1) <= wait <= 1.2 * 2 ** (failure - 1), waits


async def test_a_model_that_keeps_failing_fails_the_job_after_the_bound(
    make_app, fake_llm, manual_clock
):
    fake_llm.status = 502
    app = flaky_app(make_app, fake_llm, model_max_attempts=3)
    await add_evaluation(app, "down", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await run_jobs(app, manual_clock)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "down")
    assert job.status == JobStatus.FAILED and len(job.error) == 500
    assert job.error.startswith(
        "after 3 attempts: ModelError: model fake-gpt: HTTP 502 from http://127.0.0.1:"
    )
    assert len(fake_llm.requests) == 3 and len(retry_waits(manual_clock)) == 2
    assert await store_of(app).job_get(JobKind.COMPARISON, "down") is None


async def test_a_definite_model_error_fails_the_job_at_once(make_app, fake_llm, manual_clock):
    fake_llm.script = [(404, {})]
    app = flaky_app(make_app, fake_llm)
    await add_evaluation(app, "gone", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await run_jobs(app, manual_clock)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "gone")
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("ModelError: model fake-gpt: HTTP 404 from http://127.0.0.1:")
    assert len(fake_llm.requests) == 1 and retry_waits(manual_clock) == []


async def test_a_retry_after_longer_than_a_job_waits_fails_the_job_at_once(
    make_app, fake_llm, manual_clock
):
    fake_llm.script = [(429, {"Retry-After": "3600"})]
    app = flaky_app(make_app, fake_llm, model_retry_after_max_seconds=300)
    await add_evaluation(app, "later", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await run_jobs(app, manual_clock)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "later")
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        "after 1 attempt (asked to retry after 3600 s, more than the 300 s a job waits): "
        "ModelError: model fake-gpt: HTTP 429 from http://127.0.0.1:"
    )
    assert len(fake_llm.requests) == 1 and retry_waits(manual_clock) == []


async def test_a_failed_automatic_analysis_triggered_again_goes_on_to_its_comparison(
    make_app, fake_llm, manual_clock, serve_app
):
    from dispo.libs.api.intelligence.v1 import intelligence_pb2 as pb

    app = flaky_app(make_app, fake_llm, model_max_attempts=2)
    stub = await serve_app(app)
    await add_evaluation(
        app, "b01", period="2026-01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await run_jobs(app, manual_clock)
    fake_llm.status = 503  # the model is down when b02 completes
    await add_evaluation(
        app, "b02", period="2026-02", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await run_jobs(app, manual_clock)
    assert (await store_of(app).job_get(JobKind.ANALYSIS, "b02")).status == JobStatus.FAILED
    assert await store_of(app).job_get(JobKind.COMPARISON, "b02") is None

    fake_llm.status = 200  # back up: an operator triggers the analysis again
    reply = await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="b02"))
    await run_jobs(app, manual_clock)

    assert reply.started and reply.job.status == pb.JOB_STATUS_QUEUED
    analysis = await store_of(app).job_get(JobKind.ANALYSIS, "b02")
    assert analysis.status == JobStatus.COMPLETED and analysis.error is None
    assert analysis.attempts == 2 and analysis.result["narrative"] == fake_llm.reply
    comparison = await store_of(app).job_get(JobKind.COMPARISON, "b02")
    assert comparison.status == JobStatus.COMPLETED and comparison.baseline_evaluation_id == "b01"
    view = await stub.GetComparison(pb.GetJobRequest(evaluation_id="b02"))
    assert view.narrative == fake_llm.reply and view.baseline_evaluation_id == "b01"
