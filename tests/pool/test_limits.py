"""What one evaluation may ask for: runs in all and runs a second, refused at the request
naming the field and stating the limit, through the real gRPC API; nothing written."""

from __future__ import annotations

import grpc
import pytest

from .conftest import DEFAULT_TARGET
from .test_egress import request, violations


@pytest.mark.parametrize(
    "schedule, field, limit",
    [
        # The case: ten million runs in a one-second window.
        (
            {"slot_count": 10_000, "runs_per_slot": 1_000, "window_seconds": 1},
            "runs_per_slot",
            "100000 runs",
        ),
        (
            {"slot_count": 200, "runs_per_slot": 501, "window_seconds": 86400},
            "runs_per_slot",
            "100000 runs",
        ),
        (
            {"slot_count": 1, "runs_per_slot": 11, "window_seconds": 1},
            "window_seconds",
            "10 a second",
        ),
        (
            {"slot_count": 10, "runs_per_slot": 100, "window_seconds": 99},
            "window_seconds",
            "10 a second",
        ),
    ],
)
async def test_too_many_runs_are_refused_naming_the_field(stub, pool, schedule, field, limit):
    ask = request(DEFAULT_TARGET)
    for name, value in schedule.items():
        setattr(ask, name, value)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.CreateEvaluation(ask)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert limit in refused.value.details()
    assert await violations(stub.CreateEvaluation(ask)) == [field]
    assert (await pool.status()).queue_depth == 0


async def test_at_the_limits_is_accepted(stub, pool):
    ask = request(DEFAULT_TARGET)
    ask.slot_count, ask.runs_per_slot, ask.window_seconds = 100, 1_000, 10_000
    await stub.CreateEvaluation(ask)
    assert (await pool.status()).queue_depth == 1
