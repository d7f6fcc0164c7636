"""Injectable time. Production code asks a :class:`Clock`; tests drive a :class:`ManualClock`.

A separate process under test can be given ``DISPO_CLOCK=file:<path>``: its clock reads the
current time (ISO 8601 or epoch seconds) from that file, and the test advances time by
rewriting it (:func:`write_file_clock`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (a manual clock waits until advanced)."""
        ...


async def sleep_until_stopped(clock: Clock, seconds: float, stop: asyncio.Event) -> bool:
    """Wait ``seconds`` of ``clock`` unless ``stop`` is set first; True when stopped.

    The pause of a background loop (``while not await sleep_until_stopped(...)``). Both
    waits are cancelled and finished before it returns, so no task is left behind.
    """
    if stop.is_set():
        return True
    waits = {asyncio.ensure_future(clock.sleep(seconds)), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await asyncio.wait(waits)
    return stop.is_set()


async def within(clock: Clock, seconds: float, work: Awaitable[T]) -> T:
    """``work``'s result if it ends within ``seconds`` of ``clock``; otherwise it is cancelled
    and :class:`TimeoutError` raised. A total deadline on the injectable clock, where a
    network client's own timeouts bound each read only (a peer sending a byte now and then
    never trips those). Both waits are finished before it returns."""
    job = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({job, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (job, timer):
            task.cancel()
        await asyncio.wait({job, timer})
    if job.cancelled():
        raise TimeoutError(f"not done within {seconds:g} s")
    return job.result()


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; sleepers wake when time passes their deadline."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._changed = asyncio.Event()
        # What sleepers asked for, in order of the calls, and how many are waiting now: a
        # test sees that (and for how long) the code under test waits on this clock.
        self.sleeps: list[float] = []
        self.waiting = 0

    def now(self) -> datetime:
        return self._now

    def set(self, moment: datetime) -> None:
        self._now = moment
        self._changed.set()
        self._changed = asyncio.Event()

    def advance(self, seconds: float = 0, **delta: float) -> datetime:
        self.set(self._now + timedelta(seconds=seconds, **delta))
        return self._now

    async def sleep(self, seconds: float) -> None:
        deadline = self._now + timedelta(seconds=seconds)
        self.sleeps.append(seconds)
        self.waiting += 1
        try:
            while self._now < deadline:
                await self._changed.wait()
        finally:
            self.waiting -= 1


class FileClock:
    """Reads the time from a file on every call; sleeps poll the file briefly."""

    poll_interval = 0.05

    def __init__(self, path: Path) -> None:
        self.path = path

    def now(self) -> datetime:
        return parse_moment(self.path.read_text().strip())

    async def sleep(self, seconds: float) -> None:
        deadline = self.now() + timedelta(seconds=seconds)
        while self.now() < deadline:
            await asyncio.sleep(self.poll_interval)


def parse_moment(text: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        moment = datetime.fromisoformat(text)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def write_file_clock(path: Path, moment: datetime) -> None:
    """Set a :class:`FileClock`'s time atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(moment.isoformat())
    tmp.replace(path)


def clock_from_spec(spec: str) -> Clock:
    """``system`` or ``file:<path>`` (see the module doc)."""
    if spec == "system":
        return SystemClock()
    if spec.startswith("file:"):
        return FileClock(Path(spec.removeprefix("file:")))
    raise ValueError(f"unknown clock {spec!r}: expected 'system' or 'file:<path>'")
