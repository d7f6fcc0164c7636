"""Characterization of the settlement seam (seed 000), against real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from dispo.intelligence import analysis
from dispo.intelligence.analysis_models import ModelRegistry, StatsModel
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus
from dispo.intelligence.job_settlement import JobAdapter, JobOutcome, execute, recover_jobs
from sqlalchemy import text

from .conftest import RUNS_GOOD, add_evaluation, store_of


def counting_adapter(
    counter: list[int],
    *,
    fail_with: str | None = None,
    gate: asyncio.Event | None = None,
    entered: asyncio.Event | None = None,
):
    async def work_fn(deps, evaluation_id, plan):
        counter.append(1)
        if entered is not None:
            entered.set()
        if gate is not None:
            await gate.wait()
        if fail_with is not None:
            raise RuntimeError(fail_with)
        return await analysis.work_fn(deps, evaluation_id, plan)

    return JobAdapter(JobKind.ANALYSIS, analysis.ensure_queued, analysis.validate, work_fn)


async def test_claim_race_twenty_concurrent_executes_run_the_work_once(app):
    await add_evaluation(
        app, "race", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    counter: list[int] = []
    adapter = counting_adapter(counter)

    outcomes = await asyncio.gather(
        *(execute(JobKind.ANALYSIS, "race", app.jobs.deps, adapter) for _ in range(20))
    )

    assert counter == [1]
    assert outcomes.count(JobOutcome.COMPLETED) == 1
    assert set(outcomes) <= {JobOutcome.COMPLETED, JobOutcome.LOST, JobOutcome.SKIPPED}
    job = await store_of(app).job_get(JobKind.ANALYSIS, "race")
    assert job.status == JobStatus.COMPLETED and job.attempts == 1
    assert job.result["stats"]["run_count"] == len(RUNS_GOOD)


async def test_racing_contenders_all_observe_queued_yet_one_claims(app):
    await add_evaluation(
        app, "queued-race", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await store_of(app).job_ensure_queued(
        JobKind.ANALYSIS, "queued-race", app.jobs.deps.clock.now()
    )
    counter: list[int] = []
    gate, entered = asyncio.Event(), asyncio.Event()
    adapter = counting_adapter(counter, gate=gate, entered=entered)

    tasks = [
        asyncio.create_task(execute(JobKind.ANALYSIS, "queued-race", app.jobs.deps, adapter))
        for _ in range(20)
    ]
    await entered.wait()
    gate.set()
    outcomes = await asyncio.gather(*tasks)

    assert counter == [1]
    assert outcomes.count(JobOutcome.COMPLETED) == 1


async def test_duplicate_triggers_start_one_job(app, intel_engine):
    await add_evaluation(
        app, "dup", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )

    results = await asyncio.gather(*(app.jobs.trigger(JobKind.ANALYSIS, "dup") for _ in range(5)))
    await app.jobs.wait_idle()
    again, started_again = await app.jobs.trigger(JobKind.ANALYSIS, "dup")

    assert sum(started for _, started in results) == 1
    assert not started_again and again.status == JobStatus.COMPLETED
    job = await store_of(app).job_get(JobKind.ANALYSIS, "dup")
    assert job.attempts == 1
    async with intel_engine.connect() as conn:
        rows = (await conn.execute(text("SELECT count(*) FROM intelligence_jobs"))).scalar()
    assert rows == 1


async def test_a_failed_job_can_be_triggered_again(app):
    await add_evaluation(
        app, "retry", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await execute(JobKind.ANALYSIS, "retry", app.jobs.deps, counting_adapter([], fail_with="boom"))
    assert (await store_of(app).job_get(JobKind.ANALYSIS, "retry")).status == JobStatus.FAILED

    job, started = await app.jobs.trigger(JobKind.ANALYSIS, "retry")
    await app.jobs.wait_idle()

    assert started and job.status == JobStatus.QUEUED
    final = await store_of(app).job_get(JobKind.ANALYSIS, "retry")
    assert final.status == JobStatus.COMPLETED and final.error is None and final.attempts == 2


async def test_error_text_of_2000_characters_is_stored_as_exactly_500(app):
    await add_evaluation(
        app, "long-error", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    message = "".join(chr(ord("a") + i % 26) for i in range(2000))

    outcome = await execute(
        JobKind.ANALYSIS, "long-error", app.jobs.deps, counting_adapter([], fail_with=message)
    )

    job = await store_of(app).job_get(JobKind.ANALYSIS, "long-error")
    assert outcome == JobOutcome.FAILED and job.status == JobStatus.FAILED
    assert len(job.error) == 500
    assert job.error == f"RuntimeError: {message}"[:500]


async def test_non_terminal_evaluation_executed_directly_fails_its_row(app):
    await add_evaluation(app, "still-running", runs=RUNS_GOOD)
    counter: list[int] = []

    outcome = await execute(
        JobKind.ANALYSIS, "still-running", app.jobs.deps, counting_adapter(counter)
    )

    job = await store_of(app).job_get(JobKind.ANALYSIS, "still-running")
    assert outcome == JobOutcome.FAILED and counter == []
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "evaluation 'still-running' is running; analysis needs a finished evaluation "
        "(completed, failed or cancelled)"
    )


async def test_missing_model_fails_the_row_with_the_hint_and_the_field(make_app):
    app = make_app(default_analysis_model="")
    await add_evaluation(app, "no-model", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED)

    await execute(JobKind.ANALYSIS, "no-model", app.jobs.deps, analysis.ANALYSIS)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "no-model")
    assert job.status == JobStatus.FAILED
    assert "assign an analysis model to the evaluation" in job.error


async def test_recovery_requeues_a_queued_row_three_times_then_fails_it_with_the_reason(
    app, manual_clock
):
    await add_evaluation(
        app, "stuck", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await store_of(app).job_ensure_queued(JobKind.ANALYSIS, "stuck", manual_clock.now())
    seen = []
    for _ in range(4):  # four restarts in which the job never gets to run
        manual_clock.advance(minutes=1)
        report = await recover_jobs(
            app.db,
            manual_clock.now(),
            queued_idle=timedelta(0),
            generating_stale=timedelta(minutes=15),
        )
        job = await store_of(app).job_get(JobKind.ANALYSIS, "stuck")
        seen.append((job.status, job.recovery_attempts, len(report.requeued), len(report.failed)))

    assert seen == [
        (JobStatus.QUEUED, 1, 1, 0),
        (JobStatus.QUEUED, 2, 1, 0),
        (JobStatus.QUEUED, 3, 1, 0),
        (JobStatus.FAILED, 3, 0, 1),
    ]
    assert job.error == (
        "gave up after 3 restart recoveries: the job was re-queued 3 times without settling"
    )


async def test_recovery_runs_requeued_rows_and_hands_back_stale_generating_ones(app, manual_clock):
    await add_evaluation(
        app, "orphan", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await store_of(app).job_ensure_queued(JobKind.ANALYSIS, "orphan", manual_clock.now())
    assert await store_of(app).job_claim_if_queued(
        JobKind.ANALYSIS, "orphan", "dead-worker", manual_clock.now()
    )
    assert await store_of(app).job_set_generating_if_claimed(
        JobKind.ANALYSIS, "orphan", "dead-worker", {}, manual_clock.now()
    )

    manual_clock.advance(minutes=5)
    assert (await app.jobs.recover()).requeued == []  # the claim is still fresh
    manual_clock.advance(minutes=11)
    report = await app.jobs.recover()
    await app.jobs.wait_idle()

    assert report.requeued == [(JobKind.ANALYSIS, "orphan")]
    job = await store_of(app).job_get(JobKind.ANALYSIS, "orphan")
    assert job.status == JobStatus.COMPLETED and job.recovery_attempts == 1
    # the dead worker's late settlement is refused: its claim is gone
    assert not await store_of(app).job_complete_if_generating(
        JobKind.ANALYSIS, "orphan", "dead-worker", {}, {}, manual_clock.now()
    )


async def test_a_stopping_registry_hands_running_work_back_to_the_queue(make_app):
    gate, entered = asyncio.Event(), asyncio.Event()

    class SlowModel(StatsModel):
        name = "slow"

        async def narrate_analysis(self, evaluation, stats):
            entered.set()
            await gate.wait()
            return "never"

    app = make_app(models=ModelRegistry([StatsModel(), SlowModel()], default="slow"))
    await add_evaluation(
        app, "slow", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await app.jobs.trigger(JobKind.ANALYSIS, "slow")
    await entered.wait()  # the work has begun: the row is generating
    assert (await store_of(app).job_get(JobKind.ANALYSIS, "slow")).status == JobStatus.GENERATING

    await app.jobs.close(grace=0.05)

    job = await store_of(app).job_get(JobKind.ANALYSIS, "slow")
    assert job.status == JobStatus.QUEUED and job.claim_token is None
    assert app.jobs.start(JobKind.ANALYSIS, "slow") is None  # closed: starts nothing new


async def test_claim_race_between_two_replicas_with_their_own_connection_pools(
    app, service_db, manual_clock
):
    """Two service instances (separate connection pools, as two processes would have) race on
    one row."""
    from dispo.intelligence.app import build
    from dispo.intelligence.settings import IntelligenceSettings

    other = build(
        await service_db("intelligence"),
        manual_clock,
        IntelligenceSettings(consume_events=False),
    )
    await add_evaluation(
        app, "replicas", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    counter: list[int] = []
    adapter = counting_adapter(counter)

    outcomes = await asyncio.gather(
        *(
            execute(JobKind.ANALYSIS, "replicas", replica.jobs.deps, adapter)
            for _ in range(10)
            for replica in (app, other)
        )
    )

    assert counter == [1] and outcomes.count(JobOutcome.COMPLETED) == 1
