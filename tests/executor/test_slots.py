"""Call slots: never more than the size at once, handed out in order, none lost to a
cancelled wait."""

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
