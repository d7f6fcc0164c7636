"""Drift checks between the pool's database and its driver (seed 002's 5-minute reconciliation).

A self-contained part of the reconciler. Its main process wires it with one call in
``setup`` (``services/reconciler/app.py`` does so)::

    from dispo.reconciler import drift
    await drift.install(rt, db)

(``db``: the reconciler's driver port, :meth:`~dispo.libs.service.Runtime.database`), which
(1) migrates the drift tables (own Alembic branch, version table ``alembic_version_drift``
in the reconciler schema), (2) registers ``DriftService`` on the gRPC server, and (3) adds
the periodic check as a part, its records written through ``db``. The pieces are also usable alone:
:data:`MIGRATIONS`, :func:`register`, :class:`DriftChecker` (``check_once``).
"""

from __future__ import annotations

from pathlib import Path

import grpc
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.api.reconciler.v1 import drift_pb2_grpc
from dispo.libs.db import migrate
from dispo.libs.db.driver import Database
from dispo.libs.service import Runtime
from dispo.libs.settings import DEFAULT_PORTS, service_settings_config
from dispo.reconciler.drift.checker import TIMEOUT_SECONDS, DriftChecker
from dispo.reconciler.drift.servicer import DriftServicer
from pydantic import Field
from pydantic_settings import BaseSettings

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.reconciler.v1.DriftService"

__all__ = ["MIGRATIONS", "SERVICE_NAME", "DriftChecker", "DriftSettings", "install", "register"]


class DriftSettings(BaseSettings):
    """``DISPO_RECONCILER_DRIFT_*``."""

    model_config = service_settings_config("reconciler_drift")

    pool_address: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['pool']}",
        description="The pool's gRPC address, whose state the drift checks compare",
    )
    interval_seconds: float = Field(
        default=300.0,
        description="Time between two drift checks (seed 002: pool state and database are"
        " reconciled every 5 minutes)",
    )
    timeout_seconds: float = Field(
        default=TIMEOUT_SECONDS, description="How long one call to the pool may take"
    )


def register(server: grpc.aio.Server, checker: DriftChecker) -> None:
    drift_pb2_grpc.add_DriftServiceServicer_to_server(DriftServicer(checker), server)


async def install(rt: Runtime, db: Database) -> DriftChecker:
    """Wire the drift checks into a reconciler runtime."""
    settings = DriftSettings()
    await migrate(rt.engine, rt.name, MIGRATIONS)
    channel = rt.channel(settings.pool_address)
    checker = DriftChecker(
        db, pool_pb2_grpc.PoolServiceStub(channel), rt.clock, settings.timeout_seconds
    )
    rt.add_servicer(lambda server: register(server, checker), SERVICE_NAME)
    # Every ``interval_seconds`` of the clock (the seed's 5 minutes by default); a pool that
    # is restarting fails one check, the next interval tries again.
    rt.add_periodic("drift checks", checker.check_once, settings.interval_seconds)
    return checker
