"""A worker queue's pace (ADR-0108, "Worker queues"): the decision alone, then two executors'
claims against real PostgreSQL on one manual clock. At most the queue's
``max_calls_per_second`` action runs are taken in a whole second by both together, spaced
through its first four fifths; a poll that finds the pace spent waits on the clock for the
next turn; probe runs are not counted; ListQueues shows the last second's runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from dispo.executor.queue_pace import Count, Turns, counted, last_second, turns
from dispo.executor.store import worker_runs as store
from dispo.executor.worker_runs import QueuePolicy, WorkerRuns
from dispo.libs.clock import ManualClock
from support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # a whole second


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_turns_of_a_second_are_spaced_through_its_first_four_fifths():
    # 4 a second: turns due at 0, 0.2, 0.4, 0.6 into the second.
    assert turns(4, at(0), None) == Turns(1)
    assert turns(4, at(0.1), Count(int(T0.timestamp()), 1)) == Turns(0, at(0.2))
    assert turns(4, at(0.2), Count(int(T0.timestamp()), 1)) == Turns(1)
    # Turns due and not taken go at once (a poll that comes late in the second).
    assert turns(4, at(0.7), Count(int(T0.timestamp()), 1)) == Turns(3)
    # All taken: the next turn is the next second's first.
    assert turns(4, at(0.9), Count(int(T0.timestamp()), 4)) == Turns(0, at(1))
    # A new second starts afresh; a row of a later second (a clock ahead) counts as this one.
    assert turns(4, at(1.0), Count(int(T0.timestamp()), 4)) == Turns(1)
    assert turns(4, at(0.95), Count(int(T0.timestamp()) + 1, 1)) == Turns(0, at(1.2))


def test_the_count_carries_the_second_before_for_the_last_seconds_use():
    s = int(T0.timestamp())
    assert counted(None, at(0.3), 2) == Count(s, 2, 0)
    assert counted(Count(s, 2), at(0.5), 1) == Count(s, 3, 0)
    assert counted(Count(s, 3), at(1.1), 1) == Count(s + 1, 1, 3)
    assert counted(Count(s, 3), at(2.1), 1) == Count(s + 2, 1, 0)  # a second with none between
    assert last_second(Count(s, 3), at(1.5)) == 3
    assert last_second(Count(s + 1, 1, 3), at(1.5)) == 3
    assert last_second(Count(s, 3), at(2.5)) == 0 and last_second(None, at(0)) == 0


def offer(i: int, probe: bool = False) -> store.Offer:
    return store.Offer(
        f"t{i}", "a.work", "paced", "me", 1, f"t{i}/a.work", "work", True, 5000, b"{}", probe
    )


async def test_two_executors_take_at_most_the_queues_rate_in_a_second_together(
    service_db, manual_clock: ManualClock
):
    db = await service_db("executor")
    manual_clock.set(T0)
    first, second = (
        WorkerRuns(db, manual_clock, 10, QueuePolicy(rates={"paced": 3})) for _ in range(2)
    )
    async with db.connection() as conn:
        await store.runs_offer_many(conn, [offer(i) for i in range(12)], manual_clock.now())

    async def poll(runs: WorkerRuns, worker: str, wait_ms: int = 0) -> int:
        return len(await runs.poll(["paced"], worker, 10, wait_ms))

    # 3 a second: turns at 0, 0.267, 0.533 into each second, whoever asks.
    taken = [await poll(first, "a"), await poll(second, "b")]
    manual_clock.set(at(0.3))
    taken += [await poll(second, "b"), await poll(first, "a")]
    manual_clock.set(at(0.9))  # the last fifth: the third turn was due, none after it
    taken += [await poll(first, "a"), await poll(second, "b")]
    assert taken == [1, 0, 1, 0, 1, 0]

    # A long poll with the pace spent waits on the clock for the next turn, not spinning.
    waiting = asyncio.create_task(poll(second, "b", wait_ms=20_000))
    await eventually(lambda: manual_clock.waiting, lambda n: n == 1, wanted="the poll asleep")
    assert not waiting.done()
    manual_clock.set(at(1.0))
    assert await asyncio.wait_for(waiting, 10) == 1
    views = {q.queue: q for q in await first.queues()}
    assert views["paced"].max_calls_per_second == 3 and views["paced"].taken_last_second == 3

    # Late in a second, every turn due goes in one poll, and no more.
    manual_clock.set(at(1.7))
    assert await poll(first, "a") == 2
    manual_clock.set(at(2.0))
    assert await poll(second, "b") == 1


async def test_a_probe_run_is_not_counted_against_the_queues_rate(
    service_db, manual_clock: ManualClock
):
    db = await service_db("executor")
    manual_clock.set(T0)
    runs = WorkerRuns(db, manual_clock, 10, QueuePolicy(rates={"paced": 1}))
    async with db.connection() as conn:
        await store.runs_offer_many(conn, [offer(1), offer(2)], manual_clock.now())
        await store.runs_offer_many(conn, [offer(3, probe=True)], manual_clock.now())
    got = await runs.poll(["paced"], "w", 10, 0, probe_queues=["paced"])
    assert sorted((r.row.kind, r.row.task_id) for r in got) == [("action", "t1"), ("probe", "t3")]
    assert await runs.poll(["paced"], "w", 10, 0) == []
