"""Call slots of one downstream: at most its ``max_concurrency`` calls at once, handed to
the nodes waiting for one in the fair order (:mod:`dispo.executor.fair`: weighted
round-robin across businesses, then priority, then arrival; ADR-0109).

A slot is held from a node's claim to the end of its call, so a node waiting for one stays
PENDING. :meth:`Slots.take_now` lets a scheduling step claim a ready node in its own
transaction when a slot is free this instant and no one is queued for one; otherwise the
node asks with :meth:`Slots.take` and is claimed on its own once it has one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispo.executor.fair import DEFAULT_PRIORITY, FairQueue, equal


class Slots:
    def __init__(self, size: int, weight: Callable[[str], int] = equal) -> None:
        self.size = max(1, size)
        self.held = 0  # calls under way
        self._line: FairQueue[asyncio.Future[None]] = FairQueue(weight)

    @property
    def waiting(self) -> int:
        """Nodes queued for a slot."""
        return len(self._line)

    async def take_now(self) -> bool:
        """Take a slot if one is free and no one is queued for one (never jumps the queue),
        without waiting."""
        if self.held >= self.size or self._line:
            return False
        self.held += 1
        return True

    async def take(self, business: str = "", priority: int = DEFAULT_PRIORITY) -> None:
        """Take a slot, waiting in the fair order for one."""
        if self.held < self.size and not self._line:
            self.held += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.push(business, priority, turn)
        try:
            await turn
        except asyncio.CancelledError:
            if not self._line.remove(business, turn) and turn.done() and not turn.cancelled():
                self.give_back()  # handed a slot as it gave up: pass it on
            raise

    def give_back(self) -> None:
        """Return a slot: to the next one waiting in the fair order, else to the free ones."""
        picked = self._line.pop()
        if picked is None:
            self.held -= 1
        else:
            picked[1].set_result(None)  # the slot changes hands: ``held`` stays
