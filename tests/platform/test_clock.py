import asyncio
from datetime import UTC, datetime, timedelta

from dispo.libs.clock import FileClock, clock_from_spec, sleep_until_stopped, write_file_clock


async def test_manual_clock_sleepers_wake_only_when_time_passes(manual_clock):
    woke = asyncio.Event()

    async def sleeper():
        await manual_clock.sleep(600)
        woke.set()

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    manual_clock.advance(599)
    await asyncio.sleep(0)
    assert not woke.is_set()
    manual_clock.advance(1)
    await asyncio.wait_for(task, 1)
    assert woke.is_set()


async def _let_tasks_start() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_sleep_until_stopped_wakes_on_the_clock_or_on_stop_and_leaves_no_task(manual_clock):
    before = asyncio.all_tasks()
    stop = asyncio.Event()

    slept = asyncio.create_task(sleep_until_stopped(manual_clock, 60, stop))
    await _let_tasks_start()  # the deadline counts from when the inner sleep starts
    manual_clock.advance(59)
    await _let_tasks_start()
    assert not slept.done()
    manual_clock.advance(2)
    assert await asyncio.wait_for(slept, 1) is False

    assert asyncio.all_tasks() == before

    async def stopped_then_tasks() -> tuple[bool, set[asyncio.Task]]:
        stopped = await sleep_until_stopped(manual_clock, 60, stop)
        return stopped, asyncio.all_tasks() - {asyncio.current_task()}

    waiting = asyncio.create_task(stopped_then_tasks())
    await _let_tasks_start()
    stop.set()
    stopped, tasks = await asyncio.wait_for(waiting, 1)
    assert stopped is True  # the clock never moved
    assert tasks == before  # its waits are finished, not merely cancelled
    assert await sleep_until_stopped(manual_clock, 60, stop) is True  # already stopped: at once


def test_file_clock_follows_the_file(tmp_path):
    path = tmp_path / "clock"
    start = datetime(2026, 3, 1, 12, tzinfo=UTC)
    write_file_clock(path, start)
    clock = clock_from_spec(f"file:{path}")
    assert isinstance(clock, FileClock)
    assert clock.now() == start
    write_file_clock(path, start + timedelta(hours=2))
    assert clock.now() == start + timedelta(hours=2)
