"""Two replicas on one database: a claim's heartbeat keeps a long generation with its live
owner; recovery — at start or in a sweep — takes over only rows that are really abandoned
and leaves the other replica's rows, and their recovery attempts, alone. Time is the manual
clock's."""

from __future__ import annotations

import asyncio

import pytest
from dispo.intelligence.analysis_models import ModelRegistry, StatsModel
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus
from dispo.libs.clock import ManualClock
from support import eventually

from .conftest import RUNS_GOOD, add_evaluation, store_of

ANALYSIS = JobKind.ANALYSIS


class GatedModel(StatsModel):
    """Narrates only once ``gate`` is set: a generation as long as the test wants."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.calls = 0

    async def narrate_analysis(self, evaluation, stats):
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        return "late but sound"


@pytest.fixture
def replica(make_app, service_db):
    """``await replica(models=..., clock=...)``: another instance of the service (its own
    connection pool, as another process would have) on the same database and, unless
    given another, the same clock."""

    async def make(**options):
        return make_app(db=await service_db("intelligence"), **options)

    return make


async def heartbeat_lands(app, clock, evaluation_id: str, seconds: float = 60) -> None:
    """Move the clock on by one heartbeat interval and wait until the owner has extended its
    claim and waits for the next beat."""
    clock.advance(seconds)
    now = clock.now()
    await eventually(
        lambda: store_of(app).job_get(ANALYSIS, evaluation_id),
        lambda job: job.heartbeat_at == now and clock.waiting >= 1,
        wanted=f"a heartbeat at {now}",
        describe=lambda job: f"heartbeat_at={job.heartbeat_at}, clock waiters={clock.waiting}",
    )


async def test_a_generation_longer_than_the_takeover_age_stays_with_its_live_owner(
    make_app, replica, manual_clock
):
    model = GatedModel()
    owner = make_app(models=ModelRegistry([StatsModel(), model], default="gated"))
    other_model = GatedModel()
    other = await replica(models=ModelRegistry([StatsModel(), other_model], default="gated"))
    await add_evaluation(
        owner, "long", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await owner.jobs.trigger(ANALYSIS, "long")
    await model.entered.wait()
    claimed = await store_of(owner).job_get(ANALYSIS, "long")
    assert claimed.status == JobStatus.GENERATING

    for _ in range(20):  # twenty minutes of generation; the takeover age is fifteen
        await heartbeat_lands(owner, manual_clock, "long")
        report = await other.jobs.recover()  # the other replica's sweep
        assert report.requeued == [] and report.failed == []

    job = await store_of(owner).job_get(ANALYSIS, "long")
    assert job.status == JobStatus.GENERATING and job.claim_token == claimed.claim_token
    assert job.recovery_attempts == 0
    model.gate.set()
    await owner.jobs.wait_idle()
    final = await store_of(owner).job_get(ANALYSIS, "long")
    assert final.status == JobStatus.COMPLETED and final.attempts == 1
    assert final.result["narrative"] == "late but sound"
    assert model.calls == 1 and other_model.calls == 0


async def test_a_claim_whose_owner_stopped_beating_is_taken_over_once_stale(replica, manual_clock):
    model = GatedModel()
    # The owner hangs: its clock stands still, so its heartbeat never comes round again.
    owner = await replica(
        clock=ManualClock(manual_clock.now()),
        models=ModelRegistry([StatsModel(), model], default="gated"),
    )
    other = await replica()
    await add_evaluation(
        owner, "lost", line="trial", runs=RUNS_GOOD, status=EvaluationRecordStatus.COMPLETED
    )
    await owner.jobs.trigger(ANALYSIS, "lost")
    await model.entered.wait()
    claimed = await store_of(owner).job_get(ANALYSIS, "lost")
    assert claimed.heartbeat_at == manual_clock.now()

    manual_clock.advance(minutes=14, seconds=59)
    assert (await other.jobs.recover()).requeued == []  # not stale yet
    manual_clock.advance(seconds=1)
    report = await other.jobs.recover()
    await other.jobs.wait_idle()

    assert report.requeued == [(ANALYSIS, "lost")]
    job = await store_of(other).job_get(ANALYSIS, "lost")
    assert job.status == JobStatus.COMPLETED and job.recovery_attempts == 1 and job.attempts == 2
    assert job.claim_token != claimed.claim_token
    model.gate.set()  # the old owner's late result is refused: its claim is gone
    await owner.jobs.wait_idle()
    after = await store_of(owner).job_get(ANALYSIS, "lost")
    assert after.result == job.result and after.result["narrative"] != "late but sound"


async def test_start_up_recovery_takes_only_abandoned_rows_and_no_live_replicas(
    make_app, replica, manual_clock
):
    model = GatedModel()
    live = make_app(models=ModelRegistry([StatsModel(), model], default="gated"))
    for evaluation_id in ("dead", "handed-back", "running", "next-1", "next-2"):
        await add_evaluation(
            live,
            evaluation_id,
            line="trial",
            runs=RUNS_GOOD,
            status=EvaluationRecordStatus.COMPLETED,
        )
    store, now = store_of(live), manual_clock.now
    # abandoned: a row whose owner died twenty minutes ago ...
    await store.job_ensure_queued(ANALYSIS, "dead", now())
    assert await store.job_claim_if_queued(ANALYSIS, "dead", "dead-worker", now())
    assert await store.job_set_generating_if_claimed(ANALYSIS, "dead", "dead-worker", {}, now())
    manual_clock.advance(minutes=20)
    # ... and one a stopping replica handed back
    await store.job_ensure_queued(ANALYSIS, "handed-back", now())
    assert await store.job_claim_if_queued(ANALYSIS, "handed-back", "stopped", now())
    assert await store.job_set_generating_if_claimed(ANALYSIS, "handed-back", "stopped", {}, now())
    assert await store.job_requeue_if_generating(ANALYSIS, "handed-back", "stopped", now())
    # the live replica runs one, and has just queued two more it is about to claim
    await live.jobs.trigger(ANALYSIS, "running")
    await model.entered.wait()
    for evaluation_id in ("next-1", "next-2"):
        await store.job_ensure_queued(ANALYSIS, evaluation_id, now())

    starting = await replica()
    report = await starting.jobs.recover()  # what a replica does at start
    await starting.jobs.wait_idle()

    assert sorted(report.requeued) == [(ANALYSIS, "dead"), (ANALYSIS, "handed-back")]
    assert report.failed == []
    for evaluation_id in ("dead", "handed-back"):
        job = await store.job_get(ANALYSIS, evaluation_id)
        assert job.status == JobStatus.COMPLETED and job.recovery_attempts == 1, evaluation_id
    running = await store.job_get(ANALYSIS, "running")
    assert running.status == JobStatus.GENERATING and running.recovery_attempts == 0
    for evaluation_id in ("next-1", "next-2"):
        job = await store.job_get(ANALYSIS, evaluation_id)
        assert job.status == JobStatus.QUEUED and job.claim_token is None, evaluation_id
        assert job.recovery_attempts == 0 and job.attempts == 0, evaluation_id
        live.jobs.start(ANALYSIS, evaluation_id)
    model.gate.set()
    await live.jobs.wait_idle()
    for evaluation_id in ("running", "next-1", "next-2"):
        job = await store.job_get(ANALYSIS, evaluation_id)
        assert job.status == JobStatus.COMPLETED, evaluation_id
        assert job.recovery_attempts == 0 and job.attempts == 1, evaluation_id


async def test_replicas_recovering_beside_a_busy_one_consume_none_of_its_attempts(
    make_app, replica, manual_clock
):
    busy = make_app()
    evaluations = [f"busy-{i}" for i in range(30)]
    for evaluation_id in evaluations:
        await add_evaluation(
            busy,
            evaluation_id,
            line="trial",
            runs=RUNS_GOOD,
            status=EvaluationRecordStatus.COMPLETED,
        )
    starting = [await replica(), await replica()]

    async def recover_again_and_again(app) -> list:
        found = []
        for _ in range(15):
            report = await app.jobs.recover()
            found += report.requeued + report.failed
            await asyncio.sleep(0)
        return found

    triggered, *recovered = await asyncio.gather(
        asyncio.gather(*(busy.jobs.trigger(ANALYSIS, e) for e in evaluations)),
        *(recover_again_and_again(app) for app in starting),
    )
    await busy.jobs.wait_idle()
    for app in starting:
        await app.jobs.wait_idle()

    assert sum(started for _, started in triggered) == len(evaluations)
    assert recovered == [[], []]
    jobs = [await store_of(busy).job_get(ANALYSIS, e) for e in evaluations]
    assert {(j.status, j.recovery_attempts, j.attempts) for j in jobs} == {
        (JobStatus.COMPLETED, 0, 1)
    }
