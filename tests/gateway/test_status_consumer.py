"""The gateway's status consumer on the server: a crashed gateway's status events come back
after its ack wait (5 s unless configured), not JetStream's default or the bus's 30 s; a
snapshot out of Submit's bounds is quarantined at once."""

from __future__ import annotations

import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.quarantine.v1 import quarantine_pb2, quarantine_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from nats.js.errors import NotFoundError
from support import eventually
from support.auth import admin_channel


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


def _forged(view: task_pb2.Task, version: int, status: int, **fields) -> task_pb2.Task:
    env = tasks.status_snapshot(view)
    env.version, env.status = version, status
    for name, value in fields.items():
        setattr(env, name, value)
    return env


async def test_a_snapshot_the_gateway_would_not_accept_is_quarantined_at_once(gateway_only, bus):
    """A status snapshot from the bus is checked as strictly as a Submit: one out of bounds
    is refused at its first delivery, to the quarantine; a well-formed one that would take a
    SUCCEEDED view to FAILED is not applied."""
    address = gateway_only.gateway.address
    async with admin_channel(address) as channel:
        gateway = gateway_pb2_grpc.GatewayServiceStub(channel)
        quarantine = quarantine_pb2_grpc.QuarantineServiceStub(channel)
        accepted = await gateway.Submit(
            gateway_pb2.SubmitRequest(
                business="tests", cells=[gateway_pb2.CellRequest(cell="noop", ref="a")]
            )
        )
        task_id = accepted.task_id
        view = (await gateway.GetTask(gateway_pb2.GetTaskRequest(task_id=task_id))).task
        done = _forged(view, 1, common_pb2.TASK_STATUS_SUCCEEDED)
        for node in done.nodes:
            node.status = common_pb2.NODE_STATUS_SUCCEEDED
        await bus.publish(
            tasks.task_status(task_id, done.status),
            done.SerializeToString(),
            msg_id=tasks.status_id(task_id, 1),
        )
        await eventually(
            lambda: gateway.GetTask(gateway_pb2.GetTaskRequest(task_id=task_id)),
            lambda v: v.task.status == common_pb2.TASK_STATUS_SUCCEEDED,
            wanted="the task SUCCEEDED in the view",
        )

        failed = common_pb2.TASK_STATUS_FAILED
        huge = _forged(done, 5, common_pb2.TASK_STATUS_RUNNING)
        for i in range(10_000):
            huge.nodes.add(node_id=f"x{i}", status=common_pb2.NODE_STATUS_PENDING)
        strange_node = _forged(done, 6, failed)
        strange_node.nodes[0].status = 99
        refused = {
            "version": _forged(done, 2**62, failed),
            "nodes": huge,
            "generation": _forged(done, 7, failed, generation=2**62),
            "generation ": _forged(done, 8, failed, generation=-5),
            "nodes[0].status": strange_node,
        }
        subject = f"task.status.{task_id}.failed"
        for n, env in enumerate(refused.values()):
            await bus.publish(subject, env.SerializeToString(), msg_id=f"forged-{n}")
        # Well-formed, within every bound: acked, and the SUCCEEDED view stays.
        await bus.publish(
            subject, _forged(done, 1_000, failed).SerializeToString(), msg_id="regress"
        )

        listed = await eventually(
            lambda: quarantine.ListMessages(quarantine_pb2.ListMessagesRequest()),
            lambda r: r.total == len(refused),
            wanted=f"{len(refused)} snapshots quarantined",
            describe=lambda r: str([m.error for m in r.messages]),
        )
        assert all(m.deliveries == 1 for m in listed.messages), listed
        errors = sorted(m.error for m in listed.messages)
        for field in refused:
            assert any(f"refused: {field.strip()}" in e for e in errors), (field, errors)
        await eventually(
            lambda: bus.js.consumer_info(tasks.TASK_STATUS.name, "gateway-status"),
            lambda info: info.num_ack_pending == 0 and info.num_pending == 0,
            wanted="every snapshot handled",
        )
        now = (await gateway.GetTask(gateway_pb2.GetTaskRequest(task_id=task_id))).task
        assert (now.status, now.version) == (common_pb2.TASK_STATUS_SUCCEEDED, 1)
