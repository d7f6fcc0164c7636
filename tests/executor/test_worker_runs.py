"""A pass waiting for a worker run, against real PostgreSQL: only a run whose offer has
committed is looked for in the table, so a check between the offer's start and its commit
does not take the missing row for a run taken back (which would make the call ambiguous and
a non-idempotent node UNKNOWN although nothing ran)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from dispo.executor.commits import Flushes
from dispo.executor.domain import ActionSpec
from dispo.executor.store import worker_runs as store
from dispo.executor.worker_runs import WorkerRuns
from dispo.libs.clock import ManualClock


async def test_a_check_before_the_offer_commits_settles_nothing(
    service_db, manual_clock: ManualClock
):
    db = await service_db("executor")
    runs = WorkerRuns(db, manual_clock, lease_seconds=10)
    offer = store.Offer("t1", "a.work", "tickets", "me", 1, "t1/a.work", "work", False, 5000, b"{}")
    committing = asyncio.Event()
    written = asyncio.Event()

    async def write(o: store.Offer) -> None:
        await committing.wait()  # the offer's transaction is still under way
        async with db.connection() as conn:
            await store.runs_offer_many(conn, [o], manual_clock.now())
        written.set()

    waiting = asyncio.create_task(runs.run(offer, ActionSpec("worker"), write))
    await asyncio.sleep(0)
    assert offer.key in runs.waiting
    await runs.check()  # no row yet: not a run taken back
    assert not waiting.done()
    committing.set()
    await written.wait()
    await runs.check()  # offered, not taken: still nothing to settle
    assert not waiting.done()
    # Once committed, a row that is gone is a run taken back (its node recovered elsewhere).
    async with db.connection() as conn:
        await store.runs_delete_many(conn, [offer.key])
    await runs.check()
    result = await asyncio.wait_for(waiting, 5)
    assert "taken back" in result.detail, result


async def test_completions_group_committed_record_a_run_once_and_refuse_the_rest(
    service_db, manual_clock: ManualClock
):
    """Workers' completions share one statement (the executor's commit port): a run
    completed twice in one flush is recorded once, its first outcome, the second refused as
    if it came after; a worker that does not hold its run is refused; nothing else moves."""
    db = await service_db("executor")
    flushes = Flushes(db, None, manual_clock, None, 10.0)  # type: ignore[arg-type]
    offers = [
        store.Offer(
            f"t{i}", "a.work", "tickets", "me", 1, f"t{i}/a.work", "work", True, 5000, b"{}"
        )
        for i in range(3)
    ]
    async with db.connection() as conn:
        await store.runs_offer_many(conn, offers, manual_clock.now())
        taken = await store.runs_take_many(
            conn, ["tickets"], "w1", 3, manual_clock.now(), lease_seconds=10
        )
    assert len(taken) == 3
    first = store.Outcome(store.OUTPUT, b'{"n":1}')
    second = store.Outcome(store.OUTPUT, b'{"n":2}')
    answers = await flushes.complete(
        [
            (offers[0].key, "w1", first, None),
            (offers[0].key, "w1", second, None),
            (offers[1].key, "someone-else", first, None),
            (offers[2].key, "w1", second, "tickets"),
        ]
    )
    assert list(answers) == [True, False, False, True]
    async with db.connection() as conn:
        settled = await store.runs_settled_many(conn, [o.key for o in offers], manual_clock.now())
    assert settled[offers[0].key].output == b'{"n":1}'
    assert offers[1].key not in settled  # still taken by w1
    assert settled[offers[2].key].output == b'{"n":2}'


async def test_a_probe_run_is_taken_only_by_a_worker_of_its_probes_and_never_displaces_a_call(
    service_db, manual_clock: ManualClock
):
    """ADR-0100: a probe run of a node whose call is offered is not offered; a worker polling
    its queue's runs takes no probe run, one polling its queue's probes takes it."""
    db = await service_db("executor")
    call = store.Offer("t1", "a.work", "tickets", "me", 1, "t1/a.work", "work", False, 5000, b"{}")
    probe = store.Offer(
        "t2", "a.work", "tickets", "probe", 1, "t2/a.work", "work", False, 5000, b"{}", probe=True
    )
    now = manual_clock.now()
    async with db.transaction() as conn:
        assert await store.runs_offer_many(conn, [call], now) == {call.key}
        assert await store.runs_offer_many(conn, [probe], now) == {probe.key}
        # The call's node is not probed: its row stays the call's.
        probing_the_call = store.Offer(
            "t1", "a.work", "tickets", "probe", 1, "t1/a.work", "work", False, 5000, b"{}", True
        )
        assert await store.runs_offer_many(conn, [probing_the_call], now) == set()
    async with db.connection() as conn:
        calls = await store.runs_take_many(conn, ["tickets"], "w1", 10, now, 10)
        assert [(r.task_id, r.kind) for r in calls] == [("t1", "action")]
        probes = await store.runs_take_many(conn, [], "w2", 10, now, 10, None, ["tickets"])
        assert [(r.task_id, r.kind) for r in probes] == [("t2", "probe")]
        done = await store.runs_complete_if_held_many(
            conn, [(probe.key, "w2", store.Outcome(store.DONE, b'{"x":1}'), "tickets")], now
        )
        assert done == [True]
        assert await store.runs_probe_outputs_many(conn, [("t2", "a.work"), ("t1", "a.work")]) == {
            ("t2", "a.work"): b'{"x":1}'
        }


def _offers(business: str, count: int, priority: int = 3, first: int = 0) -> list[store.Offer]:
    return [
        store.Offer(
            f"{business}{i}",
            "a.work",
            "tickets",
            "me",
            1,
            f"{business}{i}/a.work",
            "work",
            True,
            5000,
            b"{}",
            business=business,
            priority=priority,
        )  # fmt: skip
        for i in range(first, first + count)
    ]


async def _offer_in_turn(db, offers: list[store.Offer], start) -> None:
    """Each run offered a millisecond after the one before it."""
    async with db.transaction() as conn:
        for i, offer in enumerate(offers):
            await store.runs_offer_many(conn, [offer], start + timedelta(milliseconds=i))


async def _poll(db, now, credit: int, **fair) -> Counter[str]:
    async with db.connection() as conn:
        rows = await store.runs_take_many(conn, ["tickets"], "w1", credit, now, 10, **fair)
    return Counter(r.business for r in rows)


async def test_a_queues_runs_are_taken_in_weighted_round_robin_across_businesses(
    service_db, manual_clock: ManualClock
):
    """ADR-0109: business A offers 50 runs, then B offers 5; a worker polling two at a
    time gets one of each per poll — B's runs within its first five polls, not after A's
    50 — and the runs keep their business and priority."""
    db = await service_db("executor")
    now = manual_clock.now()
    await _offer_in_turn(db, _offers("a", 50), now)
    await _offer_in_turn(db, _offers("b", 5), now + timedelta(seconds=1))
    later = now + timedelta(seconds=2)
    polls = [await _poll(db, later, 2) for _ in range(5)]
    assert polls == [Counter(a=1, b=1)] * 5
    assert await _poll(db, later, 10) == Counter(a=10)  # B has none left: A takes every turn
    async with db.connection() as conn:
        row = (await conn.fetch("SELECT business, priority FROM worker_runs WHERE task_id = 'b0'"))[
            0
        ]
    assert (row.business, row.priority) == ("b", 3)


async def test_a_heavier_business_gets_its_weight_of_the_runs_and_a_paused_one_none(
    service_db, manual_clock: ManualClock
):
    """With weights A=1, B=3, a poll of four gets three of B's runs per one of A's, although
    all of A's are older; a paused business's runs stay offered."""
    db = await service_db("executor")
    now = manual_clock.now()
    await _offer_in_turn(db, _offers("a", 50), now)
    await _offer_in_turn(db, _offers("b", 30), now + timedelta(seconds=1))
    later = now + timedelta(seconds=2)
    weights = {"weights": {"b": 3}, "default_weight": 1}
    polls = [await _poll(db, later, 4, **weights) for _ in range(5)]
    assert polls == [Counter(a=1, b=3)] * 5
    assert await _poll(db, later, 8, **weights, paused=["b"]) == Counter(a=8)
    assert await _poll(db, later, 8, paused=["a", "b"]) == Counter()


async def test_within_a_business_a_higher_priority_run_goes_before_older_ones(
    service_db, manual_clock: ManualClock
):
    db = await service_db("executor")
    now = manual_clock.now()
    await _offer_in_turn(db, _offers("a", 5, priority=3), now)
    await _offer_in_turn(db, _offers("a", 1, priority=1, first=5), now + timedelta(seconds=1))
    async with db.connection() as conn:
        first = await store.runs_take_many(
            conn, ["tickets"], "w1", 1, now + timedelta(seconds=2), 10
        )
        rest = await store.runs_take_many(
            conn, ["tickets"], "w1", 2, now + timedelta(seconds=2), 10
        )
    assert [r.task_id for r in first] == ["a5"]  # the newest, of priority 1
    assert sorted(r.task_id for r in rest) == ["a0", "a1"]  # then by arrival
