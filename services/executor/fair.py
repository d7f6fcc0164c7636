"""The fair order of waiters (ADR-0109): weighted round-robin across businesses, and within
one business by priority (1 first), then arrival.

Smooth weighted round-robin over the businesses that have someone waiting: each pick adds
every such business's weight to its credit, takes the business with the most credit, and
takes the total weight off the winner's. Over any stretch, business ``b`` is picked
``weight(b) / Σ weights`` of the time, interleaved rather than in runs. A business that
stops waiting loses its credit, so it cannot bank turns while idle.

Pure: no clock, no I/O; the slots of a downstream and the executor's intake each hold one.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

from dispo.libs.contracts.tasks import DEFAULT_PRIORITY, priority_of

__all__ = ["DEFAULT_PRIORITY", "FairQueue", "equal", "priority_of"]

T = TypeVar("T")


def equal(_business: str) -> int:
    return 1


class FairQueue(Generic[T]):
    def __init__(self, weight: Callable[[str], int] = equal) -> None:
        self._weight = weight
        # Per business: a heap of (priority, arrival, item).
        self._queues: dict[str, list[tuple[int, int, T]]] = {}
        self._credit: dict[str, int] = {}
        self._arrival = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def depth(self, business: str) -> int:
        return len(self._queues.get(business, ()))

    def depths(self) -> dict[str, int]:
        return {b: len(q) for b, q in self._queues.items()}

    def push(self, business: str, priority: int, item: T) -> None:
        queue = self._queues.setdefault(business, [])
        if not queue:
            self._credit[business] = 0
        heapq.heappush(queue, (priority, next(self._arrival), item))
        self._size += 1

    def pop(self, eligible: Callable[[str], bool] | None = None) -> tuple[str, T] | None:
        """The next item in the fair order, with its business, among the businesses
        ``eligible`` allows (all when None); None when none of them waits."""
        choices = [b for b in self._queues if eligible is None or eligible(b)]
        if not choices:
            return None
        total = 0
        for business in choices:
            weight = max(1, self._weight(business))
            self._credit[business] += weight
            total += weight
        pick = max(choices, key=self._credit.__getitem__)
        self._credit[pick] -= total
        queue = self._queues[pick]
        _, _, item = heapq.heappop(queue)
        if not queue:
            del self._queues[pick]
            del self._credit[pick]
        self._size -= 1
        return pick, item

    def remove(self, business: str, item: T) -> bool:
        """Take ``item`` out of line (its waiter gave up); False if it is not waiting."""
        queue = self._queues.get(business)
        if not queue:
            return False
        for i, entry in enumerate(queue):
            if entry[2] is item:
                queue[i] = queue[-1]
                queue.pop()
                heapq.heapify(queue)
                self._size -= 1
                if not queue:
                    del self._queues[business]
                    del self._credit[business]
                return True
        return False
