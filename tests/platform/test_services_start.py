"""The five services start as real processes, answer health and list themselves by reflection."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dispo.libs.health import health_status
from dispo.tools.stack.stack import SERVICES
from support import eventually

GRPCURL = str(Path(sys.executable).parent / "grpcurl")


@pytest.mark.blank_database  # each service migrates its own schema on start
@pytest.mark.parametrize("name", SERVICES)
async def test_service_process_serves_health_and_reflection(name, start_service):
    service = await start_service(name)

    assert await health_status(service.address) == "SERVING"
    listed = subprocess.run(
        [GRPCURL, "-plaintext", service.address, "list"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert f"dispo.{name}.v1.{name.capitalize()}Service" in listed
    assert "grpc.health.v1.Health" in listed
    health = json.loads(
        subprocess.run(
            [GRPCURL, "-plaintext", service.address, "grpc.health.v1.Health/Check"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert health == {"status": "SERVING"}


async def test_sigterm_reports_not_serving_and_exits_cleanly(start_service):
    service = await start_service("gateway")

    code = await service.stop()

    assert code == 0
    assert await health_status(service.address) == "UNREACHABLE"
    assert '"event": "stopped"' in service.log_path.read_text()


async def test_service_waits_for_database_then_serves(infra, start_service):
    infra.postgres.stop()
    try:
        service = await start_service("reconciler", wait=False)

        def waiting() -> bool:
            assert service.process.poll() is None, service.log_tail()
            return "waiting for database" in service.log_path.read_text()

        await eventually(waiting, wanted="the service waiting for the database")
        assert await health_status(service.address) == "UNREACHABLE"
    finally:
        infra.postgres.start()
    await service.wait_ready()
    assert await health_status(service.address) == "SERVING"
