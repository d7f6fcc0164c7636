"""Rate and concurrency limits per key (a business), in one process, on an injectable clock.

:class:`TokenBuckets` — ``rate`` tokens a second per key, at most ``burst`` held; a call
takes one (or several at once) or learns how long until they are there. :class:`Slots` — at most ``cap`` things
held at once per key. Both are plain data in the event loop's thread: O(1) per call, no
lock (asyncio runs one callback at a time), and time comes from the :class:`Clock`, so
tests move a :class:`~dispo.libs.clock.ManualClock` instead of sleeping::

    buckets = TokenBuckets(rate=100, burst=200, clock=clock)
    wait = buckets.take("shop")      # 0.0: taken; else seconds until a token is there
"""

from __future__ import annotations

from datetime import datetime

from dispo.libs.clock import Clock

# Buckets kept at most before the full ones (which a new bucket would equal) are dropped.
MAX_KEYS = 10_000


class TokenBuckets:
    """A token bucket per key. ``rate`` 0 means no limit (every take succeeds)."""

    def __init__(self, rate: float, burst: int, clock: Clock, *, max_keys: int = MAX_KEYS) -> None:
        if rate < 0 or burst < 1:
            raise ValueError("a token bucket needs rate >= 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self.max_keys = max_keys
        # key -> (tokens after the last take, when)
        self._buckets: dict[str, tuple[float, datetime]] = {}

    def take(self, key: str, count: int = 1) -> float:
        """Take ``count`` tokens for ``key`` at once: 0.0 when taken, else the seconds until
        that many are there (nothing taken then; ``inf`` when ``count`` exceeds the burst,
        which never holds that many)."""
        if self.rate == 0:
            return 0.0
        if count > self.burst:
            return float("inf")
        now = self.clock.now()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget(now)
            self._buckets[key] = (self.burst - count, now)
            return 0.0
        # A clock set back refills nothing (and does not drain either).
        elapsed = (now - bucket[1]).total_seconds()
        tokens = min(self.burst, bucket[0] + max(0.0, elapsed) * self.rate)
        if tokens >= count:
            self._buckets[key] = (tokens - count, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (count - tokens) / self.rate

    def set_rate(self, rate: float, burst: int) -> None:
        """From now on ``rate`` tokens a second, at most ``burst`` held: the tokens gathered
        until now at the old rate are counted first (a higher rate refills nothing before)."""
        if rate < 0 or burst < 1:
            raise ValueError("a token bucket needs rate >= 0 and burst >= 1")
        now = self.clock.now()
        for key, (tokens, at) in self._buckets.items():
            elapsed = max(0.0, (now - at).total_seconds())
            self._buckets[key] = (min(float(burst), tokens + elapsed * self.rate), now)
        self.rate, self.burst = rate, float(burst)

    def give_back(self, key: str, count: int) -> None:
        """Return ``count`` tokens just taken for ``key`` (a call refused for another reason
        after taking them); never more than the burst."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets[key] = (min(self.burst, bucket[0] + count), bucket[1])

    def _forget(self, now: datetime) -> None:
        """Drop the buckets that have refilled (a new one would be the same); if that is not
        enough, the oldest half."""
        full = [
            key
            for key, (tokens, at) in self._buckets.items()
            if tokens + max(0.0, (now - at).total_seconds()) * self.rate >= self.burst
        ]
        for key in full:
            del self._buckets[key]
        if len(self._buckets) >= self.max_keys:
            for key in list(self._buckets)[: len(self._buckets) // 2]:
                del self._buckets[key]


class Slots:
    """At most ``cap`` held at once per key (streams open, say)."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("a slot cap must be at least 1")
        self.cap = cap
        self._held: dict[str, int] = {}

    def acquire(self, key: str) -> bool:
        """Hold one for ``key``; False (nothing held) when ``cap`` are held already."""
        held = self._held.get(key, 0)
        if held >= self.cap:
            return False
        self._held[key] = held + 1
        return True

    def release(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: str) -> int:
        return self._held.get(key, 0)
