"""Retries of transient failures inside a job: which failures, how long to wait, when to stop.

A job's work calls a party outside Dispo (an analysis model). A failure that says "try
again" (:func:`is_transient`; for a model: a 429 or 5xx answer, a connection refused or
reset, a timeout) is retried within the same job, waiting ``backoff`` (or longer when the
party asked for it, ``Retry-After``) on the injectable clock; any other failure ends the job at once.
After ``max_attempts`` calls, or when the party asks for a wait longer than the job allows,
the job gives up with :class:`GaveUp`, whose message says so and carries the last error.

Domain only: the policy is data, the loop takes the clock and the call as parameters.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dispo.intelligence.job_rules import describe_exception
from dispo.libs.backoff import backoff
from dispo.libs.clock import Clock

T = TypeVar("T")


def is_transient(error: BaseException) -> bool:
    """A failure worth another attempt: it says so with ``transient = True`` (and may carry
    ``retry_after``, the wait the party asked for, in seconds)."""
    return getattr(error, "transient", False) is True


def retry_after(error: BaseException) -> float | None:
    value = getattr(error, "retry_after", None)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5  # calls per job, the first one included
    base_seconds: float = 2.0
    max_seconds: float = 60.0  # cap of the backoff
    retry_after_max_seconds: float = 300.0  # a party asking for a longer wait ends the job
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def delay(self, attempt: int, asked: float | None, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt``: the backoff, or what was asked if longer."""
        wait = backoff(self.base_seconds, self.max_seconds, self.jitter, attempt, rng)
        return max(wait, asked or 0.0)


class GaveUp(Exception):
    """Transient failures did not stop within the policy; ``message`` is the row's error."""

    def __init__(self, attempts: int, error: BaseException, reason: str = "") -> None:
        self.attempts = attempts
        self.error = error
        calls = f"{attempts} attempt" if attempts == 1 else f"{attempts} attempts"
        self.message = f"after {calls}{reason}: {describe_exception(error)}"
        super().__init__(self.message)


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    clock: Clock,
    *,
    on_retry: Callable[[int, float, Exception], Any] | None = None,
    rng: random.Random | None = None,
) -> T:
    """``await call()`` until it returns, retrying transient failures within ``policy``.

    A non-transient error propagates at once, as it is. ``on_retry(attempt, delay, error)``
    is told about every wait before it starts.
    """
    attempt = 1
    while True:
        try:
            return await call()
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt >= policy.max_attempts:
                raise GaveUp(attempt, error) from error
            asked = retry_after(error)
            if asked is not None and asked > policy.retry_after_max_seconds:
                reason = (
                    f" (asked to retry after {asked:g} s, more than the "
                    f"{policy.retry_after_max_seconds:g} s a job waits)"
                )
                raise GaveUp(attempt, error, reason) from error
            delay = policy.delay(attempt, asked, rng)
            if on_retry is not None:
                on_retry(attempt, delay, error)
            await clock.sleep(delay)
            attempt += 1


__all__ = ["GaveUp", "RetryPolicy", "call_with_retries", "is_transient", "retry_after"]
