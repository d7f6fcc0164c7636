"""Webhook signing secrets per business, through a real gateway, executor and reconciler and a
real HTTP receiver that verifies each callback the way docs/security.md tells receivers to:
no secret, no webhook (refused at Submit, nothing written); the secret shown when the
business's first token is made verifies its callbacks and no other business's; during a
rotation the old and the new secret both verify; once it is finished only the new one."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import grpc
import pytest
from aiohttp import web
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.db import create_engine
from outbox_subjects import rows_written
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE
from sqlalchemy import text
from support.http import FakeServer, Recorded

DEAD_URL = "http://127.0.0.1:9"


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: int = 300) -> bool:
    """A receiver's check, as docs/security.md gives it: a fresh timestamp, and one of the
    comma-separated signatures the HMAC-SHA256 of "<timestamp>." + body under ``secret``."""
    timestamp = headers["X-Dispo-Timestamp"]
    if abs(time.time() - int(timestamp)) > tolerance:
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    expected = "sha256=" + mac.hexdigest()
    return any(
        hmac.compare_digest(expected, given.strip())
        for given in headers["X-Dispo-Signature"].split(",")
    )


class Receiver:
    """A business's webhook: answers 204 to a callback one of its secrets verifies, 401 to
    any other (the reconciler then retries, and the test waiting for it fails)."""

    def __init__(self) -> None:
        self.secrets: list[str] = []
        self.arrived: dict[str, asyncio.Future[Recorded]] = {}
        self.server = FakeServer({("POST", "/hook"): self._hook})

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        if not any(verify(s, headers, body) for s in self.secrets):
            return web.Response(status=401)
        task_id = headers["X-Dispo-Task-Id"]
        got = self.arrived.setdefault(task_id, asyncio.get_running_loop().create_future())
        if not got.done():
            got.set_result(Recorded("POST", "/hook", headers, body, {}))
        return web.Response(status=204)

    async def callback(self, task_id: str) -> Recorded:
        got = self.arrived.setdefault(task_id, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(got, 30)


@pytest.fixture(scope="module")
async def receiver():
    r = Receiver()
    await r.server.start()
    yield r
    await r.server.stop()


@pytest.fixture(scope="module")
async def stack(module_services, tmp_path_factory, receiver):
    catalogue = tmp_path_factory.mktemp("catalogue") / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=DEAD_URL))
    env = {"DISPO_CATALOGUE": str(catalogue), "DISPO_EGRESS_ALLOW": receiver.server.url}
    extra = {
        "executor": EXECUTOR_TEST_ENV,
        "reconciler": {"DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0.2"},
    }
    names = ("gateway", "executor", "reconciler")
    started = await asyncio.gather(
        *(module_services.start(name, {**env, **extra.get(name, {})}) for name in names)
    )
    return dict(zip(names, started, strict=True))


@pytest.fixture(scope="module")
async def admin(stack, tokens):
    async with open_channel(stack["gateway"].address, tokens.admin) as channel:
        yield auth_pb2_grpc.TokenServiceStub(channel), gateway_pb2_grpc.GatewayServiceStub(channel)


def submit(business: str, callback_url: str) -> gateway_pb2.SubmitRequest:
    return gateway_pb2.SubmitRequest(
        business=business,
        cells=[gateway_pb2.CellRequest(cell="noop", payload_json=b"{}")],
        callback_url=callback_url,
    )


async def written(database_url: str, business: str) -> tuple[int, int]:
    """(the business's tasks, every task.create the outbox wrote) in the gateway's tables."""
    engine = create_engine(database_url, "gateway")
    try:
        async with engine.connect() as conn:
            tasks = await conn.scalar(
                text("SELECT count(*) FROM gateway.tasks WHERE business = :b"), {"b": business}
            )
            creates = await conn.scalar(text(rows_written("gateway")))
    finally:
        await engine.dispose()
    return tasks, creates


async def test_a_webhook_without_a_signing_secret_is_refused_at_submit(
    admin, receiver, module_database
):
    _, gateway = admin
    before = await written(module_database, "unsigned")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gateway.Submit(submit("unsigned", f"{receiver.server.url}/hook"))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith("callback_url: business 'unsigned' has no webhook")
    assert "dispo tokens rotate-secret --business unsigned" in refused.value.details()
    assert await written(module_database, "unsigned") == before
    # A nats: callback needs no signing secret.
    await gateway.Submit(submit("unsigned", "nats:callbacks.unsigned.done"))
    assert (await written(module_database, "unsigned"))[0] == before[0] + 1


async def test_callbacks_verify_with_the_secrets_of_their_business_through_a_rotation(
    stack, admin, receiver
):
    tokens, gateway = admin
    hook = f"{receiver.server.url}/hook"
    made = await tokens.CreateToken(
        auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business="signed")
    )
    first = made.signing_secret
    assert first.startswith("whsec_") and made.signing_secret_info.business == "signed"
    again = await tokens.CreateToken(
        auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business="signed")
    )
    assert again.signing_secret == ""  # one secret per business, shown once
    other = await tokens.CreateToken(
        auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business="elsewhere")
    )
    receiver.secrets = [first]

    async def callback() -> Recorded:
        async with open_channel(stack["gateway"].address, made.secret) as channel:
            own = gateway_pb2_grpc.GatewayServiceStub(channel)
            task = await own.Submit(submit("signed", hook))
        return await receiver.callback(task.task_id)

    got = await callback()
    assert verify(first, got.headers, got.body)
    assert not verify(other.signing_secret, got.headers, got.body)

    rotated = await tokens.RotateSigningSecret(
        auth_pb2.RotateSigningSecretRequest(business="signed", grace_seconds=3600)
    )
    second = rotated.secret
    assert rotated.previous.secret_id == made.signing_secret_info.secret_id
    assert rotated.previous.HasField("retires_at") and second not in (first, "")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await tokens.RotateSigningSecret(auth_pb2.RotateSigningSecretRequest(business="signed"))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    got = await callback()  # the receiver still holds only the first: it verifies
    assert verify(first, got.headers, got.body) and verify(second, got.headers, got.body)
    receiver.secrets = [second]  # the receiver moves to the new secret, then the rotation ends
    assert len(got.headers["X-Dispo-Signature"].split(",")) == 2

    await tokens.FinishSigningSecretRotation(
        auth_pb2.FinishSigningSecretRotationRequest(business="signed")
    )
    listed = await tokens.ListSigningSecrets(auth_pb2.ListSigningSecretsRequest(business="signed"))
    assert [s.secret_id for s in listed.secrets] == [rotated.current.secret_id]
    every = await tokens.ListSigningSecrets(auth_pb2.ListSigningSecretsRequest())
    assert [
        (s.business, s.secret_id) for s in every.secrets if s.business in ("elsewhere", "signed")
    ] == [
        ("elsewhere", other.signing_secret_info.secret_id),
        ("signed", rotated.current.secret_id),
    ]
    got = await callback()
    assert verify(second, got.headers, got.body)
    assert not verify(first, got.headers, got.body)
    assert not verify(other.signing_secret, got.headers, got.body)
