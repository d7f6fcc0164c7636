"""Token buckets and slots (dispo.libs.ratelimit), time driven by a manual clock."""

from __future__ import annotations

import pytest
from dispo.libs.clock import ManualClock
from dispo.libs.ratelimit import Slots, TokenBuckets


def test_a_burst_then_the_rate_and_the_wait_until_the_next_token():
    clock = ManualClock()
    buckets = TokenBuckets(rate=10, burst=3, clock=clock)
    assert [buckets.take("shop") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("shop") == pytest.approx(0.1)
    clock.advance(seconds=0.05)
    assert buckets.take("shop") == pytest.approx(0.05)  # half a token there; none taken
    clock.advance(seconds=0.05)
    assert buckets.take("shop") == 0.0
    assert buckets.take("shop") == pytest.approx(0.1)
    clock.advance(seconds=60)  # refills to the burst, no further
    assert [buckets.take("shop") for _ in range(4)][-1] == pytest.approx(0.1)


def test_each_key_has_its_own_bucket():
    clock = ManualClock()
    buckets = TokenBuckets(rate=1, burst=1, clock=clock)
    assert buckets.take("a") == 0.0
    assert buckets.take("a") == pytest.approx(1.0)
    assert buckets.take("b") == 0.0


def test_a_clock_set_back_neither_refills_nor_drains():
    clock = ManualClock()
    buckets = TokenBuckets(rate=1, burst=1, clock=clock)
    assert buckets.take("a") == 0.0
    clock.advance(seconds=-30)
    assert buckets.take("a") == pytest.approx(1.0)
    clock.advance(seconds=1)
    assert buckets.take("a") == 0.0


def test_rate_zero_is_no_limit():
    buckets = TokenBuckets(rate=0, burst=1, clock=ManualClock())
    assert all(buckets.take("a") == 0.0 for _ in range(1000))


def test_many_keys_are_forgotten_once_full_not_while_drained():
    clock = ManualClock()
    buckets = TokenBuckets(rate=1, burst=2, clock=clock, max_keys=4)
    for key in "abc":
        buckets.take(key)
    buckets.take("d")
    buckets.take("d")  # d is drained
    clock.advance(seconds=1)  # a, b, c are full again; d is half
    buckets.take("e")
    assert buckets.take("d") == 0.0 and buckets.take("d") > 0  # d kept its level


def test_slots_cap_what_is_held_per_key():
    slots = Slots(2)
    assert slots.acquire("a") and slots.acquire("a")
    assert not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.held("a") == 1 and slots.acquire("a")
    slots.release("a")
    slots.release("a")
    assert slots.held("a") == 0


def test_several_tokens_are_taken_at_once_or_none_and_can_be_given_back():
    clock = ManualClock()
    buckets = TokenBuckets(rate=10, burst=5, clock=clock)
    assert buckets.take("shop", 3) == 0.0
    assert buckets.take("shop", 3) == pytest.approx(0.1)  # two there; none taken
    assert buckets.take("shop", 2) == 0.0
    buckets.give_back("shop", 4)
    assert buckets.take("shop", 4) == 0.0
    assert buckets.take("shop") == pytest.approx(0.1)
    assert buckets.take("other", 6) == float("inf")  # more than a burst: never
    assert buckets.take("other", 5) == 0.0
