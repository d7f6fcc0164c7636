"""What one gateway process lets a business do: Submits at a bounded rate (a token bucket
per business, RESOURCE_EXHAUSTED with a RetryInfo saying when to come back) and a bounded
number of WatchTask streams open at once.

The limits are per process: behind N gateways a business may submit N times the rate and
hold N times the streams (docs/security.md, *Limits*).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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
    ) -> None:
        self.submits = TokenBuckets(submit_rate, submit_burst, clock)
        self.watches = Slots(max_watches)

    def admit_submit(self, business: str, count: int = 1) -> None:
        """Take ``count`` of ``business``'s Submit tokens (one per task: a SubmitMany takes
        all of its items' at once, or none), or refuse with when to retry."""
        wait = self.submits.take(business, count)
        if wait == float("inf"):
            raise ResourceExhausted(
                f"a call of {count} tasks is more than business {business!r} may submit at once"
                f" on this gateway (bursts of {self.submits.burst:g}); send fewer per call",
                field="requests",
            )
        if wait:
            raise ResourceExhausted(
                f"business {business!r} is over its Submit rate on this gateway"
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
                self.submits.give_back(business, count)
            raise

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
