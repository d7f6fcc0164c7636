"""Payloads travel as canonical JSON bytes from Submit to the downstream: parsed once at
the gateway, stored once, sent verbatim. Real gateway, executor and demo downstream."""

from __future__ import annotations

import json

import grpc
import pytest
from dispo.gateway.convert import submission_from_proto
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.errors import InvalidArgument
from dispo.libs.payload import (
    JSON_PLAIN,
    PayloadError,
    canonical_json,
    from_struct,
    parse_json_object,
    payload_data,
)
from dispo.sdk import cell
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from pipeline_fixtures import stream_messages
from support.auth import admin_channel


def struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def test_canonical_json_is_one_form():
    assert canonical_json({"b": 1, "a": [1.5, "é", None, True]}) == (
        '{"a":[1.5,"é",null,true],"b":1}'.encode()
    )
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")})


def test_a_struct_gets_its_integers_back_within_the_exact_range():
    value = from_struct(
        struct({"level": 3.0, "half": 2.5, "big": 2.0**53, "bigger": 2.0**60, "list": [1.0, -4.0]})
    )
    assert value == {"level": 3, "half": 2.5, "big": 2**53, "bigger": 2.0**60, "list": [1, -4]}
    assert isinstance(value["level"], int) and isinstance(value["bigger"], float)
    assert canonical_json(value) == (
        b'{"big":9007199254740992,"bigger":1.152921504606847e+18,"half":2.5,"level":3,"list":[1,-4]}'
    )


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (b'{"level": NaN}', "level"),
        (b'{"a": {"b": [1, Infinity]}}', "a.b[1]"),
        (b'{"x": -Infinity}', "x"),
        (b'{"x": 1e400}', "x"),
        (b"[1, 2]", ""),
        (b"{not json", ""),
        (b'{"x": "\xff"}', ""),
        # what PostgreSQL text and UTF-8 cannot hold: NUL, an unpaired surrogate
        (b'{"x": "a\\u0000b"}', "x"),
        (b'{"owner": {"n\\u0000": 1}}', "owner.n\x00"),
        (b'{"x": ["ok", "\\ud800"]}', "x[1]"),
        (b'{"n": ' + b"9" * 5000 + b"}", ""),  # more digits than Python converts
    ],
)
def test_exact_json_is_refused_naming_the_member(data, path):
    with pytest.raises(PayloadError) as refused:
        parse_json_object(data)
    assert refused.value.path == path


def test_exact_json_keeps_every_integer():
    assert parse_json_object(b'{"n": 123456789012345678901234567890, "f": 3.0}') == {
        "n": 123456789012345678901234567890,
        "f": 3.0,
    }


def test_the_edge_names_the_field_of_a_non_finite_number():
    request = gateway_pb2.SubmitRequest(
        business="tests",
        cells=[
            gateway_pb2.CellRequest(cell="set_level", payload=struct({"name": "a", "level": 1})),
            gateway_pb2.CellRequest(cell="set_level", payload_json=b'{"name":"b","level":NaN}'),
        ],
    )
    bad = request.cells[0].payload.fields["weight"]
    bad.number_value = float("inf")
    with pytest.raises(InvalidArgument) as refused:
        submission_from_proto(request)
    assert [v.field for v in refused.value.violations] == [
        "cells[0].payload.weight",
        "cells[1].payload_json.level",
    ]


async def _submit(stub, cells, key: str = "") -> gateway_pb2.SubmitResponse:
    return await stub.Submit(
        gateway_pb2.SubmitRequest(business="tests", cells=cells, idempotency_key=key)
    )


