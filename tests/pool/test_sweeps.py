"""Stuck crons, force release and scaling, driven by a manual clock (nothing sleeps)."""

from __future__ import annotations

import pytest
from dispo.libs.errors import FailedPrecondition, NotFound
from dispo.pool import store
from dispo.pool.domain import CronStatus, EvaluationStatus, RunResult, Verdict
from dispo.pool.sweeps import hold_sweep, scale_sweep, stuck_sweep

from .conftest import add_crons, evaluation

PASS = RunResult(Verdict.PASS, 1.0, 5)


async def test_cron_silent_for_ten_minutes_is_stuck_and_its_evaluation_reassigned(
    pool, manual_clock
):
    first, other = await add_crons(pool, 2)
    await pool.create_evaluation(evaluation("silent", runs_per_slot=3))
    assert (await pool.wake_cron(first)).evaluation.id == "silent"
    await pool.record_run(first, "silent", 0, "c1", PASS)

    # 9:59 of silence: not yet stuck (the other cron keeps waking on its ticks).
    manual_clock.advance(minutes=9, seconds=59)
    await pool.wake_cron(other)
    report = await stuck_sweep(pool)
    assert report.stuck_crons == []

    # 10:00 exactly: stuck, removed, replaced, and the evaluation handed to the new cron.
    manual_clock.advance(seconds=1)
    await pool.wake_cron(other)
    report = await stuck_sweep(pool)
    assert report.stuck_crons == [first]
    assert report.stuck_evaluations == ["silent"]
    replacement = report.replacements[first]
    assert report.handed_over == {"silent": replacement}

    ev = await pool.get_evaluation("silent")
    assert ev.status is EvaluationStatus.EXECUTING and ev.assigned_cron_id == replacement
    assert ev.runs_done == 1  # nothing lost, nothing redone
    crons = {c.id: c for c in await pool.crons()}
    assert first not in crons and crons[replacement].status is CronStatus.BUSY
    await pool.settle()  # the driver calls that follow the sweep
    assert {c.id for c in await pool.driver.list()} == {other, replacement}
    async with pool.db.connection() as conn:
        history = [
            (a.cron_id, a.end_reason)
            for a in await store.assignments_list(conn, evaluation_id="silent")
        ]
    assert history == [(replacement, None), (first, "stuck")]

    # The stuck cron coming back to life cannot record for the evaluation any more.
    with pytest.raises(FailedPrecondition):
        await pool.record_run(first, "silent", 1, "c1", PASS)
    with pytest.raises(NotFound):
        await pool.wake_cron(first)
    # The new cron continues from where the old one stopped.
    woke = await pool.wake_cron(replacement)
    assert woke.next_run_index == 1 and woke.runs_owed == 2


async def test_idle_cron_silent_for_ten_minutes_is_replaced(pool, manual_clock):
    [cron] = await add_crons(pool, 1)
    manual_clock.advance(minutes=10)
    report = await stuck_sweep(pool)
    assert report.stuck_crons == [cron] and cron in report.replacements
    assert [c.status for c in await pool.crons()] == [CronStatus.IDLE]


async def test_evaluation_holding_a_cron_two_hours_is_force_released(pool, manual_clock):
    [cron] = await add_crons(pool, 1)
    await pool.create_evaluation(evaluation("long", slots=1, runs_per_slot=500))
    assert (await pool.wake_cron(cron)).evaluation.id == "long"
    index = 0
    for _ in range(119):  # a busy cron recording a run every minute: active, but holding
        manual_clock.advance(minutes=1)
        await pool.record_run(cron, "long", index, "c1", PASS)
        index += 1
    manual_clock.advance(seconds=59)
    assert await hold_sweep(pool) == []  # 1:59:59
    manual_clock.advance(seconds=1)
    assert await hold_sweep(pool) == ["long"]  # 2:00:00

    ev = await pool.get_evaluation("long")
    assert ev.status is EvaluationStatus.EXECUTING and ev.assigned_cron_id is None
    assert ev.waiting_since == manual_clock.now() and ev.runs_done == 119
    assert [c.status for c in await pool.crons()] == [CronStatus.IDLE]
    async with pool.db.connection() as conn:
        [assignment] = await store.assignments_list(conn, evaluation_id="long")
        assert assignment.end_reason == "force_released"
        assert (await store.queue_list(conn, manual_clock.now()))[0].evaluation_id == "long"
    with pytest.raises(FailedPrecondition):  # the released cron's late result is refused
        await pool.record_run(cron, "long", 119, "c1", PASS)


