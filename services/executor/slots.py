"""Call slots of one downstream: at most its ``max_concurrency`` calls at once, handed to
the nodes waiting for one in the fair order (:mod:`dispo.executor.fair`: weighted
round-robin across businesses, then priority, then arrival; ADR-0109); and its pace: at
most its ``max_calls_per_second`` calls in each second of the clock.

Both limits hold for the whole cluster (ADR-0108): what bounds this process is its *share*
of each (:mod:`dispo.executor.shares` renews it, :mod:`dispo.libs.shares` divides it), set
here with :meth:`Slots.resize` and :meth:`Pace.share`. *Which* node gets the next slot is
the order of the waiters, kept apart from how many this process may hold.

A slot is held from a node's claim to the end of its call, so a node waiting for one stays
PENDING. :meth:`Slots.take_now` lets a scheduling step claim a ready node in its own
transaction when a slot is free this instant and no one is queued for one; otherwise the
node asks with :meth:`Slots.take` and is claimed on its own once it has one.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import datetime, timedelta

from dispo.executor.fair import DEFAULT_PRIORITY, FairQueue, equal
from dispo.libs.clock import Clock


class Slots:
    def __init__(
        self, size: int, bound: int | None = None, weight: Callable[[str], int] = equal
    ) -> None:
        self.size = max(1, size)  # the downstream's limit
        # What this process may hold now: its share of the limit (all of it by default).
        self.bound = self.size if bound is None else bound
        self.held = 0  # calls under way
        self._line: FairQueue[asyncio.Future[None]] = FairQueue(weight)
        # Until when the share is leased (None: not leased, the bound is this process's own):
        # a call starts only while the lease outlasts its timeout (:meth:`covers`).
        self.lease_until: datetime | None = None
        # Called when a node has to queue (the share renewed sooner when it is short).
        self.short: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        """Nodes queued for a slot."""
        return len(self._line)

    async def take_now(self) -> bool:
        """Take a slot if one is free and no one is queued for one (never jumps the queue),
        without waiting."""
        if self._line or self.held >= self.bound:
            return False
        self.held += 1
        return True

    async def take(self, business: str = "", priority: int = DEFAULT_PRIORITY) -> None:
        """Take a slot, waiting in the fair order for one."""
        if not self._line and self.held < self.bound:
            self.held += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.push(business, priority, turn)
        if self.short is not None and self.bound < self.size:
            self.short()
        try:
            await turn
        except asyncio.CancelledError:
            if not self._line.remove(business, turn) and turn.done() and not turn.cancelled():
                self.give_back()  # handed a slot as it gave up: pass it on
            raise

    def give_back(self) -> None:
        """Return a slot: to the next one waiting in the fair order, else to the free ones."""
        self.held -= 1
        self._wake()

    def resize(self, bound: int) -> None:
        """This process may hold ``bound`` slots from now (held ones above it end as their
        calls do)."""
        self.bound = max(0, bound)
        self._wake()

    def covers(self, now: datetime, timeout: float) -> bool:
        """May a call of at most ``timeout`` seconds start now: it ends within the lease of
        the share (after which the others may hold its slot)?"""
        return self.lease_until is None or now + timedelta(seconds=timeout) <= self.lease_until

    def _wake(self) -> None:
        while self.held < self.bound:
            picked = self._line.pop()
            if picked is None:
                return
            turn = picked[1]
            if turn.done():
                continue
            self.held += 1
            turn.set_result(None)


# The calls of a second leave within its first four fifths: one delayed by up to a fifth of
# a second on its way still lands in its own second at the downstream.
PACE_SPREAD = 0.8


class Pace:
    """At most ``bound`` calls in each second of the clock (from one whole second to the
    next), spaced evenly through its first :data:`PACE_SPREAD`, so a call that arrives a
    little late still lands in its second. ``rate`` is the downstream's limit, ``bound`` this process's
    share of it: a smaller share applies at once, a larger one from the next second (the
    share was divided assuming the others' old shares for this second)."""

    def __init__(self, rate: int, clock: Clock, bound: int | None = None) -> None:
        self.rate = rate
        self.clock = clock
        self.bound = rate if bound is None else bound
        self._larger: tuple[int, int] | None = None  # (from second, bound)
        self._second = -1
        self._used = 0  # calls in that second
        self.waiting = 0
        self.asked = 0  # calls that asked, ever (the share's demand is their rate)
        self.lease_until: datetime | None = None  # as for Slots
        self.short: Callable[[], None] | None = None

    def share(self, bound: int, now: datetime) -> None:
        if bound <= self.bound:
            self.bound, self._larger = bound, None
        else:
            self._larger = (math.floor(now.timestamp()) + 1, bound)

    async def wait(self, patience: float) -> bool:
        """Wait for this call's turn, however long the share makes it; False when this
        process has held no live share for ``patience`` seconds (cut off from the shared
        state: the call is not sent)."""
        self.asked += 1
        self.waiting += 1
        unleased: datetime | None = None  # since when no share was leased
        try:
            while True:
                now = self.clock.now()
                t = now.timestamp()
                second = math.floor(t)
                if self._larger is not None and second >= self._larger[0]:
                    self.bound, self._larger = self._larger[1], None
                if second != self._second:
                    self._second, self._used = second, 0
                leased = self.lease_until is None or now < self.lease_until
                if not leased:
                    unleased = unleased or now
                    if (now - unleased).total_seconds() >= patience:
                        return False
                    await self.clock.sleep(0.1)
                    continue
                unleased = None
                if self._used < self.bound:
                    at = second + PACE_SPREAD * self._used / self.bound
                    if at <= t:
                        self._used += 1
                        return True
                    await self.clock.sleep(at - t)
                    continue
                if self.short is not None and self.bound < self.rate:
                    self.short()
                await self.clock.sleep(min(second + 1 - t, 0.1))
        finally:
            self.waiting -= 1
