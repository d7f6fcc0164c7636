"""Every server maps domain errors to precise statuses with field details, and drains on stop."""

import asyncio

import grpc
import pytest
from dispo.libs import errors
from dispo.libs.auth.rules import ADMIN
from dispo.libs.grpcserver import ECHO_LIMIT_BYTES, create_server
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.auth import admin_channel

METHOD = "/dispo.test.v1.Echo/Call"
# The test service's methods, callable with an admin token like any operator RPC.
ECHO_RULES = {f"/dispo.test.v1.Echo/{m}": ADMIN for m in ("Call", "Watch", "Get")}


def echo_service(behaviour):
    async def call(request: bytes, context) -> bytes:
        return await behaviour(request)

    handler = grpc.method_handlers_generic_handler(
        "dispo.test.v1.Echo",
        {
            "Call": grpc.unary_unary_rpc_method_handler(
                call, request_deserializer=None, response_serializer=None
            )
        },
    )
    return lambda server: server.add_generic_rpc_handlers((handler,))


@pytest.fixture
async def serve(authorizer):
    servers = []

    async def start(behaviour):
        server = create_server(
            "127.0.0.1:0",
            [echo_service(behaviour)],
            ["dispo.test.v1.Echo"],
            authorizer(ECHO_RULES),
        )
        await server.start()
        await server.set_serving()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop(0)


async def call(port, body=b"x", timeout=5.0):
    async with admin_channel(f"127.0.0.1:{port}") as channel:
        return await channel.unary_unary(METHOD)(body, timeout=timeout)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.NotFound("task t-1 not found"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists("exists"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.FailedPrecondition("evaluation is running"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.PermissionDenied("no"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.Unauthenticated("who"), grpc.StatusCode.UNAUTHENTICATED),
        (errors.Unavailable("db down"), grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_domain_errors_map_to_status_codes(serve, error, code):
    async def fail(_):
        raise error

    server = await serve(fail)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port)
    assert raised.value.code() == code
    assert raised.value.details() == error.message


async def test_invalid_argument_carries_field_violations(serve):
    async def fail(_):
        raise errors.InvalidArgument("cells[1].name", "unknown cell 'nope'")

    server = await serve(fail)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port)

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "cells[1].name: unknown cell 'nope'"
    status = rpc_status.from_call(raised.value)
    bad_request = error_details_pb2.BadRequest()
    status.details[0].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [
        ("cells[1].name", "unknown cell 'nope'")
    ]


async def test_what_an_error_echoes_is_capped_so_its_status_arrives(serve):
    # 400 violations naming 3,000-character map keys: sent whole, the status would not fit
    # the caller's metadata limit and it would see RESOURCE_EXHAUSTED.
    key = "é" * 3_000
    many = [
        errors.FieldViolation(f"labels[{key!r}][{i}]", f"must not be {key}") for i in range(400)
    ]

    async def fail(_):
        raise errors.InvalidArgument(violations=many)

    server = await serve(fail)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port)

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("labels['ééé")
    assert raised.value.details().endswith("…")
    assert len(raised.value.details().encode()) <= ECHO_LIMIT_BYTES
    status = rpc_status.from_call(raised.value)
    bad_request = error_details_pb2.BadRequest()
    status.details[0].Unpack(bad_request)
    assert 1 <= len(bad_request.field_violations) < len(many)
    first = bad_request.field_violations[0]
    assert first.field.startswith("labels['éé") and first.field.endswith("…")
    assert first.description.startswith("must not be éé")


async def test_unexpected_exception_is_internal_without_leaking(serve):
    async def fail(_):
        raise RuntimeError("secret connection string")

    server = await serve(fail)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port)
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in raised.value.details()


async def test_a_cancelled_error_no_one_asked_for_is_unavailable_not_cancelled(serve):
    """A library raising CancelledError inside a call no one cancelled (the database driver,
    a connection closed under a statement) answers UNAVAILABLE, retryable, saying what is
    known; a call its caller abandons is still cancelled."""

    async def interrupted(_):
        raise asyncio.CancelledError()

    server = await serve(interrupted)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "interrupted" in raised.value.details() and "retry" in raised.value.details()

    entered, abandoned = asyncio.Event(), asyncio.Event()

    async def slow(_):
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        return b""

    server = await serve(slow)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(server.port, timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(abandoned.wait(), 5)  # the handler was cancelled, not answered


async def test_stop_lets_in_flight_calls_finish(serve):
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(body):
        entered.set()
        await release.wait()
        return body

    server = await serve(slow)
    in_flight = asyncio.create_task(call(server.port, b"done"))
    await entered.wait()
    stopping = asyncio.create_task(server.stop(10))
    await asyncio.sleep(0)
    release.set()
    assert await in_flight == b"done"
    await stopping


async def test_streams_deliver_items_then_the_mapped_error(authorizer):
    async def watch(request: bytes, context):
        yield b"first"
        raise errors.NotFound("task vanished")

    handler = grpc.method_handlers_generic_handler(
        "dispo.test.v1.Echo", {"Watch": grpc.unary_stream_rpc_method_handler(watch)}
    )
    server = create_server(
        "127.0.0.1:0",
        [lambda s: s.add_generic_rpc_handlers((handler,))],
        ["dispo.test.v1.Echo"],
        authorizer(ECHO_RULES),
    )
    await server.start()
    try:
        received = []
        async with admin_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.unary_stream("/dispo.test.v1.Echo/Watch")(b"x", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for item in call:
                    received.append(item)
        assert received == [b"first"]
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert raised.value.details() == "task vanished"
    finally:
        await server.stop(0)


async def test_undecodable_request_bytes_are_invalid_argument(authorizer):
    from dispo.libs.api.gateway.v1 import gateway_pb2

    async def get(request, context):
        return gateway_pb2.GetTaskResponse()

    handler = grpc.method_handlers_generic_handler(
        "dispo.test.v1.Echo",
        {
            "Get": grpc.unary_unary_rpc_method_handler(
                get,
                request_deserializer=gateway_pb2.GetTaskRequest.FromString,
                response_serializer=gateway_pb2.GetTaskResponse.SerializeToString,
            )
        },
    )
    server = create_server(
        "127.0.0.1:0",
        [lambda s: s.add_generic_rpc_handlers((handler,))],
        ["dispo.test.v1.Echo"],
        authorizer(ECHO_RULES),
    )
    await server.start()
    try:
        async with admin_channel(f"127.0.0.1:{server.port}") as channel:
            method = channel.unary_unary("/dispo.test.v1.Echo/Get")
            # field 1 (task_id) as a string whose bytes are not UTF-8; then a truncated varint
            for body in (b"\x0a\x02\xff\xfe", b"\x08"):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await method(body, timeout=5)
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not a valid message" in raised.value.details()
            # and a hostile value in a decodable request is refused naming its field
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await method(gateway_pb2.GetTaskRequest(task_id="t\x00").SerializeToString())
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == "task_id: must not contain NUL characters"
            assert await method(gateway_pb2.GetTaskRequest(task_id="t").SerializeToString()) == b""
    finally:
        await server.stop(0)
