"""Group commit: every caller gets its own result, items queued during a flush go together
into the next one, failures reach exactly the callers they concern, and the bounds
(items per flush, concurrent flushes, queued items) hold under racing callers."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.batcher import Batcher
from dispo.libs.db.down import ConnectionLost, database_unreachable


class Gate:
    """A flush that records its batches and waits for the test to let each one finish."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.open = asyncio.Event()
        self.running = 0
        self.most_running = 0

    async def flush(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.open.wait()
        finally:
            self.running -= 1
        return [i * 10 for i in items]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_each_caller_gets_the_result_of_its_own_item():
    async def flush(items: list[int]) -> list[int]:
        return [i * i for i in items]

    batcher = Batcher("squares", flush)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(50)))
    assert results == [i * i for i in range(50)]


async def test_items_arriving_during_a_flush_go_together_into_the_next():
    gate = Gate()
    batcher = Batcher("gated", gate.flush, max_items=100)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    assert gate.batches == [[0]]  # an idle batcher flushes at once
    rest = [asyncio.create_task(batcher.submit(i)) for i in range(1, 8)]
    await settle()
    assert gate.batches == [[0]]  # one flush at a time: the others wait
    gate.open.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [i * 10 for i in range(1, 8)]
    assert gate.batches == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert (batcher.flushes, batcher.flushed_items) == (2, 8)


async def test_a_flush_takes_at_most_max_items():
    gate = Gate()
    batcher = Batcher("small", gate.flush, max_items=3)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(10)]
    await settle()
    gate.open.set()
    await asyncio.gather(*calls)
    assert [len(b) for b in gate.batches] == [3, 3, 3, 1]
    assert sorted(i for b in gate.batches for i in b) == list(range(10))


async def test_concurrent_flushes_stay_within_the_bound():
    gate = Gate()
    batcher = Batcher("two at a time", gate.flush, max_items=1, concurrency=2)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(6)]
    await settle()
    assert gate.running == 2
    gate.open.set()
    await asyncio.gather(*calls)
    assert gate.most_running == 2
    assert len(gate.batches) == 6


async def test_an_error_of_the_flush_reaches_every_caller_of_that_flush_only():
    failing = {3}

    async def flush(items: list[int]) -> list[int]:
        if failing & set(items):
            raise ConnectionError("database went away")
        return items

    gate = asyncio.Event()

    async def gated(items: list[int]) -> list[int]:
        await gate.wait()
        return await flush(items)

    batcher = Batcher("fails", gated, max_items=2)
    calls = [asyncio.create_task(batcher.submit(0))]
    await settle()
    calls += [asyncio.create_task(batcher.submit(i)) for i in range(1, 5)]  # [0] [1,2] [3,4]
    await settle()
    gate.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert outcomes[:3] == [0, 1, 2]
    assert all(isinstance(o, ConnectionError) for o in outcomes[3:])


async def test_an_isolating_batcher_halves_a_failed_flush_down_to_the_item_that_fails():
    """One item that cannot be written fails alone: its batch mates are flushed again, in
    halves, so a large batch costs a few flushes, not one per item."""
    batches: list[list[int]] = []
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        await gate.wait()
        batches.append(list(items))
        if 3 in items:
            raise ValueError("3 cannot be stored")
        return items

    batcher = Batcher("isolating", flush, max_items=4, isolate=True)
    calls = [asyncio.create_task(batcher.submit(0))]
    await settle()
    calls += [asyncio.create_task(batcher.submit(i)) for i in range(1, 5)]  # [0] [1,2,3,4]
    await settle()
    gate.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)

    assert outcomes[:3] == [0, 1, 2] and outcomes[4] == 4
    assert isinstance(outcomes[3], ValueError)
    assert batches == [[0], [1, 2, 3, 4], [1, 2], [3, 4], [3], [4]]


async def test_an_isolating_batcher_finds_each_failing_item_of_a_large_flush_in_few_flushes():
    batches: list[list[int]] = []
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        await gate.wait()
        batches.append(list(items))
        if {5, 40} & set(items):
            raise ValueError("5 and 40 cannot be stored")
        return items

    batcher = Batcher("isolating", flush, max_items=64, isolate=True)
    calls = [asyncio.create_task(batcher.submit(0))]
    await settle()
    calls += [asyncio.create_task(batcher.submit(i)) for i in range(1, 65)]  # [0] [1..64]
    await settle()
    gate.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)

    failed = [i for i, o in enumerate(outcomes) if isinstance(o, ValueError)]
    assert failed == [5, 40]
    assert all(outcomes[i] == i for i in range(65) if i not in (5, 40))
    stored = sorted(i for b in batches if not {5, 40} & set(b) for i in b)
    assert stored == [i for i in range(65) if i not in (5, 40)]  # each stored once
    # [0], the 64, its two halves (each holds one), then for each failing item the two
    # halves of 16, 8, 4, 2 and 1: 24 flushes where one per item would take 66.
    assert len(batches) == 2 + 2 + 2 * 5 * 2


async def test_an_isolating_batcher_does_not_retry_when_the_database_is_unreachable():
    import asyncpg

    batches: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        batches.append(list(items))
        raise asyncpg.exceptions.CannotConnectNowError("the database system is starting up")

    batcher = Batcher("down", flush, max_items=4, isolate=True)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    outcomes = await asyncio.gather(
        first, *(batcher.submit(i) for i in range(1, 4)), return_exceptions=True
    )
    assert all(isinstance(o, asyncpg.exceptions.CannotConnectNowError) for o in outcomes)
    assert len(batches) == len({tuple(b) for b in batches})  # each batch tried once
    assert sum(len(b) for b in batches) == 4


