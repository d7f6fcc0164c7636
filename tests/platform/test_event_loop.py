"""Services run on uvloop unless told not to, and gRPC's asyncio server and client work on it."""

from __future__ import annotations

import asyncio

import uvloop
from dispo.libs.auth import Authorizer
from dispo.libs.eventloop import loop_factory, new_event_loop
from dispo.libs.grpcserver import create_server
from dispo.libs.health import health_status


def test_the_loop_is_uvloop_unless_turned_off():
    assert loop_factory(True) is uvloop.new_event_loop
    assert loop_factory(False) is None
    uv, plain = new_event_loop(), new_event_loop(uvloop=False)  # aiohttp's run_app takes one
    try:
        assert isinstance(uv, uvloop.Loop) and not isinstance(plain, uvloop.Loop)
    finally:
        uv.close()
        plain.close()


def test_a_grpc_server_answers_on_uvloop():
    async def serve_and_ask() -> tuple[str, str]:
        server = create_server("127.0.0.1:0", [], ["dispo.test.v1.Nothing"], Authorizer.refusing())
        await server.start()
        await server.set_serving()
        try:
            address = f"127.0.0.1:{server.port}"
            return type(asyncio.get_running_loop()).__module__, await health_status(address)
        finally:
            await server.stop(0)

    with asyncio.Runner(loop_factory=loop_factory(True)) as runner:
        loop_module, status = runner.run(serve_and_ask())
    assert loop_module.startswith("uvloop") and status == "SERVING"
