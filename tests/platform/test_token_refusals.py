"""A refusal costs less than a request (ADR-0078): a wrong token is refused again without a
read of the token store, and a caller address whose reads keep failing is refused before the
database, while tokens already checked still pass. Through a real gRPC server on the test's
database, with the server's clock in the test's hands."""

from __future__ import annotations

import grpc
import pytest
from dispo.auth import store
from dispo.libs.auth import Authorizer, Kind, open_channel
from dispo.libs.auth.rules import ADMIN, RULES
from dispo.libs.auth.tokens import new_secret, secret_hash
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.db import create_engine
from dispo.libs.db.driver import Database
from dispo.libs.grpcserver import create_server
from dispo.libs.ratelimit import TokenBuckets
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.auth import record

SERVICE = "dispo.test.v1.Echo"
METHOD = f"/{SERVICE}/Call"
REFUSED_SECONDS = 2.0
BURST = 5


def echo(server: grpc.aio.Server) -> None:
    async def call(request: bytes, context) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {"Call": grpc.unary_unary_rpc_method_handler(call, None, None)},
    )
    server.add_generic_rpc_handlers((handler,))


@pytest.fixture
async def served(database_url, manual_clock):
    """A server whose verifier remembers refusals for REFUSED_SECONDS and lets one address
    fail BURST reads at once, one more a second; and a way to add a token to the store."""
    engine = create_engine(database_url, "auth")
    db = await Database.open(database_url, "auth", size=2)
    verifier = TokenVerifier(
        db,
        manual_clock,
        5,
        refused_seconds=REFUSED_SECONDS,
        failures=TokenBuckets(rate=1, burst=BURST, clock=manual_clock),
    )
    server = create_server(
        "127.0.0.1:0", [echo], [SERVICE], Authorizer(verifier, {**RULES, METHOD: ADMIN})
    )
    await server.start()

    db = await Database.open(database_url, "auth", size=1)

    async def add_token(secret: str) -> None:
        async with db.connection() as conn:
            await store.token_insert(conn, record(Kind.ADMIN), secret_hash(secret))

    try:
        yield verifier, server.port, add_token
    finally:
        await server.stop(0)
        await db.close()
        await engine.dispose()


async def outcome(port: int, secret: str) -> grpc.aio.AioRpcError | None:
    """None when the call passed, else its error."""
    async with open_channel(f"127.0.0.1:{port}", secret) as channel:
        try:
            await channel.unary_unary(METHOD)(b"x", timeout=10)
        except grpc.aio.AioRpcError as error:
            return error
    return None


async def test_a_wrong_token_is_refused_again_without_a_read(served):
    verifier, port, add_token = served
    valid = new_secret()
    await add_token(valid)
    assert await outcome(port, valid) is None
    unknown = new_secret()
    for _ in range(100):
        refused = await outcome(port, unknown)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.details() == "unknown token"
    assert verifier.store_reads == 2  # the valid token once, the unknown one once
    assert await outcome(port, valid) is None  # cached: still no read
    assert verifier.store_reads == 2


async def test_an_address_whose_reads_keep_failing_is_refused_before_the_database(
    served, manual_clock
):
    verifier, port, add_token = served
    valid, later = new_secret(), new_secret()
    await add_token(valid)
    await add_token(later)
    assert await outcome(port, valid) is None  # checked before the flood: cached
    codes = [await outcome(port, new_secret()) for _ in range(30)]  # each one a new token
    assert [e.code() for e in codes[:BURST]] == [grpc.StatusCode.UNAUTHENTICATED] * BURST
    over = codes[BURST:]
    assert {e.code() for e in over} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert "too many failed authentications from ipv4:127.0.0.1" in over[0].details()
    retry = error_details_pb2.RetryInfo()
    assert rpc_status.from_call(over[0]).details[0].Unpack(retry)
    assert retry.retry_delay.ToNanoseconds() > 0
    assert verifier.store_reads == 1 + BURST

    assert await outcome(port, valid) is None  # a token already checked still passes
    # A valid token not checked yet waits for the address's next read, like any other ...
    waiting = await outcome(port, later)
    assert waiting is not None and waiting.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    manual_clock.advance(1)
    assert await outcome(port, later) is None  # ... and a valid read costs the address nothing
    assert await outcome(port, new_secret()) is not None
    assert verifier.store_reads == 1 + BURST + 2


async def test_a_token_made_after_a_refusal_passes_once_the_refusal_ends(served, manual_clock):
    verifier, port, add_token = served
    secret = new_secret()
    assert (await outcome(port, secret)).code() == grpc.StatusCode.UNAUTHENTICATED
    await add_token(secret)  # made by another process after the miss
    assert (await outcome(port, secret)).code() == grpc.StatusCode.UNAUTHENTICATED
    manual_clock.advance(REFUSED_SECONDS)
    assert await outcome(port, secret) is None
    assert verifier.store_reads == 2

    # Made by this process (the gateway's CreateToken): the refusal is forgotten at once.
    made_here = new_secret()
    assert (await outcome(port, made_here)).code() == grpc.StatusCode.UNAUTHENTICATED
    await add_token(made_here)
    verifier.forget_refused(made_here)
    assert await outcome(port, made_here) is None
