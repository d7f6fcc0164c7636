"""Recovery policies as plain data with pure decisions; time always comes from the caller.

- :class:`RedrivePolicy`: when to redrive a failed task next, and when to give up.
- :class:`ReleaseRate`: a token bucket bounding how fast demoted work is released.
- :class:`ProbeRule`: when a status probe's answer settles an UNKNOWN node.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from dispo.libs.backoff import backoff


@dataclass(frozen=True)
class RedrivePolicy:
    max_redrives: int = 5
    # Seconds since the task first reached the reconciler after which it is not redriven.
    max_age: float = 86400.0
    base_delay: float = 30.0
    max_delay: float = 3600.0
    # Share of the delay spread either side at random (0: none).
    jitter: float = 0.5

    def redrives_spent(self, redrives: int) -> str | None:
        """Why no further redrive or release is allowed by count, or None (releases are
        redrives: a demoted task's age is bounded by its own limit, not ``max_age``)."""
        if redrives >= self.max_redrives:
            return (
                f"redrive policy spent: {redrives} of {self.max_redrives} redrives used"
                " (releases included)"
            )
        return None

    def delay(self, redrives: int, rng: random.Random | None = None) -> float:
        """Seconds before redrive number ``redrives + 1`` (exponential, capped, jittered)."""
        return backoff(self.base_delay, self.max_delay, self.jitter, redrives + 1, rng)

    def spent(self, redrives: int, first_parked_at: datetime, now: datetime) -> str | None:
        """Why no further automatic redrive is allowed, or None."""
        if used := self.redrives_spent(redrives):
            return used
        age = (now - first_parked_at).total_seconds()
        if age >= self.max_age:
            return f"redrive policy spent: failing for {age:.0f}s, max age {self.max_age:.0f}s"
        return None


@dataclass(frozen=True)
class ReleaseRate:
    rate_per_second: float = 5.0
    burst: float = 5.0

    def refill(self, tokens: float, tokens_at: datetime | None, now: datetime) -> float:
        """Tokens available at ``now``; a bucket never filled before starts at one token."""
        if tokens_at is None:
            return min(self.burst, 1.0)
        elapsed = max(0.0, (now - tokens_at).total_seconds())
        return min(self.burst, tokens + elapsed * self.rate_per_second)


class ProbeVerdict(Enum):
    """What one probe answer settles for an UNKNOWN node."""

    DONE = "done"  # the effect happened: SUCCEEDED
    NOT_DONE = "not_done"  # it did not and will not: PENDING, to run again
    NOT_YET = "not_yet"  # not done so far, but it may still land: ask again
    NO_ANSWER = "no_answer"  # the probe said nothing usable: ask again
    GIVE_UP = "give_up"  # past the probe limit without a decisive answer: an operator


@dataclass(frozen=True)
class ProbeRule:
    """When a probe's answer is final (ADR-0066). "Done" is final at any time; "not done"
    when the downstream fenced the key, or once the action's ``max_effect_seconds`` have
    passed since the node became UNKNOWN (a request may land that long after it was sent,
    and it was sent before then); no answer, or "not done" too early, is asked again, at
    intervals growing with the node's time UNKNOWN (half of it, within ``min_interval`` and
    ``max_interval``) and never past the moment "not done" becomes final; past ``limit``
    seconds UNKNOWN without a final answer the node waits for an operator."""

    min_interval: float = 1.0
    max_interval: float = 30.0
    limit: float = 3600.0

    def verdict(
        self,
        done: bool | None,
        fenced: bool,
        unknown_since: datetime,
        max_effect: float,
        now: datetime,
    ) -> ProbeVerdict:
        if done is True:
            return ProbeVerdict.DONE
        if done is False and (fenced or now >= unknown_since + timedelta(seconds=max_effect)):
            return ProbeVerdict.NOT_DONE
        if now >= unknown_since + timedelta(seconds=self.limit):
            return ProbeVerdict.GIVE_UP
        return ProbeVerdict.NOT_YET if done is False else ProbeVerdict.NO_ANSWER

    def next_probe(self, unknown_since: datetime, max_effect: float, now: datetime) -> datetime:
        """When to ask again after an answer that was not final."""
        age = max(0.0, (now - unknown_since).total_seconds())
        wait = min(self.max_interval, max(self.min_interval, age / 2))
        final = unknown_since + timedelta(seconds=max_effect)
        later = now + timedelta(seconds=wait)
        return final if now < final < later else later
