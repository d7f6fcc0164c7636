"""Every status write of a job or an evaluation is checked against its declared table first:
an undeclared move is refused with nothing written, and of racing settlements one wins."""

from __future__ import annotations

import asyncio

import pytest
from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.job_rules import JobKind, JobStatus
from dispo.libs.states import IllegalTransition

from .conftest import RUNS_GOOD, add_evaluation, store_of

A = JobKind.ANALYSIS


async def _generating(app, evaluation_id: str, token: str = "tok"):
    now = app.jobs.deps.clock.now()
    await store_of(app).job_ensure_queued(A, evaluation_id, now)
    assert await store_of(app).job_claim_if_queued(A, evaluation_id, token, now)
    assert await store_of(app).job_set_generating_if_claimed(A, evaluation_id, token, {}, now)
    return now


# The evaluations stay running in the feed's eyes: completing one through the feed would
# start its analysis in the background, a second writer these tests do not want.


async def test_an_undeclared_job_or_evaluation_move_is_refused_and_changes_nothing(app):
    await add_evaluation(app, "done", runs=RUNS_GOOD)
    now = await _generating(app, "done")
    assert await store_of(app).job_complete_if_generating(A, "done", "tok", {"ok": 1}, {}, now)
    completed = await store_of(app).job_get(A, "done")
    assert completed.status is JobStatus.COMPLETED

    with pytest.raises(IllegalTransition, match="job state cannot move from completed to queued"):
        await store_of(app).job_requeue_if_unchanged(completed, now)
    with pytest.raises(IllegalTransition, match="from completed to failed"):
        await store_of(app).job_fail_if_unchanged(completed, "late failure", now)
    with pytest.raises(IllegalTransition, match="from completed to failed"):
        await store_of(app).job_fail_if_claimed(A, "done", "tok", JobStatus.COMPLETED, "x", {}, now)
    # A declared move whose guard no longer matches is a lost race, not an error.
    assert not await store_of(app).job_requeue_if_generating(A, "done", "tok", now)
    assert await store_of(app).job_get(A, "done") == completed

    assert await store_of(app).evaluation_complete_if_running(
        "done", EvaluationRecordStatus.COMPLETED, now
    )
    evaluation = await store_of(app).evaluation_get("done")
    with pytest.raises(
        IllegalTransition, match="evaluation state cannot move from running to running"
    ):
        await store_of(app).evaluation_complete_if_running(
            "done", EvaluationRecordStatus.RUNNING, now
        )
    # A declared move on an evaluation already finished is a lost race, not an error.
    assert not await store_of(app).evaluation_complete_if_running(
        "done", EvaluationRecordStatus.FAILED, now
    )
    assert await store_of(app).evaluation_get("done") == evaluation


async def test_racing_settlements_of_one_generating_job_exactly_one_is_recorded(app):
    await add_evaluation(app, "race", runs=RUNS_GOOD)
    now = await _generating(app, "race")

    def contenders():
        yield store_of(app).job_complete_if_generating(A, "race", "tok", {"ok": 1}, {}, now)
        yield store_of(app).job_fail_if_claimed(
            A, "race", "tok", JobStatus.GENERATING, "x", {}, now
        )
        yield store_of(app).job_requeue_if_generating(A, "race", "tok", now)

    results = await asyncio.gather(*(c for _ in range(4) for c in contenders()))

    assert sorted(results) == [False] * 11 + [True]
    winner = [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.QUEUED][results.index(True) % 3]
    assert (await store_of(app).job_get(A, "race")).status is winner