async def test_an_exception_returned_for_one_item_is_raised_by_that_caller_alone():
    async def flush(items: list[int]) -> list[int | BaseException]:
        return [ValueError(f"bad {i}") if i % 2 else i for i in items]

    batcher = Batcher("per item", flush)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(4)), return_exceptions=True)
    assert outcomes[0] == 0 and outcomes[2] == 2
    assert [str(o) for o in outcomes[1::2]] == ["bad 1", "bad 3"]


async def test_a_flush_returning_the_wrong_number_of_results_fails_its_callers():
    async def flush(items: list[int]) -> list[int]:
        return items[:-1]

    batcher = Batcher("short", flush)
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        await batcher.submit(1)


async def test_callers_wait_for_room_when_the_queue_is_full():
    gate = Gate()
    batcher = Batcher("bounded", gate.flush, max_items=2, max_pending=2)
    first = asyncio.create_task(batcher.submit(0))  # taken by the first flush at once
    await settle()
    queued = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
    await settle()
    assert batcher.pending == 2
    blocked = asyncio.create_task(batcher.submit(3))
    await settle()
    assert batcher.pending == 2 and not blocked.done()  # no room: it waits, nothing queued
    gate.open.set()
    assert await asyncio.gather(first, *queued, blocked) == [0, 10, 20, 30]
    assert sorted(i for b in gate.batches for i in b) == [0, 1, 2, 3]


async def test_a_cancelled_caller_does_not_stop_the_others_of_its_flush():
    gate = Gate()
    batcher = Batcher("cancel", gate.flush)
    head = asyncio.create_task(batcher.submit(0))
    await settle()
    calls = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, 3)]
    await settle()
    calls[1].cancel()
    gate.open.set()
    assert await head == 0
    assert await calls[0] == 10 and await calls[2] == 30
    assert gate.batches == [[0], [1, 2, 3]]  # the cancelled item was flushed all the same


async def test_an_item_queued_as_the_last_flush_ends_is_still_flushed():
    """The flush finishes without suspending (its gate is open): the caller woken by the room
    it made queues its item while the flusher is returning; a new flusher must take it."""
    gate = Gate()
    batcher = Batcher("handover", gate.flush, max_items=1, max_pending=1)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    second = asyncio.create_task(batcher.submit(1))
    await settle()
    third = asyncio.create_task(batcher.submit(2))  # waits for room
    await settle()
    gate.open.set()
    assert await asyncio.wait_for(asyncio.gather(first, second, third), 5) == [0, 10, 20]


async def test_drain_waits_for_every_queued_item():
    done: list[int] = []

    async def flush(items: list[int]) -> list[None]:
        await asyncio.sleep(0)
        done.extend(items)
        return [None] * len(items)

    batcher = Batcher("drain", flush, max_items=4)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(10)]
    await asyncio.sleep(0)
    await batcher.drain()
    assert sorted(done) == list(range(10))
    await asyncio.gather(*calls)


def test_bounds_are_checked():
    async def flush(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Batcher("bad", flush, max_items=10, max_pending=5)


async def test_a_list_of_items_shares_flushes_and_gets_each_result_or_error_in_order():
    async def flush(items: list[int]) -> list[int | BaseException]:
        flushed.append(list(items))
        return [ValueError(i) if i < 0 else i * 2 for i in items]

    flushed: list[list[int]] = []
    batcher = Batcher("test", flush, max_items=3)
    results = await batcher.submit_all([1, -2, 3, 4])
    assert [r if isinstance(r, int) else repr(r) for r in results] == [
        2,
        "ValueError(-2)",
        6,
        8,
    ]
    assert flushed == [[1, -2, 3], [4]]


async def test_a_cancelled_error_raised_inside_a_flush_fails_its_callers_as_a_lost_connection():
    """A driver raising CancelledError though no one cancelled the flush (a connection
    closed under a statement) fails that flush's callers with a retryable error instead of
    leaving them waiting for ever; the next flush runs as usual."""
    interrupt = True

    async def flush(items: list[int]) -> list[int]:
        if interrupt:
            raise asyncio.CancelledError()
        return items

    batcher = Batcher("interrupted", flush, max_items=10)
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True), 5
    )
    assert all(isinstance(o, ConnectionLost) for o in outcomes), outcomes
    assert database_unreachable(outcomes[0])
    interrupt = False
    assert await asyncio.wait_for(batcher.submit(7), 5) == 7


async def test_a_flusher_that_is_cancelled_stops():
    gate = Gate()
    batcher = Batcher("stopping", gate.flush, max_items=10)
    call = asyncio.create_task(batcher.submit(1))
    await settle()
    [flusher] = batcher._flushers
    flusher.cancel()
    await asyncio.gather(flusher, return_exceptions=True)
    assert flusher.cancelled()
    call.cancel()


async def test_the_observer_hears_the_size_of_every_flush_that_committed_and_no_other():
    """What ``dispo_group_commit_items`` records: [0] alone, then the isolating halves of
    [1, 2, 3, 4] that committed ([1, 2] and [4]); the flushes that raised are not counted."""
    sizes: list[int] = []
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        await gate.wait()
        if 3 in items:
            raise ValueError("3 cannot be stored")
        return items

    batcher = Batcher("observed", flush, max_items=4, isolate=True, observe=sizes.append)
    calls = [asyncio.create_task(batcher.submit(0))]
    await settle()
    calls += [asyncio.create_task(batcher.submit(i)) for i in range(1, 5)]
    await settle()
    gate.set()
    await asyncio.gather(*calls, return_exceptions=True)

    assert sizes == [1, 2, 1]
    assert (batcher.flushes, batcher.flushed_items) == (3, 4)
