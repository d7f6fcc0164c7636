"""The one downstream health check: 2xx from the health URL is healthy, anything else says
why not; no health URL counts as healthy."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from dispo.libs.downstream_health import check_health
from dispo.libs.process import free_port


@pytest.fixture
async def downstream():
    answers = {"status": 200}

    async def health(_: web.Request) -> web.Response:
        return web.json_response({}, status=answers["status"])

    app = web.Application()
    app.router.add_get("/healthz", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/healthz", answers
    await runner.cleanup()


async def test_healthy_on_2xx_and_unhealthy_with_the_reason_otherwise(downstream):
    url, answers = downstream
    async with httpx.AsyncClient() as client:
        assert await check_health(client, url, 2.0) == (True, "")
        answers["status"] = 503
        assert await check_health(client, url, 2.0) == (False, "health check answered HTTP 503")
        healthy, why = await check_health(client, f"http://127.0.0.1:{free_port()}/", 2.0)
        assert not healthy and why.startswith("health check failed: ") and len(why) <= 500
        assert await check_health(client, "", 2.0) == (True, "")
