"""The gateway's status consumer on the server: a crashed gateway's status events come back
after its ack wait (5 s unless configured), not JetStream's default or the bus's 30 s."""

from __future__ import annotations

import pytest
from dispo.libs.contracts import tasks
from nats.js.errors import NotFoundError
from support import eventually


@pytest.mark.parametrize(
    ("env", "wanted"), [({}, 5.0), ({"DISPO_GATEWAY_STATUS_ACK_WAIT_SECONDS": "2"}, 2.0)]
)
async def test_the_status_durable_takes_the_gateways_ack_wait(
    start_service, catalogue_file, bus, env, wanted
):
    await start_service("gateway", {"DISPO_CATALOGUE": str(catalogue_file), **env})

    async def ack_wait() -> float | None:
        try:
            info = await bus.js.consumer_info(tasks.TASK_STATUS.name, "gateway-status")
        except NotFoundError:
            return None
        return info.config.ack_wait

    found = await eventually(ack_wait, lambda v: v is not None, wanted="the status durable")
    assert found == wanted
