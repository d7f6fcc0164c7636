"""Shares of the downstreams' cluster-wide limits (ADR-0108), the downstreams' own and each
business's (per_business): how a limit is divided (pure),
the slots and paces a share bounds, and renewals of several holders racing on real
PostgreSQL — never more than the limit between them, a dead holder's share free once its
lease ran out and not before, a holder cut off from the database holding nothing."""

import asyncio
import random
from datetime import UTC, datetime, timedelta

from dispo.executor.per_business import (
    BusinessLimits,
    business_pace_key,
    business_slots_key,
    idle,
)
from dispo.executor.shares import DownstreamShares
from dispo.executor.slots import Pace, Slots
from dispo.libs.catalogue import BusinessLimit, Downstream
from dispo.libs.clock import ManualClock
from dispo.libs.shares import Grant, divide, limit_shares_use

LABELS = {"labels": Downstream("labels", "http://127.0.0.1:1", 1000, 4, "", 10)}


def test_a_holder_alone_takes_the_whole_limit_even_idle():
    assert divide(4, 0, 0, []) == Grant(4, 4)
    assert divide(4, 9, 0, [(1, 1)]) == Grant(3, 3)  # the others hold what they want


def test_a_busy_holder_leaves_an_equal_part_free_for_the_others_unless_it_wants_more():
    assert divide(12, 2, 0, [(0, 0), (0, 0)]) == Grant(4, 4)  # an equal part
    assert divide(12, 5, 0, [(0, 0), (0, 0)]) == Grant(10, 10)  # twice what it wants
    assert divide(12, 9, 0, [(4, 1), (0, 0)]) == Grant(8, 8)  # what is free


def test_a_holder_gives_way_to_a_short_one_down_to_an_equal_part_as_its_calls_end():
    # Holds 4 with 4 in use, another wants 2 and holds nothing: bounded at 2, recorded 4
    # until two calls end.
    assert divide(4, 6, 4, [(0, 2)]) == Grant(2, 4)
    assert divide(4, 6, 1, [(0, 2)]) == Grant(2, 2)
    assert divide(4, 6, 1, [(2, 3)]) == Grant(2, 2)
    # The short one takes what was freed, at most its part.
    assert divide(4, 5, 0, [(2, 6)]) == Grant(2, 2)
    # One that wants little keeps its part (a burst of its own finds room); an idle one
    # gives everything back.
    assert divide(12, 1, 1, [(0, 5)]) == Grant(6, 6)
    assert divide(4, 0, 0, [(0, 1)]) == Grant(0, 0)


async def test_a_slot_bound_below_what_is_held_hands_out_none_until_calls_end():
    slots = Slots(4, bound=2)
    assert await slots.take_now() and await slots.take_now()
    assert not await slots.take_now()
    waiter = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.resize(1)
    slots.give_back()
    await asyncio.sleep(0)
    assert not waiter.done()  # 1 held, bound 1
    slots.resize(2)
    await asyncio.wait_for(waiter, 1)
    assert slots.held == 2


async def test_a_pace_starts_at_most_its_share_in_a_second_and_a_larger_one_next_second():
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    pace = Pace(10, clock, bound=2)
    sent: list[datetime] = []

    async def call() -> None:
        if await pace.wait(5.0):
            sent.append(clock.now())

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    calls = [asyncio.create_task(call()) for _ in range(6)]
    for _ in range(10):  # through the first second, a tenth at a time
        await settle()
        clock.advance(0.1)
    await settle()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # 2 a second, spaced through its first four fifths
    assert [(t - start).total_seconds() for t in sent] == [0.0, 0.4, 1.0]
    pace.share(4, clock.now())  # a larger share: from the next second
    for _ in range(9):
        await settle()
        clock.advance(0.1)
    await settle()
    assert len(sent) == 4  # still 2 in this second
    clock.advance(0.1)
    await settle()
    clock.advance(0.2)  # 4 a second now: a fifth of a second apart
    await settle()
    await asyncio.wait_for(asyncio.gather(*calls), 1)
    assert [(t - start).total_seconds() for t in sent[3:]] == [1.4, 2.0, 2.2]
    assert pace.waiting == 0


