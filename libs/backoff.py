"""Exponential backoff with jitter, the one formula every retry in Dispo uses.

Short retries in the executor, redrives, compensation and completion callbacks in the
reconciler and the intelligence jobs' model calls all wait ``backoff(...)`` seconds; their
policies only choose the numbers. A party that says how long to wait (an HTTP
``Retry-After``) is read with :func:`retry_after_seconds`.
"""

from __future__ import annotations

import random
from datetime import datetime
from email.utils import parsedate_to_datetime


def backoff(
    base: float, cap: float, jitter: float, attempt: int, rng: random.Random | None = None
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first failure).

    ``base * 2 ** (attempt - 1)``, capped at ``cap``, then moved at random by up to
    ``jitter`` (a share, 0 for none) of itself either way; never negative. ``rng`` makes
    the draw reproducible in tests.
    """
    raw = min(cap, base * 2.0 ** max(0, attempt - 1))
    spread = raw * jitter
    return max(0.0, raw - spread + (rng or random).random() * 2 * spread)


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds an HTTP ``Retry-After`` header asks to wait, or ``None`` when absent or unreadable.

    Either delay-seconds (``"7"``) or an HTTP-date, counted from ``now`` (timezone-aware);
    a date in the past means 0.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isascii() and text.isdecimal():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return max(0.0, (moment - now).total_seconds())


__all__ = ["backoff", "retry_after_seconds"]
