"""SSRF through CreateEvaluation, over the real gRPC API: a target_url off the allow-list, or
a case path that would leave it, is refused naming the field, and nothing is written."""

from __future__ import annotations

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from .conftest import DEFAULT_TARGET


def request(
    target_url: str, path: str = "/answer", evaluation_id: str = "ev"
) -> pb.CreateEvaluationRequest:
    return pb.CreateEvaluationRequest(
        evaluation_id=evaluation_id,
        series="s",
        line=common_pb2.LINE_TRIAL,
        period="p",
        target_url=target_url,
        window_seconds=600,
        slot_count=1,
        runs_per_slot=1,
        cases=[pb.TestCase(id="c1", path=path)],
    )


async def violations(call) -> list[str]:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(refused.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return [v.field for v in bad.field_violations]


REFUSED_TARGETS = [
    "http://127.0.0.1:50055",  # the pool's own port
    "http://169.254.169.254/latest/meta-data",
    "http://localhost:9",
    "http://127.0.0.1:9@169.254.169.254",
    "http://2130706433:9",
    "http://127.1:9",
    "http://0x7f.0.0.1:9",
    "http://127.0.0.1.:9",
    "http://[::ffff:127.0.0.1]:9",
    "https://127.0.0.1:9",
    "http://127.0.0.1:9/#x",
    "ftp://127.0.0.1:9",
    "not-a-url",
]


async def test_targets_off_the_list_are_refused_naming_the_field(stub, pool):
    for target in REFUSED_TARGETS:
        assert await violations(stub.CreateEvaluation(request(target))) == ["target_url"], target
    for target, path in (
        (f"{DEFAULT_TARGET}/api", "/../x"),
        (f"{DEFAULT_TARGET}/api", "/%2e%2e/x"),  # a WHATWG parser reads /x
        (DEFAULT_TARGET, "/x#y"),
    ):
        assert await violations(stub.CreateEvaluation(request(target, path))) == [
            "cases[0].path"
        ], path
    assert (await pool.status()).queue_depth == 0

    await stub.CreateEvaluation(request(f"{DEFAULT_TARGET}/api", "/answer?q=1"))
    assert (await pool.status()).queue_depth == 1
