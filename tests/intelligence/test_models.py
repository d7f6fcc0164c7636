"""OpenAI-compatible analysis models against a fake LLM server the test starts on 127.0.0.1."""

from __future__ import annotations

import json

from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus

from .conftest import RUNS_GOOD, RUNS_WORSE, add_evaluation, run_jobs, store_of


async def test_chat_model_writes_the_analysis_narrative_from_the_stats(make_app, fake_llm):
    app = make_app(models=ModelRegistry.from_configs([fake_llm.config()], default="fake-gpt"))
    await add_evaluation(app, "llm1", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await app.jobs.wait_idle()

    job = await store_of(app).job_get(JobKind.ANALYSIS, "llm1")
    assert job.status == JobStatus.COMPLETED and job.analysis_model == "fake-gpt"
    assert job.result["narrative"] == fake_llm.reply
    body = fake_llm.requests[0]
    assert body["model"] == "fake-model-1" and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    sent = json.loads(body["messages"][1]["content"])
    assert sent["evaluation"]["evaluation_id"] == "llm1" and sent["stats"]["run_count"] == len(
        RUNS_GOOD
    )
    assert fake_llm.headers[0]["Authorization"] == "Bearer sk-test"


async def test_chat_model_writes_the_comparison_narrative(make_app, fake_llm):
    app = make_app(models=ModelRegistry.from_configs([fake_llm.config()], default="fake-gpt"))
    await add_evaluation(
        app, "n1", period="2026-01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await add_evaluation(
        app, "n2", period="2026-02", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()

    job = await store_of(app).job_get(JobKind.COMPARISON, "n2")
    assert job.status == JobStatus.COMPLETED and job.result["narrative"] == fake_llm.reply
    # The two analyses and the comparison reach the model in no fixed order: pick the
    # comparison by its shape, and there is exactly one.
    contents = [json.loads(r["messages"][1]["content"]) for r in fake_llm.requests]
    comparisons = [c for c in contents if "deltas" in c]
    assert len(comparisons) == 1 and len(contents) == 3
    sent = comparisons[0]
    assert sent["baseline_evaluation_id"] == "n1" and {d["metric"] for d in sent["deltas"]} >= {
        "pass_rate"
    }


async def test_an_llm_http_error_fails_the_job_with_truncated_text(make_app, fake_llm):
    fake_llm.status = 400  # definite: not retried (transient ones: test_flaky_model.py)
    app = make_app(models=ModelRegistry.from_configs([fake_llm.config()], default="fake-gpt"))
    await add_evaluation(app, "llm-down", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await app.jobs.wait_idle()

    job = await store_of(app).job_get(JobKind.ANALYSIS, "llm-down")
    assert job.status == JobStatus.FAILED and len(job.error) == 500
    assert job.error.startswith("ModelError: model fake-gpt: HTTP 400 from http://127.0.0.1:")
    assert len(fake_llm.requests) == 1
    assert (
        await store_of(app).job_get(JobKind.COMPARISON, "llm-down") is None
    )  # the chain needs a completed analysis


async def test_an_unreachable_llm_fails_the_job_visibly(make_app, fake_llm, manual_clock):
    config = fake_llm.config(timeout_seconds=2.0)
    config.base_url = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    app = make_app(models=ModelRegistry.from_configs([config], default="fake-gpt"))
    await add_evaluation(app, "llm-gone", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await run_jobs(app, manual_clock)  # connection refused is transient: retried, then given up

    job = await store_of(app).job_get(JobKind.ANALYSIS, "llm-gone")
    assert job.status == JobStatus.FAILED and job.error.startswith(
        "after 5 attempts: ModelError: model fake-gpt: "
        "request to http://127.0.0.1:9/v1/chat/completions failed"
    )


async def test_models_are_configured_from_the_environment(monkeypatch, fake_llm):
    from dispo.intelligence.settings import IntelligenceSettings

    monkeypatch.setenv("DISPO_INTELLIGENCE_MODELS", json.dumps([fake_llm.config().model_dump()]))
    monkeypatch.setenv("DISPO_INTELLIGENCE_DEFAULT_ANALYSIS_MODEL", "fake-gpt")
    settings = IntelligenceSettings()
    registry = ModelRegistry.from_configs(settings.models, settings.default_analysis_model)

    assert registry.names() == ["fake-gpt", "stats"] and registry.default == "fake-gpt"
    narrative = await registry.get("fake-gpt").narrate_analysis(
        {"evaluation_id": "x"}, {"run_count": 0}
    )
    assert narrative == fake_llm.reply
    await registry.aclose()
