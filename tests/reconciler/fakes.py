"""Fakes for parties outside Dispo, on real HTTP servers (``support.http``): a downstream with
a health switch and a status probe, and a caller's webhook receiver; and receivers on plain
TCP servers that answer badly (byte by byte, never, or at great length)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
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
    # Keys whose probe answers {"done": true} followed by 8 MiB of padding.
    bloated: set[str] = field(default_factory=set)
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
        if key in self.bloated:
            return web.Response(body=b'{"done": true' + b" " * 8 * 2**20 + b"}")
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


Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawReceiver:
    """A caller's webhook receiver on a plain TCP server, answering each request as
    ``answer`` writes it: byte by byte, never, or at any length. Counts the connections it
    took and the answers it wrote to their end."""

    answer: Answer
    connections: int = 0
    finished: int = 0
    server: asyncio.Server | None = None
    _serving: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/hook")

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self._serving:
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        serving = asyncio.current_task()
        assert serving is not None
        self._serving.add(serving)
        try:
            await reader.readuntil(b"\r\n\r\n")  # the request's head; its body is not needed
            await self.answer(writer)
            self.finished += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the caller hung up
        finally:
            self._serving.discard(serving)
            writer.close()


async def drip(writer: asyncio.StreamWriter) -> None:
    """A status line, then one byte of a header every 20 ms, for ever: every read of the
    caller gets something, and its answer never ends."""
    writer.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    while True:
        writer.write(b"a")
        await writer.drain()
        await asyncio.sleep(0.02)


def dripping_body(status: int, first: int = 0) -> Answer:
    """``status`` and its head at once, then ``first`` bytes of a body, then one more byte
    every 20 ms, for ever."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\n\r\n".encode())
        writer.write(b"y" * first)
        while True:
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"y")

    return answer


async def silent(writer: asyncio.StreamWriter) -> None:
    """Takes the request and never answers."""
    await asyncio.Event().wait()


def huge(status: int, size: int) -> Answer:
    """``status`` with a body of ``size`` bytes, written as fast as the caller reads."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"x" * 65536
        for _ in range(size // len(chunk)):
            writer.write(chunk)
            await writer.drain()
        writer.write(b"x" * (size % len(chunk)))
        await writer.drain()

    return answer
