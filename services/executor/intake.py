"""Which task.create messages in hand start their pass, and when (ADR-0109).

Every accepted task reaches the executors through one durable consumer in arrival order, so
the executor reads ahead: it holds many more messages than it runs passes, and starts the
next pass in the fair order (:mod:`dispo.executor.fair`: weighted round-robin across
businesses, then priority, then arrival). One business's flood cannot hold the others back
there, and not in the stream either: once it has ``hold`` messages waiting here, its next
ones are handed back to the stream (a delayed NAK, see :meth:`Intake.enter`) and the
consumer reads on to the other businesses' messages behind them.

A paused business's messages wait here (up to an eighth of ``hold``: held messages of paused
businesses must not fill the consumer's window) and are handed back beyond; they start on
resume. At most ``capacity`` messages wait here in all (the consumer's batch less the
passes); beyond, any is handed back. What is waiting here, by business, is
:meth:`Intake.depths`. Once the executor stops, :meth:`Intake.close` hands back every
message still waiting, and every one that comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dispo.executor.fair import FairQueue, equal

# A message handed back comes again after at least / at most this many seconds.
MIN_COMEBACK = 0.5
MAX_COMEBACK = 30.0
# Starts are counted per business over buckets of this many seconds (its recent rate).
RATE_BUCKET = 5.0


@dataclass
class _Rate:
    """Passes a business started lately: this bucket's and the last one's."""

    since: float
    count: int = 0
    last: int = 0

    def add(self, now: float) -> None:
        self._roll(now)
        self.count += 1

    def per_second(self, now: float) -> float:
        self._roll(now)
        span = now - self.since + (RATE_BUCKET if self.last else 0.0)
        return (self.count + self.last) / span if span > 0.5 else 0.0

    def _roll(self, now: float) -> None:
        if now - self.since >= RATE_BUCKET:
            self.last = self.count if now - self.since < 2 * RATE_BUCKET else 0
            self.count, self.since = 0, now


@dataclass
class Intake:
    # Passes running at once at most, and messages of one business waiting for one.
    passes: int
    hold: int
    weight: Callable[[str], int] = equal
    now: Callable[[], float] = time.monotonic
    paused: set[str] = field(default_factory=set)
    running: int = 0
    # Messages waiting here at most, all businesses together (0: no bound but the holds).
    capacity: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self._line: FairQueue[asyncio.Future[float | None]] = FairQueue(self.weight)
        self._rates: dict[str, _Rate] = {}
        # Per business: when the last message it handed back comes again.
        self._horizon: dict[str, float] = {}

    def depths(self) -> dict[str, int]:
        """Messages waiting here for a pass, by business."""
        return self._line.depths()

    async def enter(self, business: str, priority: int) -> float | None:
        """Wait for this message's turn to run its pass (None: go; call :meth:`leave` when
        the pass ends), or the seconds after which it should come again (hand it back)."""
        if self.closed:
            return MIN_COMEBACK
        if (
            self.running < self.passes and not self._line and business not in self.paused
        ):  # fast path: nothing waits
            self._started(business)
            return None
        hold = max(1, self.hold // 8) if business in self.paused else self.hold
        if self._line.depth(business) >= hold or (
            self.capacity and len(self._line) >= self.capacity
        ):
            return self._comeback(business)
        turn: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._line.push(business, priority, turn)
        self._grant()  # a pass may be free while only paused businesses wait
        try:
            comeback = await turn
        except asyncio.CancelledError:
            if (
                not self._line.remove(business, turn)
                and turn.done()
                and not turn.cancelled()
                and turn.result() is None
            ):
                self.leave(business)
            raise
        return comeback

    def close(self) -> None:
        """Hand back every message waiting here, and every one that comes from now on: the
        executor is stopping (a paused business's would never start)."""
        self.closed = True
        while (picked := self._line.pop()) is not None:
            if not picked[1].done():
                picked[1].set_result(MIN_COMEBACK)

    def leave(self, _business: str) -> None:
        """A pass ended: start the next in the fair order."""
        self.running -= 1
        self._grant()

    def pause(self, business: str) -> None:
        self.paused.add(business)

    def resume(self, business: str) -> None:
        self.paused.discard(business)
        self._horizon.pop(business, None)
        self._grant()

    def set_paused(self, businesses: set[str]) -> None:
        for business in self.paused - businesses:
            self.resume(business)
        self.paused |= businesses

    def _grant(self) -> None:
        while self.running < self.passes:
            picked = self._line.pop(lambda b: b not in self.paused)
            if picked is None:
                return
            business, turn = picked
            if turn.done():  # its waiter gave up as it was picked
                continue
            self._started(business)
            turn.set_result(None)

    def _started(self, business: str) -> None:
        self.running += 1
        now = self.now()
        rate = self._rates.get(business)
        if rate is None:
            rate = self._rates[business] = _Rate(now)
        rate.add(now)

    def _comeback(self, business: str) -> float:
        """When a message handed back now should come again: spread after the ones it
        handed back before, one per pass the business starts (its recent rate), so they
        come back about when there is room for them rather than all at once."""
        now = self.now()
        rate = self._rates.get(business)
        if business in self.paused:
            step = MAX_COMEBACK
        else:  # before its rate is known: as if every pass were its
            per_second = rate.per_second(now) if rate is not None else 0.0
            step = 1.0 / (per_second or self.passes)
        horizon = min(max(self._horizon.get(business, now), now) + step, now + MAX_COMEBACK)
        self._horizon[business] = horizon
        return max(MIN_COMEBACK, horizon - now)
