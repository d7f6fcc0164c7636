"""Per-downstream circuit breaker (one per executor process).

CLOSED: calls flow. Every reported call lands in a sliding window of ``window`` seconds;
once the window holds at least ``threshold`` calls and ``failure_ratio`` of them failed,
the breaker opens. A downstream that fails a minority of its calls therefore keeps
working (its failed nodes take their short retries); only one that fails most of them is
stopped. A failed health check opens it too (:meth:`Breaker.trip`).

OPEN: calls are refused (the executor demotes their nodes) until ``cooldown`` has passed
or the health check passes again. Then HALF_OPEN: at most ``trial_calls`` trial calls go
out, the others are refused. The first failure re-opens it; ``trial_calls`` successes
close it with an empty window. A trial that reports nothing within ``cooldown`` (its node
was not run, or its outcome says nothing about the downstream) gives its place back.

Time comes from the caller, so tests drive it; nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Breaker:
    threshold: int = 10  # calls in the window before its failure ratio can open the breaker
    window: float = 30.0
    cooldown: float = 30.0
    failure_ratio: float = 0.5
    trial_calls: int = 5
    state: BreakerState = field(default=BreakerState.CLOSED, init=False)
    open_until: datetime | None = field(default=None, init=False)
    # (when, failed) of every call reported while CLOSED, oldest first, within ``window``.
    calls: deque[tuple[datetime, bool]] = field(default_factory=deque, init=False)
    failures: int = field(default=0, init=False)
    # When each trial still awaiting its outcome was let through, oldest first.
    _trials: deque[datetime] = field(default_factory=deque, init=False)
    _trial_successes: int = field(default=0, init=False)

    def _trim(self, now: datetime) -> None:
        edge = now - timedelta(seconds=self.window)
        while self.calls and self.calls[0][0] < edge:
            _, failed = self.calls.popleft()
            self.failures -= failed

    def _should_open(self) -> bool:
        total = len(self.calls)
        return total >= max(1, self.threshold) and self.failures >= self.failure_ratio * total

    def _half_open(self) -> None:
        self.state = BreakerState.HALF_OPEN
        self._trials.clear()
        self._trial_successes = 0

    def _close(self) -> None:
        self.state = BreakerState.CLOSED
        self.open_until = None
        self.calls.clear()
        self.failures = 0
        self._trials.clear()
        self._trial_successes = 0

    def state_at(self, now: datetime) -> BreakerState:
        """The state a call would find now: an OPEN breaker whose cooldown has ended is
        HALF_OPEN (it becomes so at the next call, :meth:`allow`)."""
        if self.state is BreakerState.OPEN and (
            self.open_until is not None and now >= self.open_until
        ):
            return BreakerState.HALF_OPEN
        return self.state

    def allow(self, now: datetime) -> bool:
        """May a call go out now? In HALF_OPEN a True is one of the bounded trial calls."""
        if self.state is BreakerState.OPEN:
            if self.open_until is None or now < self.open_until:
                return False
            self._half_open()
        if self.state is BreakerState.HALF_OPEN:
            stale = now - timedelta(seconds=self.cooldown)
            while self._trials and self._trials[0] <= stale:
                self._trials.popleft()
            if len(self._trials) + self._trial_successes >= max(1, self.trial_calls):
                return False
            self._trials.append(now)
        return True

    def record_success(self, now: datetime) -> None:
        if self.state is BreakerState.HALF_OPEN:
            if not self._trials:
                return  # a call let through before the breaker opened: not a trial
            self._trials.popleft()
            self._trial_successes += 1
            if self._trial_successes >= max(1, self.trial_calls):
                self._close()
        elif self.state is BreakerState.CLOSED:
            self._record(now, failed=False)

    def record_failure(self, now: datetime) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self.trip(now)
        elif self.state is BreakerState.CLOSED:
            self._record(now, failed=True)
            if self._should_open():
                self.trip(now)

    def _record(self, now: datetime, failed: bool) -> None:
        self.calls.append((now, failed))
        self.failures += failed
        self._trim(now)

    def health_ok(self) -> None:
        """The downstream's health check passes again: let the trial calls decide."""
        if self.state is BreakerState.OPEN:
            self._half_open()

    def trip(self, now: datetime) -> None:
        """Open now (too many failures, a failed trial or a failed health check)."""
        self.state = BreakerState.OPEN
        self.open_until = now + timedelta(seconds=self.cooldown)
        self._trials.clear()
        self._trial_successes = 0

    def recent_failures(self, now: datetime) -> int:
        self._trim(now)
        return self.failures
