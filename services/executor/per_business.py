"""Each business's own limits on a downstream (``per_business`` in the catalogue,
ADR-0108 "Per business"): call slots and a pace per (downstream, business), made when the
business first calls the downstream and dropped once idle for a lease.

A node takes its business's slot before the downstream's, and its business's pace turn
before the downstream's; it gives them back in the reverse order. Across the cluster, each
business's slots and pace are shares of its limit leased as the downstream's are
(:mod:`dispo.executor.shares` renews them with the others): made holding nothing (``leased``),
they wait for the first renewal. Counted in this process alone (``leased`` false), each holds
the whole limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from dispo.executor.slots import Pace, Slots
from dispo.libs.catalogue import BusinessLimit
from dispo.libs.clock import Clock

# (downstream, business)
Key = tuple[str, str]


def business_slots_key(downstream: str, business: str) -> str:
    return f"downstream:{downstream}:business:{business}:calls"


def business_pace_key(downstream: str, business: str) -> str:
    return f"downstream:{downstream}:business:{business}:per_second"


def idle(in_use: bool, last_used: datetime, now: datetime, lease: float) -> bool:
    """May a business's slots and pace of a downstream go: nothing held or waiting, and
    none asked for them within a lease (its share in the database has run out by then
    unless renewed)."""
    return not in_use and (now - last_used).total_seconds() >= lease


@dataclass
class BusinessLimits:
    """The per-business slots and paces of the downstreams that declare a limit per business."""

    clock: Clock
    leased: bool = True
    limits: dict[str, BusinessLimit] = field(default_factory=dict)
    slots: dict[Key, Slots] = field(default_factory=dict)
    paces: dict[Key, Pace] = field(default_factory=dict)
    # When each (downstream, business) was last asked for.
    used: dict[Key, datetime] = field(default_factory=dict)
    # Called when a node has to queue while this process holds less than the limit.
    short: Callable[[], None] | None = None

    def put(self, downstream: str, limit: BusinessLimit) -> None:
        """The downstream's limit per business, in place of any it had (a newer catalogue
        version: the calls under way give theirs back where they took them)."""
        for key in [k for k in self.used if k[0] == downstream]:
            self._drop(key)
        if limit:
            self.limits[downstream] = limit
        else:
            self.limits.pop(downstream, None)

    def slots_of(self, downstream: str, business: str) -> Slots | None:
        """The business's call slots of ``downstream`` (None: no limit per business)."""
        limit = self.limits.get(downstream)
        if limit is None or not limit.max_concurrency:
            return None
        key = self._use(downstream, business)
        slots = self.slots.get(key)
        if slots is None:
            slots = Slots(limit.max_concurrency, bound=0 if self.leased else None)
            self._lease(slots)
            self.slots[key] = slots
        return slots

    def pace_of(self, downstream: str, business: str) -> Pace | None:
        """The business's pace of ``downstream`` (None: no rate per business)."""
        limit = self.limits.get(downstream)
        if limit is None or not limit.max_calls_per_second:
            return None
        key = self._use(downstream, business)
        pace = self.paces.get(key)
        if pace is None:
            pace = Pace(limit.max_calls_per_second, self.clock, bound=0 if self.leased else None)
            self._lease(pace)
            self.paces[key] = pace
        return pace

    def drop_idle(self, lease: float) -> list[Key]:
        """Drop the slots and paces of every business idle for ``lease`` seconds."""
        now = self.clock.now()
        gone = [k for k, at in self.used.items() if idle(self._in_use(k), at, now, lease)]
        for key in gone:
            self._drop(key)
        return gone

    def items(self) -> Iterator[tuple[Key, Slots | Pace]]:
        yield from self.slots.items()
        yield from self.paces.items()

    def _use(self, downstream: str, business: str) -> Key:
        key = (downstream, business)
        self.used[key] = self.clock.now()
        return key

    def _lease(self, limited: Slots | Pace) -> None:
        if self.leased:
            limited.lease_until = self.clock.now()  # nothing until the first renewal,
            limited.short = self.short
            if self.short is not None:  # asked for now
                self.short()

    def _in_use(self, key: Key) -> bool:
        slots, pace = self.slots.get(key), self.paces.get(key)
        return bool(
            (slots is not None and (slots.held or slots.waiting))
            or (pace is not None and pace.waiting)
        )

    def _drop(self, key: Key) -> None:
        self.used.pop(key, None)
        self.slots.pop(key, None)
        self.paces.pop(key, None)


__all__ = ["BusinessLimits", "business_pace_key", "business_slots_key", "idle"]
