"""The reconciler's HTTP client (probes, health checks, callbacks): it reads at most
:data:`ANSWER_LIMIT` bytes of any answer, so a downstream or a caller's receiver answering
at great length costs a bounded prefix, never its whole answer in memory; and it asks for
answers uncompressed, so the bound is on what is decoded too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

# Bytes of an answer read at most: a probe's {"done": ...} and a health check's answer are
# far shorter; a callback's answer is not read at all (a prefix for the error of a refusal).
ANSWER_LIMIT = 64 * 1024


class AnswerTooLong(httpx.ReadError):
    """More than the bound came: the answer is not read further."""


class _Bounded(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int, request: httpx.Request) -> None:
        self.inner, self.limit, self.request = inner, limit, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise AnswerTooLong(
                    f"answer longer than {self.limit} bytes: not read further",
                    request=self.request,
                )
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """``inner`` whose answers end with :class:`AnswerTooLong` past ``limit`` bytes."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int = ANSWER_LIMIT) -> None:
        self.inner, self.limit = inner, limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Bounded(response.stream, self.limit, request),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client(max_connections: int = 64) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=BoundedTransport(
            httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=max_connections))
        ),
        headers={"Accept-Encoding": "identity"},
    )


async def read_prefix(response: httpx.Response, limit: int) -> bytes:
    """At most the first ``limit`` bytes of a streamed answer (the rest is not read)."""
    got = bytearray()
    async for chunk in response.aiter_bytes():
        got += chunk
        if len(got) >= limit:
            break
    return bytes(got[:limit])
