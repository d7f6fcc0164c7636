"""This gateway's shares of the businesses' Submit rate (ADR-0108): the rate a business may
submit at holds across every gateway, each gateway accepting at the share of it it leases
in the gateway's database (:mod:`dispo.libs.shares`), with a burst in proportion.

A Submit of a business this gateway holds no live share of takes one first (one
transaction); after that its Submits count against a token bucket in process, and the
shares of the businesses that submitted within a lease are renewed every third of a lease,
all in one transaction. A smaller share applies before it is written, a larger one once it
is committed; a business that asks for more than its share (refused Submits) makes the
others' gateways give way down to an equal part. A gateway that cannot renew a share stops
accepting that business's Submits when the share runs out.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.ratelimit import TokenBuckets
from dispo.libs.shares import divide, limit_shares_drop, limit_shares_others, limit_shares_put_many

# A share counts thousandths of a Submit a second.
UNIT = 1000
# Default of DISPO_GATEWAY_SHARE_LEASE_SECONDS.
SHARE_LEASE = 3.0


def submit_key(business: str) -> str:
    return f"submit:{business}"


@dataclass
class Held:
    """One business's share here: its bucket (None while the share is nothing), until when
    it is leased, and the Submits asked and refused since the last renewal."""

    bucket: TokenBuckets | None
    lease_until: datetime
    granted: int = 0
    asked: int = 0
    refused: int = 0
    idle: int = 0  # renewals in a row with no Submit asked


@dataclass
class SubmitShares:
    db: Database
    clock: Clock
    holder: str
    rate: float
    burst: int
    lease: float = SHARE_LEASE
    held: dict[str, Held] = field(default_factory=dict)
    _renewed: datetime | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def live(self, business: str) -> Held | None:
        held = self.held.get(business)
        if held is None or self.clock.now() >= held.lease_until:
            return None
        return held

    async def ensure(self, businesses: Iterable[str]) -> None:
        """Take a share of each of ``businesses`` that has no live one here (renewing the
        others with them)."""
        if all(self.live(b) is not None for b in businesses):
            return
        async with self._lock:  # Submits of a new business arriving together: one renewal
            missing = [b for b in businesses if self.live(b) is None]
            if missing:
                await self._renew(missing)

    async def renew(self) -> None:
        """Renew the shares of the businesses that submitted within a lease; the others' run
        out."""
        async with self._lock:
            await self._renew([])

    async def _renew(self, new: list[str]) -> None:
        now = self.clock.now()
        # A business that asked nothing for a whole lease is not renewed: its share runs out
        # (its next Submit takes one again).
        for business, held in list(self.held.items()):
            held.idle = held.idle + 1 if held.asked == 0 else 0
            if held.idle >= 3 or held.lease_until < now - timedelta(seconds=self.lease):
                del self.held[business]
        for business in new:
            self.held.setdefault(business, Held(None, now))
        businesses = sorted(self.held)
        if not businesses:
            return
        elapsed = max(1e-3, (now - (self._renewed or now)).total_seconds())
        capacity = max(1, round(self.rate * UNIT))
        async with self.db.transaction() as conn:
            keys = [submit_key(b) for b in businesses]
            others = await limit_shares_others(conn, self.holder, keys, now)
            now = self.clock.now()
            until = now + timedelta(seconds=self.lease)
            writes, grown = [], []
            for business, key in zip(businesses, keys, strict=True):
                held = self.held[business]
                wanted = self._wanted(held, elapsed, capacity)
                grant = divide(capacity, wanted, 0, others[key])
                # A new bucket starts full only when no other gateway holds a share: else
                # empty, so that the tokens the others hold are all the business has.
                full = not others[key]
                if grant.bound <= held.granted:
                    self._apply(business, held, grant.bound, full)
                else:
                    grown.append((business, held, grant.bound, full))
                held.asked = held.refused = 0
                writes.append((key, grant.recorded, wanted, until))
            await limit_shares_put_many(conn, self.holder, writes, now)
        self._renewed = now
        for business, held, bound, full in grown:
            self._apply(business, held, bound, full)
        for business in businesses:
            self.held[business].lease_until = until

    @staticmethod
    def _wanted(held: Held, elapsed: float, capacity: int) -> int:
        """What a business asks of this gateway: its Submits a second here since the last
        renewal, more than it holds when some were refused, the whole rate when new."""
        if held.bucket is None and held.granted == 0 and held.asked == 0:
            return capacity
        wanted = math.ceil(held.asked / elapsed * UNIT)
        if held.refused:
            wanted = max(wanted, held.granted + 1)
        return wanted

    def _apply(self, business: str, held: Held, granted: int, full: bool) -> None:
        held.granted = granted
        if granted <= 0:
            held.bucket = None
            return
        rate = granted / UNIT
        burst = max(1, math.floor(self.burst * granted / max(1, round(self.rate * UNIT))))
        if held.bucket is None:
            held.bucket = TokenBuckets(rate, burst, self.clock, max_keys=1)
            if not full:
                held.bucket.take(business, burst)  # its tokens come at its rate
        else:
            held.bucket.set_rate(rate, burst)

    async def drop(self) -> None:
        """Give every share back (the gateway stops)."""
        self.held.clear()
        async with self.db.transaction() as conn:
            await limit_shares_drop(conn, self.holder)
