"""Call slots of one downstream: at most its ``max_concurrency`` calls at once, handed out
in the order they were asked for.

A slot is held from a node's claim to the end of its call, so a node waiting for one stays
PENDING. :meth:`Slots.take_now` lets a scheduling step claim a ready node in its own
transaction when a slot is free this instant and no one is queued for one; otherwise the
node asks with :meth:`Slots.take` and is claimed on its own once it has one.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._free = self.size
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return sum(not w.done() for w in self._waiting)

    def take_now(self) -> bool:
        """Take a slot if one is free and no one is queued for one (never jumps the queue)."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting in line for one."""
        if self.take_now():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed one as the wait was cancelled: pass it on
            else:
                self._waiting.remove(waiter)
            raise

    def give_back(self) -> None:
        """Return a slot: to the first one still waiting, else to the free ones."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
