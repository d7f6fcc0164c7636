import asyncio
from datetime import UTC, datetime, timedelta

from dispo.libs.clock import FileClock, clock_from_spec, write_file_clock


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


def test_file_clock_follows_the_file(tmp_path):
    path = tmp_path / "clock"
    start = datetime(2026, 3, 1, 12, tzinfo=UTC)
    write_file_clock(path, start)
    clock = clock_from_spec(f"file:{path}")
    assert isinstance(clock, FileClock)
    assert clock.now() == start
    write_file_clock(path, start + timedelta(hours=2))
    assert clock.now() == start + timedelta(hours=2)