def holders(db, clock, n, lease=3.0):
    return [
        DownstreamShares.of(db, clock, f"ex{i}", LABELS, {"labels": 1.0}, lease) for i in range(n)
    ]


async def test_racing_holders_never_hold_more_than_the_limit_between_them(service_db):
    db = await service_db("executor")
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    group = holders(db, clock, 3)
    rng = random.Random(7)
    most = 0

    async def call(shares: DownstreamShares) -> None:
        slots = shares.slots["labels"]
        for _ in range(8):
            if not await slots.take_now():
                await slots.take()
            await asyncio.sleep(rng.random() / 100)
            slots.give_back()

    async def renewing(shares: DownstreamShares, done: asyncio.Event) -> None:
        while not done.is_set():
            await shares.renew()
            await asyncio.sleep(rng.random() / 50)

    async def watch() -> None:
        nonlocal most
        while True:
            held = [s.slots["labels"].held for s in group]
            assert sum(held) <= 4
            most = max(most, sum(1 for h in held if h))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    done = asyncio.Event()
    renewals = [asyncio.create_task(renewing(s, done)) for s in group]
    await asyncio.wait_for(asyncio.gather(*(call(s) for s in group for _ in range(4))), 60)
    done.set()
    await asyncio.gather(*renewals)
    watcher.cancel()
    assert most >= 2  # the limit was shared: more than one holder calling at once
    paces = [s.paces["labels"].bound for s in group]
    assert sum(paces) <= 10


async def test_a_dead_holders_share_is_free_once_its_lease_ran_out_and_not_before(service_db):
    db = await service_db("executor")
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    dead, alive = holders(db, clock, 2)
    await dead.renew()
    assert dead.slots["labels"].bound == 4 and dead.paces["labels"].bound == 0  # next second
    waiter = asyncio.create_task(alive.slots["labels"].take())  # a node waits for a slot
    await asyncio.sleep(0)
    assert alive.slots["labels"].waiting == 1
    await alive.renew()
    assert alive.slots["labels"].bound == 0  # all held by the other, which never renews again
    clock.advance(seconds=3.0)  # the share lease, not yet the call timeout beyond it
    await alive.renew()
    assert alive.slots["labels"].bound == 0
    clock.advance(seconds=1.01)
    await alive.renew()
    assert alive.slots["labels"].bound == 4
    await asyncio.wait_for(waiter, 1)  # handed the slot once the share came
    use = await alive.use()
    assert use["downstream:labels:calls"].holders == 1


async def test_a_holder_that_cannot_renew_holds_nothing_once_its_lease_ran_out(service_db):
    db = await service_db("executor")
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    (shares,) = holders(db, clock, 1)
    await shares.renew()
    slots = shares.slots["labels"]
    assert slots.bound == 4 and slots.covers(clock.now(), 1.0)
    await db.close()  # the database is away: nothing can be renewed
    clock.advance(seconds=2.9)
    assert slots.covers(clock.now(), 1.0)
    clock.advance(seconds=0.2)
    assert not slots.covers(clock.now(), 1.0)  # a call would outlast the share (4 s)
    clock.advance(seconds=1.0)
    try:
        await shares.renew()
    except Exception:
        pass
    assert slots.bound == 0
    assert not await slots.take_now()


async def test_a_pace_waits_its_turn_however_long_but_not_without_a_share():
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    pace = Pace(1, clock)
    assert await pace.wait(0.5)
    second = asyncio.create_task(pace.wait(0.5))
    for _ in range(4):  # its turn is a second away, longer than its patience: it waits
        await asyncio.sleep(0)
        clock.advance(0.2)
    await asyncio.sleep(0)
    assert not second.done()
    clock.advance(0.2)
    assert await asyncio.wait_for(second, 1)
    pace.lease_until = clock.now()  # no share leased from now on
    third = asyncio.create_task(pace.wait(0.5))
    for _ in range(8):
        await asyncio.sleep(0)
        clock.advance(0.1)
    assert await asyncio.wait_for(third, 1) is False


PER_BUSINESS = {
    "labels": Downstream(
        "labels", "http://127.0.0.1:1", 1000, 4, "", 10, per_business=BusinessLimit(2, 3)
    )
}


