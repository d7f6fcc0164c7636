"""Waiting on a condition with a bound: the one way tests wait for something to happen."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class NotReached(AssertionError):
    """The condition did not hold within the bound; says what was wanted and what was seen."""


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    until: Callable[[T], Any] = bool,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    wanted: str = "the condition",
    describe: Callable[[T], str] = repr,
) -> T:
    """Call ``probe`` (sync or async) every ``interval`` seconds until ``until(value)`` holds,
    and return that value.

    After ``timeout`` seconds raise :class:`NotReached` naming ``wanted`` and the last value
    seen (rendered with ``describe``). ``probe`` is always called at least once, and once
    more after the deadline, so a slow probe cannot make the wait give up early.

        view = await eventually(lambda: client.get(task_id), lambda v: v.status == "SUCCEEDED")
        await eventually(lambda: len(received) >= 3, wanted="three deliveries")
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        past_deadline = loop.time() > deadline
        value: Any = probe()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        if past_deadline:
            raise NotReached(
                f"{wanted} not reached within {timeout} s; last seen: {describe(value)}"
            )
        await asyncio.sleep(interval)
