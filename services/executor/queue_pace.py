"""A worker queue's pace across the cluster (ADR-0108, "Worker queues"): at most its
``max_calls_per_second`` action runs taken in each whole second of the clock, by every
executor together, spaced through the second's first four fifths as a downstream's calls
are (:data:`dispo.executor.slots.PACE_SPREAD`), so that a run handed out late in its
second still reaches its worker within it.

The count is the database's: each claim of a paced queue reads the queue's
``queue_paces`` row under the queue's lock, takes no more than :func:`turns` leaves, and
writes what it took (:func:`counted`) before the lock is let go. Nothing is leased: an
executor that dies has counted what it took, one cut off from the database takes nothing.
The decisions here are pure; :mod:`dispo.executor.store.queues` reads and writes the rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from dispo.executor.slots import PACE_SPREAD


@dataclass(frozen=True)
class Count:
    """A queue's row: the runs taken in its latest ``second`` (whole seconds since the
    epoch) and in the second before it (``last``: 0 when none was taken then)."""

    second: int
    taken: int
    last: int = 0


@dataclass(frozen=True)
class Turns:
    """What a queue's pace allows at a moment: ``room`` runs may be taken now; when none,
    ``next`` is when the next turn comes."""

    room: int
    next: datetime | None = None


def turns(rate: int, now: datetime, count: Count | None) -> Turns:
    """The runs a queue limited to ``rate`` a second may give now, ``count`` being what its
    row records. The k-th run of a second (from 0) is due at a fraction ``PACE_SPREAD × k /
    rate`` into it; those due and not taken may all go at once. A row of a second later than
    ``now`` (another executor's clock a little ahead) counts as this second's, its turns
    due from its own start."""
    t = now.timestamp()
    second = math.floor(t)
    start, used = second, 0
    if count is not None and count.second >= second:
        start, used = count.second, count.taken
    # (a hair added: a turn due at this very moment is not lost to the float's rounding)
    due = min(rate, max(0, math.floor((t - start) * rate / PACE_SPREAD + 1e-9) + 1))
    if due > used:
        return Turns(due - used)
    at = start + PACE_SPREAD * used / rate if used < rate else start + 1
    return Turns(0, datetime.fromtimestamp(max(at, t), UTC))


def counted(count: Count | None, now: datetime, taken: int) -> Count:
    """The row once ``taken`` more runs were taken at ``now``."""
    second = math.floor(now.timestamp())
    if count is not None and count.second >= second:
        return Count(count.second, count.taken + taken, count.last)
    last = count.taken if count is not None and count.second == second - 1 else 0
    return Count(second, taken, last)


def last_second(count: Count | None, now: datetime) -> int:
    """The runs taken in the last whole second before ``now`` (its use, as ListQueues
    shows it)."""
    if count is None:
        return 0
    second = math.floor(now.timestamp())
    if count.second == second - 1:
        return count.taken
    if count.second == second:
        return count.last
    return 0
