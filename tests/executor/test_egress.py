"""The executor calls a declared downstream at its own origin whatever a node's path holds
(a forged task.create included), and follows no redirect; with the real HTTP client."""

from __future__ import annotations

import pytest
from aiohttp import web
from dispo.executor.actions import Call, http_session, run_action
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome
from dispo.libs.catalogue import Downstream


def call(path: str) -> Call:
    return Call("t1", "a.call", "t1/a.call", ActionSpec("http", "demo", "POST", path), b"{}")


async def servers(fake_server):
    ok = lambda _: web.json_response({})  # noqa: E731
    elsewhere = await fake_server({("*", "/{tail:.*}"): ok})

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{elsewhere.url}/internal")

    downstream = await fake_server({("POST", "/moved"): redirect, ("*", "/{tail:.*}"): ok})
    return downstream, elsewhere


@pytest.mark.parametrize(
    "path",
    ["@127.0.0.1:{port}/x", ":{port}/x", ".evil.example/x", "/api/../../x", "/x#{port}", "/x y"],
)
async def test_a_path_that_would_leave_the_downstream_is_not_sent(fake_server, path):
    downstream, elsewhere = await servers(fake_server)
    registry = Downstream("demo", f"{downstream.url}/api")
    async with http_session() as client:
        result = await run_action(client, call(path.format(port=elsewhere.port)), registry)
    assert result.outcome is CallOutcome.DEFINITE and "not sent" in result.detail
    assert downstream.requests == [] and elsewhere.requests == []


async def test_a_redirect_is_not_followed(fake_server):
    downstream, elsewhere = await servers(fake_server)
    async with http_session() as client:
        result = await run_action(client, call("/moved"), Downstream("demo", downstream.url))
        sent = await run_action(client, call("/labels/c-1"), Downstream("demo", downstream.url))
    assert result.outcome is CallOutcome.DEFINITE and "HTTP 307" in result.detail
    assert sent.outcome is CallOutcome.SUCCESS
    assert [r.path for r in downstream.requests] == ["/moved", "/labels/c-1"]
    assert elsewhere.requests == []