async def _busy(pool, crons: list[str], n: int) -> None:
    for i, cron in enumerate(crons[:n]):
        await pool.create_evaluation(
            evaluation(f"busy-{len(crons)}-{n}-{i}", slots=1, runs_per_slot=10)
        )
        assert (await pool.wake_cron(cron)).evaluation is not None


async def test_scale_up_exactly_above_the_busy_ratio(pool):
    crons = await add_crons(pool, 5)
    await _busy(pool, crons, 4)
    assert await scale_sweep(pool) == 0  # 4/5 = 0.8: not above
    await pool.create_evaluation(evaluation("fifth", slots=1, runs_per_slot=10))
    assert (await pool.wake_cron(crons[4])).evaluation is not None
    assert await scale_sweep(pool) == 2  # 5/5 > 0.8 -> 7 crons (5/7 <= 0.8)
    status = await pool.status()
    assert status.counts[CronStatus.BUSY] + status.counts[CronStatus.IDLE] == 7
    async with pool.db.connection() as conn:
        [resize] = await store.resizes_list(conn)
    assert (resize["from_size"], resize["to_size"], resize["reason"]) == (5, 7, "busy_ratio")


async def test_scale_down_exactly_above_twice_min_idle_and_never_beyond_bounds(pool):
    await add_crons(pool, 10)
    assert await scale_sweep(pool) == 0  # idle 10 = 2 x 5: not above
    await add_crons(pool, 1)
    assert await scale_sweep(pool) == -1  # idle 11 > 10
    assert len(await pool.crons()) == 10
    await pool.settle()
    assert len(await pool.driver.list()) == 10
    await pool.set_bounds(2, 3)
    assert await scale_sweep(pool) == -7  # above the new max
    assert len(await pool.crons()) == 3
    await pool.set_bounds(6, 20)
    assert await scale_sweep(pool) == 3  # below the new min
    async with pool.db.connection() as conn:
        reasons = [r["reason"] for r in await store.resizes_list(conn)]
    assert reasons == ["below_min", "above_max", "idle_surplus"]


async def test_bounds_are_validated(pool):
    from dispo.libs.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        await pool.set_bounds(0, 5)
    with pytest.raises(InvalidArgument):
        await pool.set_bounds(6, 5)


async def test_pool_restart_does_not_count_its_own_downtime_as_cron_silence(pool, manual_clock):
    from dispo.pool.sweeps import grace_after_restart

    crons = await add_crons(pool, 3)
    manual_clock.advance(minutes=30)  # the pool service was down for half an hour
    assert await grace_after_restart(pool) == 3
    assert (await stuck_sweep(pool)).stuck_crons == []
    manual_clock.advance(minutes=10)  # a cron that stays silent after the restart is still caught
    await pool.wake_cron(crons[0])
    assert sorted((await stuck_sweep(pool)).stuck_crons) == sorted(crons[1:])


async def test_force_release_by_cron_or_evaluation(pool, wakes):
    from dispo.libs.errors import InvalidArgument

    first, second = await add_crons(pool, 2)
    wakes.subjects.clear()
    await pool.create_evaluation(evaluation("held", runs_per_slot=5))
    assert len(wakes.subjects) == 1  # the new item woke one idle cron at once
    assert (await pool.wake_cron(first)).evaluation.id == "held"
    assert await pool.force_release(cron_id=first) == (first, "held")
    assert (await pool.get_evaluation("held")).assigned_cron_id is None
    assert (await pool.wake_cron(second)).evaluation.id == "held"
    assert await pool.force_release(evaluation_id="held") == (second, "held")
    with pytest.raises(FailedPrecondition):
        await pool.force_release(cron_id=second)
    with pytest.raises(InvalidArgument):
        await pool.force_release()
    with pytest.raises(NotFound):
        await pool.force_release(cron_id="cron-nope")
    async with pool.db.connection() as conn:
        reasons = [a.end_reason for a in await store.assignments_list(conn, evaluation_id="held")]
    assert reasons == ["force_released", "force_released"]
