"""Call slots of one downstream: at most its ``max_concurrency`` calls at once, handed out
in the order they were asked for (an :class:`asyncio.Semaphore`, counted for the gauges).

A slot is held from a node's claim to the end of its call, so a node waiting for one stays
PENDING. :meth:`Slots.take_now` lets a scheduling step claim a ready node in its own
transaction when a slot is free this instant and no one is queued for one; otherwise the
node asks with :meth:`Slots.take` and is claimed on its own once it has one.
"""

from __future__ import annotations

import asyncio


class Slots:
    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._semaphore = asyncio.Semaphore(self.size)
        self.held = 0  # calls under way
        self.waiting = 0  # nodes queued for a slot

    async def take_now(self) -> bool:
        """Take a slot if one is free and no one is queued for one (never jumps the queue),
        without waiting: a semaphore that is not ``locked`` is acquired at once."""
        if self._semaphore.locked():
            return False
        await self._semaphore.acquire()
        self.held += 1
        return True

    async def take(self) -> None:
        """Take a slot, waiting in line for one."""
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.held += 1

    def give_back(self) -> None:
        """Return a slot: to the first one still waiting, else to the free ones."""
        self.held -= 1
        self._semaphore.release()
