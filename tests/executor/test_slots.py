"""Call slots: never more than the size at once, handed out in the fair order (weighted
round-robin across businesses, then priority, then arrival), none lost to a cancelled
wait."""

import asyncio

from dispo.executor.slots import Slots


async def test_racing_calls_never_hold_more_slots_than_the_size():
    slots = Slots(3)
    holding = most = 0

    async def call(i: int) -> None:
        nonlocal holding, most
        if not await slots.take_now():
            await slots.take()
        holding += 1
        most = max(most, holding)
        for _ in range(i % 4):  # calls of different lengths, interleaved
            await asyncio.sleep(0)
        holding -= 1
        slots.give_back()

    await asyncio.gather(*(call(i) for i in range(60)))

    assert most == 3
    assert (slots.held, slots.waiting) == (0, 0)


async def test_slots_go_in_order_and_take_now_never_jumps_the_queue():
    slots = Slots(1)
    assert await slots.take_now()
    order: list[int] = []

    async def wait(i: int) -> None:
        await slots.take()
        order.append(i)

    waiters = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert slots.waiting == 3
    slots.give_back()  # to the first waiter, not to the free ones
    assert not await slots.take_now()  # two still queued: a step must not take it before them
    await asyncio.sleep(0)
    slots.give_back()
    await asyncio.sleep(0)
    slots.give_back()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    slots.give_back()
    assert (slots.held, slots.waiting) == (0, 0)


async def test_a_cancelled_wait_loses_no_slot():
    slots = Slots(1)
    assert await slots.take_now()
    first = asyncio.create_task(slots.take())
    second = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    first.cancel()  # cancelled while waiting
    await asyncio.sleep(0)
    slots.give_back()  # handed to the second
    await second
    third = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.give_back()  # handed to the third, which is cancelled before it runs again
    third.cancel()
    await asyncio.gather(first, third, return_exceptions=True)
    assert (slots.held, slots.waiting) == (0, 0)  # the third passed its slot back
    assert await slots.take_now()


async def _order_of_slots(slots: Slots, waiters: list[tuple[str, int]]) -> list[int]:
    """Queue ``waiters`` (business, priority) behind a held slot; the order they get it in."""
    assert await slots.take_now()
    order: list[int] = []

    async def wait(i: int, business: str, priority: int) -> None:
        await slots.take(business, priority)
        order.append(i)
        slots.give_back()

    tasks = [asyncio.create_task(wait(i, b, p)) for i, (b, p) in enumerate(waiters)]
    await asyncio.sleep(0)
    slots.give_back()
    await asyncio.gather(*tasks)
    assert (slots.held, slots.waiting) == (0, 0)
    return order


async def test_a_business_queued_behind_another_s_backlog_gets_every_other_slot():
    waiters = [("a", 3)] * 6 + [("b", 3)] * 3  # b's nodes come after a's six
    order = await _order_of_slots(Slots(1), waiters)
    assert order == [0, 6, 1, 7, 2, 8, 3, 4, 5]


async def test_weights_share_the_slots_and_priority_orders_within_a_business():
    weights = {"a": 1, "b": 2}
    waiters = [("a", 3)] * 4 + [("b", 5), ("b", 1), ("b", 3), ("b", 1)]
    order = await _order_of_slots(Slots(1, weight=lambda b: weights[b]), waiters)
    # b twice as often as a; b's priority 1 nodes first (in arrival order), its 5 last.
    assert [i for i in order if i >= 4] == [5, 7, 6, 4]
    assert order[:6] == [5, 0, 7, 6, 1, 4]
