"""Ask a Dispo server for its gRPC health (the standard ``grpc.health.v1`` service), over
``tls`` (default: this process's ``DISPO_TLS_*`` settings, as every channel)."""

from __future__ import annotations

import asyncio

import grpc
from dispo.libs.auth.channel import open_channel
from dispo.libs.tls import ClientTLS
from grpc_health.v1 import health_pb2, health_pb2_grpc

UNREACHABLE = "UNREACHABLE"


async def health_status(
    address: str, service: str = "", timeout: float = 1.0, *, tls: ClientTLS | None = None
) -> str:
    """``SERVING``, ``NOT_SERVING``, … or ``UNREACHABLE`` when nothing answers (a server
    that refuses the channel's transport included)."""
    async with open_channel(address, "", tls=tls) as channel:  # health needs no token
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(  # type: ignore[attr-defined]  # the stub package's HealthStub declares no methods
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return UNREACHABLE
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def http_health_status(url: str, timeout: float = 1.0) -> str:
    """The gRPC health words for a process without gRPC whose ``url`` answers 200 once it
    serves (the web console): ``SERVING``, ``NOT_SERVING``, or ``UNREACHABLE``."""
    import httpx  # only where asked: the CLI's other commands need no HTTP client

    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            reply = await client.get(url)
    except httpx.HTTPError:
        return UNREACHABLE
    return "SERVING" if reply.status_code == 200 else "NOT_SERVING"


async def wait_until_serving(
    address: str, timeout: float = 60.0, interval: float = 0.2, *, tls: ClientTLS | None = None
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    status = UNREACHABLE
    while loop.time() < deadline:
        status = await health_status(address, tls=tls)
        if status == "SERVING":
            return
        await asyncio.sleep(interval)
    raise TimeoutError(f"{address} not SERVING after {timeout}s (last: {status})")
