"""The gateway service process: wires its servicers and background parts into the runtime."""

from __future__ import annotations

from pathlib import Path

from dispo.libs.service import Runtime, run_service

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.gateway.v1.GatewayService"


async def setup(rt: Runtime) -> None:
    rt.service_names.append(SERVICE_NAME)


def main() -> None:
    run_service("gateway", setup, migrations=MIGRATIONS)
