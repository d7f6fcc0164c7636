"""What a gateway lets a business do: Submits at a bounded rate (a token bucket per
business, RESOURCE_EXHAUSTED with a RetryInfo saying when to come back) and a bounded
number of WatchTask streams open at once.

The Submit rate holds across every gateway (ADR-0108): each gateway counts against its
share of it (:mod:`dispo.gateway.shares`), taken before the first Submit of a business and
renewed in the background. The WatchTask streams are counted per process: behind N
gateways a business may hold N times the streams (docs/security.md, *Limits*).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from dispo.gateway.shares import SubmitShares
from dispo.libs.clock import Clock
from dispo.libs.errors import ResourceExhausted
from dispo.libs.ratelimit import Slots, TokenBuckets

# Defaults of the settings (DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND, _SUBMIT_BURST,
# _MAX_WATCHES_PER_BUSINESS).
SUBMIT_RATE_PER_SECOND = 100.0
SUBMIT_BURST = 200
MAX_WATCHES_PER_BUSINESS = 100
# The most tasks one SubmitMany may carry (gateway.proto says so too).
MAX_SUBMIT_MANY = 500


def limited_business(context: Any, requested: str) -> str:
    """The business a call's limits count against: the business the request names (callers
    carry no token yet). Once they do, the token's business, so that a caller cannot spread
    its calls over business names."""
    return requested


class CallerLimits:
    def __init__(
        self,
        clock: Clock,
        *,
        submit_rate: float = SUBMIT_RATE_PER_SECOND,
        submit_burst: int = SUBMIT_BURST,
        max_watches: int = MAX_WATCHES_PER_BUSINESS,
        shares: SubmitShares | None = None,
    ) -> None:
        self.submits = TokenBuckets(submit_rate, submit_burst, clock)
        self.watches = Slots(max_watches)
        # The shares of the rate across the gateways (None: the rate counted here alone).
        self.shares = shares if submit_rate else None

    async def prepare(self, businesses: Iterable[str]) -> None:
        """Before :meth:`admit_submit`: a share of the rate of each business (one
        transaction when this gateway holds none of one)."""
        if self.shares is not None:
            await self.shares.ensure(businesses)

    def admit_submit(self, business: str, count: int = 1) -> None:
        """Take ``count`` of ``business``'s Submit tokens (one per task: a SubmitMany takes
        all of its items' at once, or none), or refuse with when to retry."""
        if self.shares is None:
            self._take(self.submits, business, count)
            return
        held = self.shares.live(business)
        if held is not None:
            held.asked += count
        if held is None or held.bucket is None:  # its share is nothing now: the others hold it
            if held is not None:
                held.refused += count
            wait = self.shares.lease / 3
            raise ResourceExhausted(
                f"business {business!r} is over its Submit rate ({self.submits.rate:g} a second"
                f" across the gateways, bursts of {self.submits.burst:g}); retry in {wait:.3f} s",
                retry_after=wait,
            )
        try:
            self._take(held.bucket, business, count)
        except ResourceExhausted:
            held.refused += count
            raise

    def _take(self, bucket: TokenBuckets, business: str, count: int) -> None:
        wait = bucket.take(business, count)
        if wait == float("inf"):
            raise ResourceExhausted(
                f"a call of {count} tasks is more than business {business!r} may submit at once"
                f" (bursts of {self.submits.burst:g}); send fewer per call",
                field="requests",
            )
        if wait:
            raise ResourceExhausted(
                f"business {business!r} is over its Submit rate"
                f" ({self.submits.rate:g} a second, bursts of {self.submits.burst:g});"
                f" retry in {wait:.3f} s",
                retry_after=wait,
            )

    def admit_submits(self, counts: dict[str, int]) -> None:
        """:meth:`admit_submit` of several businesses' tasks at once (a SubmitMany of an
        admin may name several): all of them taken, or none."""
        taken: list[tuple[str, int]] = []
        try:
            for business, count in counts.items():
                self.admit_submit(business, count)
                taken.append((business, count))
        except ResourceExhausted:
            for business, count in taken:
                self._give_back(business, count)
            raise

    def _give_back(self, business: str, count: int) -> None:
        if self.shares is None:
            self.submits.give_back(business, count)
            return
        held = self.shares.live(business)
        if held is not None and held.bucket is not None:
            held.bucket.give_back(business, count)

    @contextlib.contextmanager
    def watching(self, business: str) -> Iterator[None]:
        """Hold one of ``business``'s WatchTask streams for the ``with`` block, or refuse."""
        if not self.watches.acquire(business):
            raise ResourceExhausted(
                f"business {business!r} has {self.watches.cap} WatchTask streams open on this"
                " gateway, the most it may; end one, or poll GetTask"
            )
        try:
            yield
        finally:
            self.watches.release(business)
