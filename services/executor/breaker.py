"""Per-downstream circuit breaker (one per executor process).

CLOSED: calls flow. ``threshold`` failures within ``window`` seconds (or a failed health
check) open it. OPEN: calls are refused until ``cooldown`` has passed; work for the
downstream is demoted. Then HALF_OPEN: one probe call decides (success closes, failure
re-opens). Time comes from the caller, so tests drive it.
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
    threshold: int = 5
    window: float = 30.0
    cooldown: float = 30.0
    state: BreakerState = BreakerState.CLOSED
    open_until: datetime | None = None
    failures: deque[datetime] = field(default_factory=deque)
    _probing: bool = False

    def _trim(self, now: datetime) -> None:
        edge = now - timedelta(seconds=self.window)
        while self.failures and self.failures[0] < edge:
            self.failures.popleft()

    def allow(self, now: datetime) -> bool:
        """May a call go out now?"""
        if self.state is BreakerState.OPEN:
            if self.open_until is not None and now >= self.open_until:
                self.state = BreakerState.HALF_OPEN
                self._probing = False
            else:
                return False
        if self.state is BreakerState.HALF_OPEN:
            if self._probing:
                return False
            self._probing = True
        return True

    def record_success(self, now: datetime) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self.state = BreakerState.CLOSED
            self.failures.clear()
        self._probing = False

    def record_failure(self, now: datetime) -> None:
        self._probing = False
        if self.state is BreakerState.HALF_OPEN:
            self.trip(now)
            return
        self.failures.append(now)
        self._trim(now)
        if len(self.failures) >= self.threshold:
            self.trip(now)

    def health_ok(self) -> None:
        """The downstream's health check passes again: let one probe call decide."""
        if self.state is BreakerState.OPEN:
            self.state = BreakerState.HALF_OPEN
            self._probing = False

    def trip(self, now: datetime) -> None:
        self.state = BreakerState.OPEN
        self.open_until = now + timedelta(seconds=self.cooldown)

    def recent_failures(self, now: datetime) -> int:
        self._trim(now)
        return len(self.failures)
