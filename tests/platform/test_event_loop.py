"""Services run on uvloop unless told not to, and gRPC's asyncio server and client work on it."""

from __future__ import annotations

import asyncio

import uvloop
from dispo.libs.auth import Authorizer
from dispo.libs.grpcserver import create_server
from dispo.libs.health import health_status
from dispo.libs.service import _loop_factory


def test_the_loop_is_uvloop_unless_turned_off():
    assert _loop_factory(True) is uvloop.new_event_loop
    assert _loop_factory(False) is None


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

    with asyncio.Runner(loop_factory=_loop_factory(True)) as runner:
        loop_module, status = runner.run(serve_and_ask())
    assert loop_module.startswith("uvloop") and status == "SERVING"
