"""The reconciler service process: wires its servicers and background parts into the runtime."""

from __future__ import annotations

from pathlib import Path

from dispo.libs.service import Runtime, run_service
from dispo.reconciler import drift
from dispo.reconciler.wiring import SERVICE_NAME, wire_recovery

MIGRATIONS = Path(__file__).parent / "migrations"
__all__ = ["MIGRATIONS", "SERVICE_NAME", "main", "setup"]


async def setup(rt: Runtime) -> None:
    ctx = await wire_recovery(rt)  # task recovery, demotion, settlement, completion, arbitration
    await drift.install(rt, ctx.db)  # DriftService, its tables and the 5-minute pool drift check


def main() -> None:
    run_service("reconciler", setup, migrations=MIGRATIONS)
