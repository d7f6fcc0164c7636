"""This executor's shares of its downstreams' cluster-wide limits (ADR-0108): its call
slots (of ``max_concurrency``) and its pace (of ``max_calls_per_second``), renewed in the
executor's database every third of a share lease, all in one transaction
(:mod:`dispo.libs.shares`), and sooner when a node has to wait while this executor holds
less than the whole limit.

A smaller share applies before it is written (what the others are told this executor holds
is never less than it may use); a larger one once it is committed (a pace's, from the next
second). A share that cannot be renewed runs out: a slot's lease must outlast a call's
timeout for the call to start, a pace sends nothing past its lease, so an executor cut off
from its database calls nothing the others might also count on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispo.executor.fair import equal
from dispo.executor.per_business import BusinessLimits, business_pace_key, business_slots_key
from dispo.executor.slots import Pace, Slots
from dispo.libs.catalogue import Downstream
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.logging import get_logger
from dispo.libs.shares import (
    Grant,
    Use,
    divide,
    limit_shares_drop,
    limit_shares_others,
    limit_shares_put_many,
    limit_shares_use,
)

log = get_logger(__name__)

# Defaults of DISPO_EXECUTOR_SHARE_LEASE_SECONDS.
SHARE_LEASE = 3.0


def slots_key(downstream: str) -> str:
    return f"downstream:{downstream}:calls"


def pace_key(downstream: str) -> str:
    return f"downstream:{downstream}:per_second"


@dataclass
class DownstreamShares:
    """Renews the shares of ``slots`` and ``paces`` (by downstream) held by ``holder``."""

    db: Database
    clock: Clock
    holder: str
    slots: dict[str, Slots]
    paces: dict[str, Pace]
    # Seconds a slot's share is leased beyond the share lease: the longest call's timeout.
    timeouts: dict[str, float]
    lease: float = SHARE_LEASE
    # Runs a renewal now (the periodic's kick), asked for at most every tenth of a lease by
    # a node that has to wait while this executor holds less than the limit.
    kick: Callable[[], None] | None = None
    # Calls that asked for a pace's turn at the last renewal, and when (its demand's rate).
    _asked: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    _kicked: datetime | None = None
    # Each business's weight in the order its nodes get a slot (ADR-0109).
    weight: Callable[[str], int] = equal
    # Each business's own slots and paces of the downstreams limited per business, leased
    # with the downstreams' own (keys per downstream and business).
    business: BusinessLimits | None = None

    def short(self) -> None:
        now = self.clock.now()
        if self.kick is None:
            return
        if self._kicked is None or (now - self._kicked).total_seconds() >= self.lease / 10:
            self._kicked = now
            self.kick()

    @classmethod
    def of(
        cls,
        db: Database,
        clock: Clock,
        holder: str,
        registry: dict[str, Downstream],
        timeouts: dict[str, float],
        lease: float,
        weight: Callable[[str], int] = equal,
    ) -> DownstreamShares:
        """Slots and paces of ``registry``'s downstreams holding nothing yet; a slot goes
        to the next waiter in the fair order of ``weight`` (ADR-0109)."""
        shares = cls(db, clock, holder, {}, {}, dict(timeouts), lease, weight=weight)
        shares.business = BusinessLimits(clock, leased=True, short=shares.short)
        for name, downstream in registry.items():
            shares.put(name, downstream)
        return shares

    def put(self, name: str, downstream: Downstream, timeout: float | None = None) -> None:
        """Slots (and a pace) of ``downstream`` holding nothing yet, in place of any it had
        (a newer catalogue version's limits: the calls under way give theirs back where they
        took them); renewed with the others from the next renewal on."""
        if timeout is not None:
            self.timeouts[name] = timeout
        slots = Slots(downstream.max_concurrency, bound=0, weight=self.weight)
        leased: list[Slots | Pace] = [slots]
        self.slots[name] = slots
        if downstream.max_calls_per_second:
            pace = Pace(downstream.max_calls_per_second, self.clock, bound=0)
            self.paces[name] = pace
            leased.append(pace)
        else:
            self.paces.pop(name, None)
        if self.business is not None:
            self.business.put(name, downstream.per_business)
        never = self.clock.now()
        for limited in leased:
            limited.lease_until = never
            limited.short = self.short

    async def renew(self) -> None:
        """Renew every share now (one transaction); a share this executor could not renew
        is held at nothing once its lease has run out."""
        try:
            await self._renew()
        except Exception:
            now = self.clock.now()
            every: list[Slots] = [*self.slots.values()]
            if self.business is not None:
                every += self.business.slots.values()
            for slots in every:
                if slots.lease_until is not None and now >= slots.lease_until:
                    slots.resize(0)
            raise

    def _leased(self) -> tuple[list[tuple[str, str, Slots]], list[tuple[str, Pace]]]:
        """Every slots' key, downstream and slots, and every pace's key and pace: the
        downstreams' own, then each business's (those idle for a lease dropped first)."""
        slots = [(slots_key(n), n, s) for n, s in self.slots.items()]
        paces = [(pace_key(n), p) for n, p in self.paces.items()]
        if self.business is not None:
            self.business.drop_idle(self.lease)
            for (name, business), held in self.business.slots.items():
                slots.append((business_slots_key(name, business), name, held))
            for (name, business), pace in self.business.paces.items():
                paces.append((business_pace_key(name, business), pace))
        return slots, paces

    async def _renew(self) -> None:
        every_slots, every_pace = self._leased()
        keys = [k for k, _, _ in every_slots] + [k for k, _ in every_pace]
        known = set(keys)
        self._asked = {k: v for k, v in self._asked.items() if k in known}
        async with self.db.transaction() as conn:
            now = self.clock.now()
            others = await limit_shares_others(conn, self.holder, keys, now)
            # Decided and the smaller shares applied with no await in between: what is
            # written is never less than what this executor may use.
            writes: list[tuple[str, int, int, datetime]] = []
            grown: list[tuple[Slots, int]] = []
            paced: list[tuple[Pace, int]] = []
            for key, name, slots in every_slots:
                until = now + timedelta(seconds=self.lease + self.timeouts.get(name, 0.0))
                wanted = slots.held + slots.waiting
                grant = divide(slots.size, wanted, slots.held, others.get(key, []))
                if grant.bound < slots.bound:
                    slots.resize(grant.bound)
                else:
                    grown.append((slots, grant.bound))
                writes.append((key, grant.recorded, wanted, until))
            for key, pace in every_pace:
                until = now + timedelta(seconds=self.lease)
                wanted = self._pace_demand(key, pace, now)
                grant = divide(pace.rate, wanted, 0, others.get(key, []))
                pace.share(min(grant.bound, pace.bound), now)
                paced.append((pace, grant.bound))
                writes.append((key, grant.recorded, wanted, until))
            await limit_shares_put_many(conn, self.holder, writes, now)
        for slots, bound in grown:
            slots.resize(bound)
        leased: list[Slots | Pace] = [s for _, _, s in every_slots] + [p for _, p in every_pace]
        for limited, (_, _, _, until) in zip(leased, writes, strict=True):
            limited.lease_until = until
        for pace, bound in paced:
            pace.share(bound, now)

    def _pace_demand(self, key: str, pace: Pace, now: datetime) -> int:
        """Calls a second this executor's nodes asked for since the last renewal, and one
        more for each still waiting for its turn."""
        asked, since = self._asked.get(key, (0, now))
        self._asked[key] = (pace.asked, now)
        elapsed = (now - since).total_seconds()
        rate = (pace.asked - asked) / elapsed if elapsed > 0 else 0.0
        return math.ceil(rate) + pace.waiting

    async def drop(self) -> None:
        """Give every share back (the executor stops)."""
        for slots in self.slots.values():
            slots.resize(0)
        for pace in self.paces.values():
            pace.share(0, self.clock.now())
        if self.business is not None:
            for _, limited in self.business.items():
                if isinstance(limited, Slots):
                    limited.resize(0)
                else:
                    limited.share(0, self.clock.now())
        async with self.db.transaction() as conn:
            await limit_shares_drop(conn, self.holder)

    async def use(self) -> dict[str, Use]:
        """The cluster's use of every limit of these downstreams (for ListDownstreams)."""
        keys = [slots_key(n) for n in self.slots] + [pace_key(n) for n in self.paces]
        async with self.db.connection() as conn:
            return await limit_shares_use(conn, keys, self.clock.now())


__all__ = ["DownstreamShares", "Grant", "pace_key", "slots_key"]
