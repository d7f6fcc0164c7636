"""Exponential backoff with jitter, the one formula every retry in Dispo uses.

Short retries in the executor, redrives, compensation and completion callbacks in the
reconciler all wait ``backoff(...)`` seconds; their policies only choose the numbers.
"""

from __future__ import annotations

import random


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


__all__ = ["backoff"]
