"""A real HTTP server on 127.0.0.1 playing a party outside Dispo (a downstream, a model, a
caller's webhook, a system under evaluation).

Its port is chosen when it is made, so its URL can be handed out before it listens, and it
keeps that port across :meth:`FakeServer.stop` / :meth:`FakeServer.start`. Every request is
recorded on arrival, in order, before its handler runs: a test counts what reached the party
from :attr:`FakeServer.requests`, one entry per request, never merged by key.

    server = await fake_server({("GET", "/healthz"): lambda request: web.json_response({})})
    httpx.get(f"{server.url}/healthz")
    assert [r.path for r in server.requests] == ["/healthz"]
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (method or "*", aiohttp route path such as "/effects/{key:.+}") -> handler
Routes = Mapping[tuple[str, str], Handler]


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    # The route's match_info, e.g. {"key": ...} for "/effects/{key:.+}".
    params: dict[str, str]


class FakeServer:
    def __init__(self, routes: Routes) -> None:
        self.routes = dict(routes)
        self.requests: list[Recorded] = []
        self._runner: web.AppRunner | None = None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received(self, path: str | None = None) -> list[Recorded]:
        """The requests recorded so far, optionally only those for ``path``."""
        return [r for r in self.requests if path is None or r.path == path]

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(middlewares=[self._record])
        for (method, path), handler in self.routes.items():
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                dict(request.headers),
                await request.read(),
                dict(request.match_info),
            )
        )
        return await handler(request)
