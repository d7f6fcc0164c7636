"""A service whose PostgreSQL is down answers UNAVAILABLE (retry later), never INTERNAL: the
mapping lives in the common gRPC interceptor, so every service has it. The real embedded
PostgreSQL is stopped under running service processes."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
import pytest
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.intelligence.v1 import intelligence_pb2, intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import pool_pb2, pool_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2, reconciler_pb2_grpc
from dispo.libs.db import database_unreachable
from dispo.libs.process import free_port
from support.auth import admin_channel

Call = Callable[[grpc.aio.Channel], Awaitable[object]]

# One read per service that needs its database to answer.
CALLS: dict[str, Call] = {
    "pool": lambda ch: pool_pb2_grpc.PoolServiceStub(ch).GetPoolStatus(
        pool_pb2.GetPoolStatusRequest(), timeout=20
    ),
    "reconciler": lambda ch: reconciler_pb2_grpc.ReconcilerServiceStub(ch).ListRecoveryTasks(
        reconciler_pb2.ListRecoveryTasksRequest(), timeout=20
    ),
    "intelligence": lambda ch: intelligence_pb2_grpc.IntelligenceServiceStub(ch).ListJobs(
        intelligence_pb2.ListJobsRequest(), timeout=20
    ),
    "gateway": lambda ch: gateway_pb2_grpc.GatewayServiceStub(ch).ListTasks(
        gateway_pb2.ListTasksRequest(), timeout=20
    ),
}
ENV = {"pool": {"DISPO_POOL_SPAWN_WORKER": "false"}}


@pytest.mark.parametrize("name", ["pool", "reconciler", "intelligence", "gateway"])
async def test_a_service_answers_unavailable_while_postgres_is_down(
    name, infra, start_service, tmp_path
):
    env = dict(ENV.get(name, {}))
    if name == "pool":
        env["DISPO_POOL_LOCAL_REGISTRY"] = str(tmp_path / "registry.sqlite")
    service = await start_service(name, env)
    call = CALLS[name]
    async with admin_channel(service.address) as channel:
        await call(channel)  # the database is up: answered
        infra.postgres.stop("immediate")  # a crash: connections cut, the socket gone
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
            # it claims nothing about the request's fate: it may have taken effect
            details = refused.value.details()
            assert "could not be reached" in details and "retry" in details, details
            assert "not known" in details and "nothing" not in details, details
        finally:
            infra.postgres.start()
        for _ in range(100):  # and once it is back, answered again
            try:
                await call(channel)
                break
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("not answered after PostgreSQL came back")


async def test_only_a_database_that_cannot_be_reached_counts_as_down(database_url):
    with pytest.raises(OSError) as refused:  # nothing listens there: raised in the driver
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    assert database_unreachable(refused.value)
    # The same kinds of error raised by anything else are not the database.
    assert not database_unreachable(ConnectionRefusedError("a downstream refused"))
    with pytest.raises(OSError) as unrelated:
        subprocess.run(["/nonexistent/openclaw"], check=False)
    assert not database_unreachable(unrelated.value)
    # A database that answers with an error is up: that error is not UNAVAILABLE.
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.PostgresError) as bad:
            await conn.execute("SELECT * FROM no_such_table")
        assert not database_unreachable(bad.value)
    finally:
        await conn.close()
    assert database_unreachable(asyncpg.exceptions.CannotConnectNowError("starting up"))
