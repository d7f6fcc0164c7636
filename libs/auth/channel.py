"""The client side: every gRPC channel Dispo opens (SDK, CLI, services, tests) comes from
here and carries its token as ``authorization: Bearer <token>`` on every call.

    async with open_channel("127.0.0.1:50051", token) as channel: ...
    with open_sync_channel("127.0.0.1:50051", token) as channel: ...

``token`` may be empty (health checks need none): the calls then carry no credentials.
``tls`` (:class:`dispo.libs.tls.ClientTLS`) makes the channel TLS only, verifying the
server against its CA and presenting its client certificate if it has one; by default it is
this process's ``DISPO_TLS_*`` settings, read once (none: plaintext; ``PLAINTEXT`` asks for
plaintext).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence
from typing import Any

import grpc
from dispo.libs.auth.server import METADATA_KEY
from dispo.libs.settings import TLSSettings
from dispo.libs.tls import ClientTLS

Options = Sequence[tuple[str, Any]]


def _with_token(metadata: Any, token: str) -> list[tuple[str, str | bytes]]:
    pairs = [(k, v) for k, v in (metadata or ()) if k.lower() != METADATA_KEY]
    return [*pairs, (METADATA_KEY, f"Bearer {token}")]


def bearer(token: str) -> list[tuple[str, str | bytes]]:
    """The metadata of one call made for ``token``'s holder on a channel opened without a
    token (the console forwards each of its users' tokens on shared channels)."""
    return _with_token((), token)


class _AioBearer:
    """Adds the token to a call's metadata (grpc.aio takes one interceptor per kind of call:
    an interceptor of several kinds would be used for the first kind only)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*_with_token(details.metadata, self.token)),
            details.credentials,
            details.wait_for_ready,
        )


class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


@functools.cache
def _process_tls() -> ClientTLS:
    """This process's ``DISPO_TLS_*`` settings, read from its environment on the first
    channel (a health poll or a sweep opens one each time): they do not change while it
    runs, as its server's do not."""
    return TLSSettings().client


def _tls(tls: ClientTLS | None) -> ClientTLS:
    return tls if tls is not None else _process_tls()


def open_channel(
    address: str,
    token: str,
    *,
    options: Options | None = None,
    tls: ClientTLS | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` whose calls carry ``token``, over ``tls`` (default:
    this process's settings)."""
    interceptors: list[Any] | None = None
    if token:
        interceptors = [
            kind(token)
            for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
        ]
    transport = _tls(tls)
    if transport.enabled:
        return grpc.aio.secure_channel(
            address, transport.credentials(), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


class _Details(
    collections.namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """A call's details with the token added (the blocking API's interceptors need a class)."""


class _SyncBearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self.token = token

    def _details(self, details: Any) -> Any:
        return _Details(
            details.method,
            details.timeout,
            _with_token(details.metadata, self.token),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def open_sync_channel(
    address: str,
    token: str,
    *,
    options: Options | None = None,
    tls: ClientTLS | None = None,
) -> grpc.Channel:
    """A blocking channel to ``address`` whose calls carry ``token``, over ``tls`` (default:
    this process's settings)."""
    transport = _tls(tls)
    channel = (
        grpc.secure_channel(address, transport.credentials(), options=options)
        if transport.enabled
        else grpc.insecure_channel(address, options=options)
    )
    return grpc.intercept_channel(channel, _SyncBearer(token)) if token else channel
