"""Fakes for parties outside Dispo, as real HTTP servers on 127.0.0.1: a downstream with
a health switch and a status probe, and a caller's webhook receiver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from dispo.libs.stack.nats import free_port


@dataclass
class FakeDownstream:
    """GET /healthz (200 or 503), GET /effects/<key> ({"done": bool}), counts probe calls."""

    healthy: bool = True
    done: dict[str, bool] = field(default_factory=dict)
    # Keys whose probe answers 500 (the downstream cannot say).
    broken: set[str] = field(default_factory=set)
    probes: dict[str, int] = field(default_factory=dict)
    health_checks: int = 0
    port: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/effects/{key:.+}", self._effect)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _health(self, _: web.Request) -> web.Response:
        self.health_checks += 1
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def _effect(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        self.probes[key] = self.probes.get(key, 0) + 1
        if key in self.broken:
            return web.json_response({"error": "cannot say"}, status=500)
        return web.json_response({"done": self.done.get(key, False)})


@dataclass
class CallbackReceiver:
    """Records every POST it receives (body and headers); can be stopped and started."""

    port: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _hook(self, request: web.Request) -> web.Response:
        self.received.append({"body": await request.read(), "headers": dict(request.headers)})
        return web.json_response({"ok": True})
