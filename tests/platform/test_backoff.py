"""The one backoff formula: exponential from the first failure, capped, jittered both ways."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

from dispo.libs.backoff import backoff, retry_after_seconds

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_without_jitter_it_doubles_from_base_up_to_the_cap():
    assert [backoff(1.0, 10.0, 0, attempt) for attempt in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff(1.0, 10.0, 0, 0) == 1.0  # "no failure yet" waits the base, never less


def test_jitter_spreads_either_side_within_its_share_and_never_below_zero():
    rng = random.Random(3)
    delays = [backoff(8.0, 100.0, 0.5, 1, rng) for _ in range(500)]
    assert all(4.0 <= d <= 12.0 for d in delays)
    assert min(delays) < 6.0 and max(delays) > 10.0  # really both ways, not one-sided
    assert all(backoff(1.0, 1.0, 2.0, 1, rng) >= 0.0 for _ in range(200))


def test_a_seeded_rng_gives_the_same_delays():
    first = [backoff(2.0, 60.0, 0.5, n, random.Random(11)) for n in range(1, 5)]
    again = [backoff(2.0, 60.0, 0.5, n, random.Random(11)) for n in range(1, 5)]
    assert first == again


def test_no_service_spells_the_formula_again():
    copies = [
        str(path.relative_to(REPO_ROOT))
        for root in ("services", "libs", "sdk", "tools")
        for path in sorted((REPO_ROOT / root).rglob("*.py"))
        if path.name != "backoff.py" and "* 2 * spread" in path.read_text()
    ]
    assert copies == []


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(" 120 ", now) == 120.0
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # in the past
    for unreadable in (None, "", "soon", "-3", "1.5e3", "²"):
        assert retry_after_seconds(unreadable, now) is None, unreadable
