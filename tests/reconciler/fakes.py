"""Fakes for parties outside Dispo, on real HTTP servers (``support.http``): a downstream with
a health switch and a status probe, and a caller's webhook receiver."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from support.http import FakeServer, Routes


@dataclass
class FakeDownstream:
    """GET /healthz (200 or 503), GET /effects/<key> ({"done": bool}); counts what it served."""

    healthy: bool = True
    done: dict[str, bool] = field(default_factory=dict)
    # Keys whose probe answers 500 (the downstream cannot say).
    broken: set[str] = field(default_factory=set)
    # Keys whose probe fences what it has not seen done: {"done": false, "fenced": true}.
    fencing: set[str] = field(default_factory=set)
    # Keys whose probe answers this JSON as it stands (nonsense, say).
    answers: dict[str, Any] = field(default_factory=dict)
    server: FakeServer | None = None

    def routes(self) -> Routes:
        return {("GET", "/healthz"): self._health, ("GET", "/effects/{key:.+}"): self._effect}

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def probes(self) -> dict[str, int]:
        """Probe requests per idempotency key (every request counted)."""
        assert self.server is not None
        return dict(Counter(r.params["key"] for r in self.server.requests if "key" in r.params))

    @property
    def health_checks(self) -> int:
        assert self.server is not None
        return len(self.server.received("/healthz"))

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def _effect(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        if key in self.broken:
            return web.json_response({"error": "cannot say"}, status=500)
        if key in self.answers:
            return web.json_response(self.answers[key])
        done = self.done.get(key, False)
        if key in self.fencing and not done:
            return web.json_response({"done": False, "fenced": True})
        return web.json_response({"done": done})


@dataclass
class CallbackReceiver:
    """Records every POST it receives (body and headers); can be stopped and started."""

    server: FakeServer | None = None

    def routes(self) -> Routes:
        return {("POST", "/hook"): self._hook}

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"{self.server.url}/hook"

    @property
    def received(self) -> list[dict[str, Any]]:
        assert self.server is not None
        return [{"body": r.body, "headers": r.headers} for r in self.server.received("/hook")]

    async def start(self) -> None:
        assert self.server is not None
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop()

    async def _hook(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})
