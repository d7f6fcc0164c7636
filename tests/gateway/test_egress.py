"""SSRF through Submit, over the real gRPC API: a callback_url off the allow-list, a nats:
subject outside the business's own and a payload value that would reshape an action's
path are refused with the field named, and nothing is written."""

from __future__ import annotations

import grpc
import pytest
from dispo.libs.api.task.v1 import task_pb2
from dispo.sdk import DispoError, cell
from sqlalchemy import text
from support.auth import signing_secret

from .test_submit import counts

LISTED = "http://127.0.0.1:8181"


@pytest.fixture
def egress_allow() -> str:
    return f"{LISTED},https://hooks.example.com"


REFUSED_CALLBACKS = [
    "http://127.0.0.1:50051/",  # the gateway's own port
    "http://127.0.0.1:5432/",  # PostgreSQL
    "http://169.254.169.254/latest/meta-data/",
    "http://localhost:8181/hook",
    "http://127.0.0.1:8181@169.254.169.254/",
    "http://127.0.0.1:8181\\@169.254.169.254/",
    "http://2130706433:8181/hook",
    "http://127.1:8181/hook",
    "http://0x7f.0.0.1:8181/hook",
    "http://0177.0.0.1:8181/hook",
    "http://127.0.0.1.:8181/hook",
    "http://[::ffff:127.0.0.1]:8181/hook",
    "http://[::1]:8181/hook",
    "https://hooks.example.com.evil.example/",
    "http://hooks.example.com/",  # listed for https only
    "http://127.0.0.1:8181/hook#frag",
    "ftp://127.0.0.1:8181/",
    "file:///etc/passwd",
    "nats:task.create",
    "nats:task.status.x.succeeded",
    "nats:callbacks.other.done",
    "nats:callbacks.tests.>",
    "nats:callbacks.tests",
    "nats:callback.tests",
]


async def test_callbacks_off_the_list_are_refused_naming_the_field(
    gateway_client, service_engine, database_url
):
    await signing_secret(database_url, "tests")  # the listed webhooks are signed with it
    for url in REFUSED_CALLBACKS:
        with pytest.raises(DispoError) as refused:
            await gateway_client.submit("tests", [cell("noop")], callback_url=url)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, url
        assert list(refused.value.violations) == ["callback_url"], (url, refused.value.violations)
    assert await counts(service_engine) == (0, 0)

    for url in (f"{LISTED}/hook", "https://hooks.example.com/dispo", "nats:callbacks.tests.done"):
        await gateway_client.submit("tests", [cell("noop")], callback_url=url)
    assert await counts(service_engine) == (3, 3)


async def test_path_values_cannot_reshape_the_path(gateway_client, service_engine):
    for value in ("..", "."):
        with pytest.raises(DispoError) as refused:
            await gateway_client.submit("tests", [cell("step", name=value)])
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert list(refused.value.violations) == ["cells[0].payload.name"]
    assert await counts(service_engine) == (0, 0)

    hostile = "../@169.254.169.254/x?y=1#z%2e%2e\n"
    await gateway_client.submit("tests", [cell("step", name=hostile)])
    engine = await service_engine("gateway")
    async with engine.connect() as conn:
        # The envelope as accepted (the task.create row is deleted once published).
        [payload] = (
            await conn.execute(text("SELECT COALESCE(accepted, view) FROM tasks"))
        ).scalars()
    [node] = task_pb2.Task.FromString(payload).nodes
    assert node.spec.path == "/step/..%2F%40169.254.169.254%2Fx%3Fy%3D1%23z%252e%252e%0A"
