"""The queue: priority order (boost, slot due > debt > waiting time) and exactly-once claims."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from dispo.pool import store
from dispo.pool.domain import Evaluation, EvaluationStatus, QueueKey, Schedule

from .conftest import add_crons, evaluation


async def _seed(
    pool,
    ev: Evaluation,
    *,
    window_start,
    runs_done: int = 0,
    waiting_since=None,
    status: str = "executing",
) -> None:
    async with pool.db.transaction() as conn:
        await store.evaluation_insert(conn, ev, window_start)
        await conn.fetch(
            "UPDATE evaluations SET runs_done = :d, waiting_since = :w, status = :s WHERE id = :id",
            {"d": runs_done, "w": waiting_since or window_start, "s": status, "id": ev.id},
        )


async def test_priority_order_mixes_slot_due_debt_and_waiting_time(pool, manual_clock):
    now = manual_clock.now()
    hour = timedelta(hours=1)
    # 24 one-hour slots, 2 runs per slot; now is in slot 3 for a window that began 3.5 h ago.
    start = now - 3.5 * hour
    cases = {
        # slot due (nothing of slot 3 done), debt 2, waited long
        "a-due-small-debt": dict(runs_done=6, waiting_since=now - 3 * hour),
        # slot due, debt 4
        "b-due-big-debt": dict(runs_done=4, waiting_since=now - 1 * hour),
        # not slot due (half of slot 3 done), debt 1, waited longest
        "c-debt-1-oldest": dict(runs_done=7, waiting_since=now - 3.4 * hour),
        # not slot due, debt 1, waited less
        "d-debt-1-newer": dict(runs_done=7, waiting_since=now - 0.5 * hour),
        # slot due, debt 2, waited less than a
        "e-due-small-debt-newer": dict(runs_done=6, waiting_since=now - 2 * hour),
        # nothing owed: not in the queue
        "f-no-debt": dict(runs_done=8, waiting_since=now - 3.4 * hour),
    }
    for name, seed in cases.items():
        ev = evaluation(name, slots=24, runs_per_slot=2)
        await _seed(pool, ev, window_start=start, **seed)
    # A paused evaluation owing runs is not served.
    await _seed(pool, evaluation("g-paused", runs_per_slot=2), window_start=start, status="paused")

    async with pool.db.connection() as conn:
        queue = await store.queue_list(conn, now)
    order = [k.evaluation_id for k in queue]
    assert order == [
        "b-due-big-debt",
        "a-due-small-debt",
        "e-due-small-debt-newer",
        "c-debt-1-oldest",
        "d-debt-1-newer",
    ]
    # The SQL order and the domain's sort key agree, and so do debt and slot-due.
    assert sorted(queue, key=QueueKey.sort_key) == queue
    for key in queue:
        schedule = Schedule(start, 86400, 24, 2)
        done = cases[key.evaluation_id]["runs_done"]
        assert key.debt == schedule.debt(now, done)
        assert key.slot_due == schedule.slot_due(now, done)

    # An operator boost puts an item first whatever its debt.
    await pool.boost("d-debt-1-newer", 5)
    async with pool.db.connection() as conn:
        assert (await store.queue_list(conn, now))[0].evaluation_id == "d-debt-1-newer"


async def test_new_evaluations_wait_visibly_as_queued_when_no_cron_is_free(pool, manual_clock):
    for i in range(3):
        await pool.create_evaluation(evaluation(f"ev-{i}"))
        manual_clock.advance(seconds=10)
    status = await pool.status()
    assert status.queue_depth == 3
    assert status.oldest_wait_seconds == 30
    for i in range(3):
        assert (await pool.get_evaluation(f"ev-{i}")).status is EvaluationStatus.QUEUED


async def test_twenty_crons_racing_for_five_items_take_each_once(pool):
    crons = await add_crons(pool, 20)
    for i in range(5):
        await pool.create_evaluation(evaluation(f"race-{i}"))

    results = await asyncio.gather(*(pool.wake_cron(c) for c in crons))

    taken = [r.evaluation.id for r in results if r.evaluation is not None]
    assert sorted(taken) == [f"race-{i}" for i in range(5)]
    async with pool.db.connection() as conn:
        busy = [c for c in await store.crons_list(conn) if c.evaluation_id]
        assignments = await store.assignments_list(conn)
    assert len(busy) == 5 and len({c.evaluation_id for c in busy}) == 5
    assert len(assignments) == 5
    for i in range(5):
        ev = await pool.get_evaluation(f"race-{i}")
        assert ev.status is EvaluationStatus.EXECUTING and ev.assigned_cron_id in crons


async def test_claim_takes_the_top_item_and_emits_started_once(pool, pool_engine):
    [cron] = await add_crons(pool, 1)
    await pool.create_evaluation(evaluation("only", runs_per_slot=2))
    woke = await pool.wake_cron(cron)
    assert (
        woke.evaluation
        and woke.evaluation.id == "only"
        and woke.runs_owed == 2
        and woke.next_run_index == 0
    )
    again = await pool.wake_cron(cron)  # busy: continues the same evaluation
    assert again.evaluation and again.evaluation.id == "only"
    async with pool_engine.connect() as conn:
        unsent = (
            store.outbox.select()
            .where(store.outbox.c.sent_at.is_(None))
            .order_by(store.outbox.c.id)
        )
        subjects = [r.subject for r in await conn.execute(unsent)]
    assert subjects == ["evaluation.started"]


async def test_next_slot_time_of_waiting_evaluations(pool, manual_clock):
    [cron] = await add_crons(pool, 1)
    await pool.create_evaluation(evaluation("timed", window=120, slots=2))
    async with pool.db.connection() as conn:
        assert (
            await store.evaluations_next_slot_at(conn, manual_clock.now()) is None
        )  # owes a run now
    woke = await pool.wake_cron(cron)
    from dispo.pool.domain import RunResult, Verdict

    await pool.record_run(cron, "timed", 0, "c1", RunResult(Verdict.PASS, 1.0, 1))
    assert woke.evaluation is not None
    async with pool.db.connection() as conn:
        due = await store.evaluations_next_slot_at(conn, manual_clock.now())
    assert due == woke.evaluation.created_at + timedelta(seconds=60)


async def test_wakes_recordings_and_operator_commands_racing_do_not_deadlock(pool):
    """Evaluation-then-cron lock order everywhere: concurrent wakes, runs, pauses, releases."""
    from dispo.libs.errors import DomainError
    from dispo.pool.domain import RunResult, Verdict

    crons = await add_crons(pool, 6)
    for i in range(6):
        await pool.create_evaluation(evaluation(f"mix-{i}", slots=1, runs_per_slot=3))
    taken = {
        r.evaluation.id: c
        for c, r in zip(
            crons, await asyncio.gather(*(pool.wake_cron(c) for c in crons)), strict=False
        )
    }

    async def attempt(coro):
        try:
            return await coro
        except DomainError as error:  # lost races are domain errors, never deadlocks
            return error

    ops = []
    for i in range(6):
        ev_id, cron = f"mix-{i}", taken[f"mix-{i}"]
        ops += [
            attempt(pool.wake_cron(cron)),
            attempt(pool.record_run(cron, ev_id, 0, "c1", RunResult(Verdict.PASS, 1.0, 1))),
            attempt(pool.pause(ev_id) if i % 2 else pool.force_release(evaluation_id=ev_id)),
        ]
    await asyncio.gather(*ops)
    for _ in range(2):
        await asyncio.gather(*(attempt(pool.wake_cron(c)) for c in crons))
    async with pool.db.connection() as conn:
        crons_now = await store.crons_list(conn)
        open_assignments = [a for a in await store.assignments_list(conn) if a.ended_at is None]
    held = {c.evaluation_id for c in crons_now if c.evaluation_id}
    assert len(held) == len([c for c in crons_now if c.evaluation_id]) == len(open_assignments)
    for evaluation_id in held:
        assert (await pool.get_evaluation(evaluation_id)).assigned_cron_id in {
            c.id for c in crons_now
        }