def test_a_business_idle_for_a_lease_holds_nothing_of_a_downstream_any_more():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert not idle(False, now, now + timedelta(seconds=2.9), 3.0)
    assert idle(False, now, now + timedelta(seconds=3.0), 3.0)
    assert not idle(True, now, now + timedelta(seconds=30), 3.0)  # a call under way or waiting
    assert business_slots_key("labels", "shop") == "downstream:labels:business:shop:calls"
    assert business_pace_key("labels", "shop") == "downstream:labels:business:shop:per_second"


async def test_a_business_slots_and_pace_are_made_at_its_first_call_and_dropped_once_idle():
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    limits = BusinessLimits(clock)
    limits.put("labels", BusinessLimit(2, 0))
    assert limits.pace_of("labels", "shop") is None  # no rate per business
    assert limits.slots_of("other", "shop") is None  # no limit per business
    slots = limits.slots_of("labels", "shop")
    assert slots is not None and slots.size == 2 and slots.bound == 0  # until a renewal
    assert limits.slots_of("labels", "shop") is slots
    slots.resize(2)
    assert await slots.take_now()
    clock.advance(seconds=5)
    assert limits.drop_idle(3.0) == []  # a call under way
    slots.give_back()
    assert limits.drop_idle(3.0) == [("labels", "shop")]
    assert limits.slots_of("labels", "shop") is not slots
    # Counted in one process alone, a business holds the whole of its limit at once.
    alone = BusinessLimits(clock, leased=False)
    alone.put("labels", BusinessLimit(2, 3))
    own, pace = alone.slots_of("labels", "shop"), alone.pace_of("labels", "shop")
    assert own is not None and own.bound == 2 and own.lease_until is None
    assert pace is not None and pace.bound == 3


async def test_holders_share_each_businesss_limit_apart_from_the_others_and_the_downstreams(
    service_db,
):
    db = await service_db("executor")
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    one, two = (
        DownstreamShares.of(db, clock, f"ex{i}", PER_BUSINESS, {"labels": 1.0}, 3.0)
        for i in range(2)
    )
    assert one.business is not None and two.business is not None
    # Both executors have nodes of "shop" waiting; only the second has "news".
    waiting = []
    for shares, business in ((one, "shop"), (two, "shop"), (two, "news")):
        own = shares.business.slots_of("labels", business)
        assert own is not None
        for _ in range(3):
            waiting.append(asyncio.create_task(own.take(business)))
    pace = two.business.pace_of("labels", "news")
    assert pace is not None and pace.bound == 0  # nothing until a renewal
    await asyncio.sleep(0)
    for _ in range(3):
        await one.renew()
        await two.renew()
        await asyncio.sleep(0)
    clock.advance(seconds=1.0)  # a larger pace applies from the next second
    assert await asyncio.wait_for(pace.wait(1.0), 1) and pace.bound == 3
    shop = [s.business.slots["labels", "shop"] for s in (one, two)]
    news = two.business.slots["labels", "news"]
    assert sum(s.held for s in shop) == 2  # 2 between them, held until their calls end
    assert news.held == 2  # its own 2, whatever shop holds
    assert sum(s.slots["labels"].bound for s in (one, two)) <= 4
    use = await one.use()
    assert use["downstream:labels:calls"].holders == 2
    # The per-business rows are leased as the downstream's are.
    async with db.connection() as conn:
        rows = await limit_shares_use(
            conn,
            [business_slots_key("labels", "shop"), business_pace_key("labels", "news")],
            clock.now(),
        )
    assert rows[business_slots_key("labels", "shop")].holders == 2
    assert rows[business_slots_key("labels", "shop")].granted <= 2
    assert rows[business_pace_key("labels", "news")].granted == 3  # one holder: all of it
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    # Once idle for a lease, a business's share is no longer renewed: it runs out.
    for shares in (one, two):
        for own in shares.business.slots.values():
            while own.held:
                own.give_back()
    clock.advance(seconds=3.0)
    await one.renew()
    await two.renew()
    assert not one.business.slots and not two.business.slots
    clock.advance(seconds=1.01)
    async with db.connection() as conn:
        rows = await limit_shares_use(conn, [business_slots_key("labels", "shop")], clock.now())
    assert rows == {}