def _violations(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return [v.field for v in bad.field_violations]
    return []


async def test_the_downstream_receives_the_integer_as_an_integer(pipeline, downstream, bus):
    """grpcurl's plain JSON (a Struct, numbers as doubles) and the SDK's exact bytes both
    reach the downstream as canonical JSON with 3, not 3.0; the path template too."""
    async with (
        admin_channel(pipeline.gateway.address) as channel,
        pipeline.client() as client,
    ):
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        # What grpcurl sends for -d '{"cells": [{"cell": "set_level", "payload": {...}}]}'.
        plain = gateway_pb2.SubmitRequest()
        json_format.Parse(
            json.dumps(
                {
                    "business": "tests",
                    "cells": [{"cell": "set_level", "payload": {"name": "g", "level": 3}}],
                }
            ),
            plain,
        )
        by_struct = await stub.Submit(plain)
        by_sdk = await client.submit(
            "tests", [cell("set_level", name="s", level=2**60, weight=2.5)]
        )
        done = [await client.wait(t.task_id, timeout=30) for t in (by_struct, by_sdk)]
        view = (await stub.GetTask(gateway_pb2.GetTaskRequest(task_id=by_struct.task_id))).task
    assert [d.status for d in done] == ["SUCCEEDED", "SUCCEEDED"]

    bodies = (await downstream.state())["bodies"]
    assert bodies[f"{by_struct.task_id}/set_level.call"] == '{"level":3,"name":"g"}'
    assert bodies[f"{by_sdk.task_id}/set_level.call"] == (
        '{"level":1152921504606846976,"name":"s","weight":2.5}'
    )
    assert view.nodes[0].spec.path == "/level/g/3"
    # The view keeps the payload as accepted, with its encoding named.
    stored = view.payloads["set_level"]
    assert stored.metadata["encoding"] == JSON_PLAIN
    assert payload_data(stored) == b'{"level":3,"name":"g"}'

    # Status events carry node states, not payloads; task.create carries the payload.
    statuses = [
        m
        for task_id in (by_struct.task_id, by_sdk.task_id)
        for m in await stream_messages(bus, tasks.task_status_of(task_id), stream="TASK_STATUS")
    ]
    assert statuses and all(
        not task_pb2.Task.FromString(m.data).payloads and task_pb2.Task.FromString(m.data).nodes
        for m in statuses
    )
    [create] = [
        task_pb2.Task.FromString(m.data)
        for m in await stream_messages(bus, "task.create")
        if task_pb2.Task.FromString(m.data).task_id == by_struct.task_id
    ]
    assert payload_data(create.payloads["set_level"]) == b'{"level":3,"name":"g"}'


async def test_both_forms_of_one_payload_are_one_request(gateway_only):
    """The Struct's 3.0 and the exact 3 are the same canonical payload: the same
    idempotency key returns the same task, not a refusal for a different request."""
    async with admin_channel(gateway_only.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        first = await _submit(
            stub,
            [gateway_pb2.CellRequest(cell="set_level", payload=struct({"name": "a", "level": 3}))],
            key="same",
        )
        again = await _submit(
            stub,
            [gateway_pb2.CellRequest(cell="set_level", payload_json=b'{"level": 3, "name": "a"}')],
            key="same",
        )
    assert (again.task_id, again.duplicate) == (first.task_id, True)


@pytest.mark.parametrize(
    ("cell_request", "field"),
    [
        (
            gateway_pb2.CellRequest(cell="set_level", payload_json=b'{"name":"a","level":NaN}'),
            "cells[0].payload_json.level",
        ),
        (
            gateway_pb2.CellRequest(cell="set_level", payload_json=b'{"name":"a","level":3.0}'),
            "cells[0].payload.level",
        ),
        (gateway_pb2.CellRequest(cell="set_level", payload_json=b"[]"), "cells[0].payload_json"),
    ],
)
async def test_bad_payloads_are_refused_at_the_edge_with_the_field(
    gateway_only, cell_request, field
):
    async with admin_channel(gateway_only.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _submit(stub, [cell_request])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in _violations(refused.value)


async def test_a_struct_with_infinity_is_refused_with_the_field(gateway_only):
    payload = struct({"name": "a", "level": 1})
    payload.fields["weight"].number_value = float("-inf")
    async with admin_channel(gateway_only.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _submit(stub, [gateway_pb2.CellRequest(cell="set_level", payload=payload)])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violations(refused.value) == ["cells[0].payload.weight"]
