"""Automatic triggers and the period comparison, against real PostgreSQL."""

from __future__ import annotations

from dispo.intelligence import comparison
from dispo.intelligence.evaluation_read_model import load_comparison_view
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus
from dispo.intelligence.job_settlement import execute

from .conftest import CONFIG, RUNS_GOOD, RUNS_WORSE, add_evaluation, store_of


async def test_formal_evaluation_completion_chains_analysis_then_comparison_by_itself(app):
    await add_evaluation(
        app, "w01", period="2026-W01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()
    await add_evaluation(
        app, "w02", period="2026-W02", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()

    first = await store_of(app).job_get(JobKind.COMPARISON, "w01")
    assert first.status == JobStatus.FAILED and first.error.startswith(
        "no baseline for evaluation 'w01'"
    )
    analysis_job = await store_of(app).job_get(JobKind.ANALYSIS, "w02")
    assert analysis_job.status == JobStatus.COMPLETED and analysis_job.analysis_model == "stats"
    job = await store_of(app).job_get(JobKind.COMPARISON, "w02")
    assert job.status == JobStatus.COMPLETED and job.baseline_evaluation_id == "w01"

    view = await load_comparison_view(app.db, "w02")
    assert (view.period, view.baseline_period, view.baseline_evaluation_id) == (
        "2026-W02",
        "2026-W01",
        "w01",
    )
    deltas = {d["metric"]: d for d in view.deltas}
    assert deltas["pass_rate"]["baseline"] == 0.8 and deltas["pass_rate"]["current"] == 0.4
    assert deltas["pass_rate"]["direction"] == "regressed"
    assert deltas["latency.p50_ms"]["direction"] == "regressed"
    assert "regressed" in view.narrative


async def test_trial_evaluation_completion_starts_nothing(app):
    await add_evaluation(
        app,
        "t01",
        line="trial",
        period="2026-W01",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )
    await add_evaluation(
        app,
        "t02",
        line="trial",
        period="2026-W02",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )
    await app.jobs.wait_idle()

    assert await store_of(app).job_get(JobKind.ANALYSIS, "t02") is None
    assert await store_of(app).job_get(JobKind.COMPARISON, "t02") is None


async def test_failed_or_cancelled_evaluations_are_not_analysed_automatically(app):
    await add_evaluation(app, "f01", runs=RUNS_GOOD, status=EvaluationRecordStatus.FAILED)
    await add_evaluation(app, "c01", runs=RUNS_GOOD, status=EvaluationRecordStatus.CANCELLED)
    await app.jobs.wait_idle()

    assert await store_of(app).job_get(JobKind.ANALYSIS, "f01") is None
    assert await store_of(app).job_get(JobKind.ANALYSIS, "c01") is None


async def test_no_resolvable_model_means_no_automatic_analysis(make_app):
    app = make_app(default_analysis_model="")
    await add_evaluation(app, "m01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)
    await app.jobs.wait_idle()

    assert await store_of(app).job_get(JobKind.ANALYSIS, "m01") is None


async def test_baseline_needs_the_same_fingerprint_and_an_earlier_completed_period(app):
    other = {**CONFIG, "runs_per_slot": 9}
    await add_evaluation(
        app, "p1", period="2026-01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await add_evaluation(
        app,
        "p2-other-config",
        period="2026-02",
        configuration=other,
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )
    await add_evaluation(
        app,
        "p3-cancelled",
        period="2026-03",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.CANCELLED,
    )
    await add_evaluation(
        app,
        "p3-trial",
        line="trial",
        period="2026-03",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )
    await add_evaluation(
        app, "p5-later", period="2026-05", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await add_evaluation(
        app, "p4", period="2026-04", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()

    job = await store_of(app).job_get(JobKind.COMPARISON, "p4")
    assert job.status == JobStatus.COMPLETED and job.baseline_evaluation_id == "p1"
    lonely = await store_of(app).job_get(JobKind.COMPARISON, "p2-other-config")
    assert (
        lonely.status == JobStatus.FAILED and "fingerprint" in lonely.error and lonely.fingerprint
    )


async def test_comparison_refuses_a_baseline_without_runs(app):
    await add_evaluation(app, "e1", period="2026-01", status=EvaluationRecordStatus.COMPLETED)
    await add_evaluation(
        app, "e2", period="2026-02", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()

    job = await store_of(app).job_get(JobKind.COMPARISON, "e2")
    assert job.status == JobStatus.FAILED
    assert job.error == "cannot compare: evaluation 'e1' has no run results"
    assert job.baseline_evaluation_id == "e1"


async def test_a_comparison_waits_for_an_earlier_period_still_running(app):
    """A period that completes before the one before it (events handled concurrently, or
    periods run side by side) does not fail its comparison for want of a baseline: it
    waits, and the sweep runs it once the earlier period is done, against that period."""
    await add_evaluation(
        app, "w01", period="2026-W01", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await add_evaluation(app, "w02", period="2026-W02", runs=RUNS_GOOD)  # still running
    await add_evaluation(
        app, "w03", period="2026-W03", runs=RUNS_WORSE, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.wait_idle()
    assert (await store_of(app).job_get(JobKind.ANALYSIS, "w03")).status == JobStatus.COMPLETED
    assert await store_of(app).job_get(JobKind.COMPARISON, "w03") is None  # waiting, not failed
    assert await app.jobs.sweep_lost_triggers() == []  # still waiting

    await app.feed.complete("w02", EvaluationRecordStatus.COMPLETED)
    await app.jobs.wait_idle()
    assert (await app.jobs.sweep_lost_triggers()) == [(JobKind.COMPARISON, "w03")]
    await app.jobs.wait_idle()
    job = await store_of(app).job_get(JobKind.COMPARISON, "w03")
    assert job.status == JobStatus.COMPLETED and job.baseline_evaluation_id == "w02"


async def test_lost_automatic_triggers_are_swept_up(app):
    await add_evaluation(app, "lost", runs=RUNS_GOOD)
    # the completion is recorded but the process dies before the analysis row exists
    assert await store_of(app).evaluation_complete_if_running(
        "lost", EvaluationRecordStatus.COMPLETED, app.jobs.deps.clock.now()
    )

    started = await app.jobs.sweep_lost_triggers()
    await app.jobs.wait_idle()

    assert started == [(JobKind.ANALYSIS, "lost")]
    assert (await store_of(app).job_get(JobKind.ANALYSIS, "lost")).status == JobStatus.COMPLETED
    assert (
        await store_of(app).job_get(JobKind.COMPARISON, "lost")
    ).status == JobStatus.FAILED  # no baseline
    assert await app.jobs.sweep_lost_triggers() == []


async def test_manual_comparison_of_a_trial_evaluation_uses_the_same_seam(app):
    await add_evaluation(
        app,
        "tr1",
        line="trial",
        period="2026-01",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )
    await add_evaluation(
        app,
        "tr2",
        line="trial",
        period="2026-02",
        runs=RUNS_GOOD,
        status=EvaluationRecordStatus.COMPLETED,
    )

    outcome = await execute(JobKind.COMPARISON, "tr2", app.jobs.deps, comparison.COMPARISON)

    view = await load_comparison_view(app.db, "tr2")
    assert outcome == "completed"
    assert {d["direction"] for d in view.deltas} == {"unchanged"}
