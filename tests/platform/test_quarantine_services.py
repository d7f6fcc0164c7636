"""Every consumer of every service quarantines what it cannot process, in that service's own
schema, and goes on with the messages behind it; the quarantine is read and acted on over
each service's QuarantineService. Real processes, NATS and PostgreSQL."""

from __future__ import annotations

import json

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2, intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import events_pb2
from dispo.libs.api.quarantine.v1 import quarantine_pb2 as pb
from dispo.libs.api.quarantine.v1 import quarantine_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import evaluations, tasks
from support import eventually
from support.auth import admin_channel

GARBAGE = b"\xff\x00garbage"
BOUNDED = {
    "DISPO_CONSUMER_MAX_FAILURES": "2",
    "DISPO_CONSUMER_RETRY_BASE_SECONDS": "0.05",
    "DISPO_CONSUMER_RETRY_MAX_SECONDS": "0.1",
}
# Each consumer and the subject of the message it cannot process.
POISON = {
    "gateway": {"gateway-status": "task.status.x.failed"},
    "executor": {
        "executor": tasks.TASK_CREATE,
        "executor-cancel": tasks.TASK_CANCEL,
        "executor-close": tasks.TASK_CLOSE,
    },
    "reconciler": {
        "reconciler-fail": tasks.TASK_FAIL,
        "reconciler-demote": tasks.TASK_DEMOTE,
        "reconciler-claims": tasks.TASK_CREATE,
        "reconciler-status": "task.status.x.failed",
    },
    "intelligence": {"intelligence-evaluations": evaluations.EVALUATION_RUN_RECORDED},
}


def started(evaluation_id: str) -> bytes:
    return events_pb2.EvaluationStarted(
        evaluation_id=evaluation_id,
        series="pool",
        line=common_pb2.LINE_TRIAL,
        period="2026-01",
        configuration_json=json.dumps({"cases": 1}),
    ).SerializeToString()


def run_recorded(evaluation_id: str, run_id: str) -> bytes:
    return events_pb2.EvaluationRunRecorded(
        evaluation_id=evaluation_id,
        run_id=run_id,
        case_id="c1",
        verdict=common_pb2.VERDICT_PASS,
        score=1.0,
        latency_ms=5,
    ).SerializeToString()


async def start_intelligence(start_service):
    return await start_service(
        "intelligence",
        {
            **BOUNDED,
            "DISPO_INTELLIGENCE_UNKNOWN_EVALUATION_RETRY_SECONDS": "0.05",
            "DISPO_INTELLIGENCE_UNKNOWN_EVALUATION_MAX_DELIVERIES": "3",
        },
    )


async def start_consumers(start_service):
    gateway = await start_service("gateway", BOUNDED)
    executor = await start_service(
        "executor", {**BOUNDED, "DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0"}
    )
    reconciler = await start_service(
        "reconciler",
        {
            **BOUNDED,
            "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0",
            "DISPO_RECONCILER_DRIFT_INTERVAL_SECONDS": "3600",
            "DISPO_RECONCILER_GATEWAY_ADDRESS": gateway.address,
        },
    )
    intelligence = await start_intelligence(start_service)
    return {
        "gateway": gateway,
        "executor": executor,
        "reconciler": reconciler,
        "intelligence": intelligence,
    }


async def quarantined(address: str) -> pb.ListMessagesResponse:
    async with admin_channel(address) as channel:
        return await quarantine_pb2_grpc.QuarantineServiceStub(channel).ListMessages(
            pb.ListMessagesRequest()
        )


async def test_every_consumer_quarantines_its_poison_and_goes_on(start_service, bus):
    services = await start_consumers(start_service)
    # a NUL inside an id passes no envelope check and cannot be stored: the handlers raise
    nul = task_pb2.Task(task_id="nul\x00id")
    nul.nodes.add(node_id="a", spec=task_pb2.ActionSpec(kind="noop"))
    await bus.publish(tasks.TASK_CREATE, nul.SerializeToString(), msg_id="nul")
    for subject in (
        tasks.TASK_CREATE,
        tasks.TASK_CANCEL,
        tasks.TASK_CLOSE,
        tasks.TASK_FAIL,
        tasks.TASK_DEMOTE,
        "task.status.x.failed",
    ):
        await bus.publish(subject, GARBAGE, msg_id=f"garbage-{subject}")
    # a run of an evaluation that never registers: redelivered a bounded number of times
    await bus.publish(
        evaluations.EVALUATION_RUN_RECORDED,
        run_recorded("never", "never-0"),
        msg_id="never-0",
    )
    await bus.publish(evaluations.EVALUATION_STARTED, started("later"), msg_id="later:started")

    async with admin_channel(services["intelligence"].address) as channel:
        intelligence = intelligence_pb2_grpc.IntelligenceServiceStub(channel)

        async def registered() -> bool:
            try:
                await intelligence.GetEvaluation(
                    intelligence_pb2.GetEvaluationRequest(evaluation_id="later")
                )
            except grpc.aio.AioRpcError:
                return False
            return True

        await eventually(registered, timeout=30, wanted="the event behind the poison applied")

    for name, expected in POISON.items():
        count = len(expected) + (1 if name == "executor" else 0)  # the NUL task and garbage
        listed = await eventually(
            lambda name=name: quarantined(services[name].address),
            lambda r, expected=expected, count=count: (
                {m.consumer for m in r.messages} == set(expected) and r.total == count
            ),
            timeout=30,
            wanted=f"{name}'s quarantine holding {sorted(expected)}",
            describe=lambda r: str([(m.consumer, m.subject, m.error) for m in r.messages]),
        )
        assert len(listed.messages) == count
        for message in listed.messages:
            assert message.subject == expected[message.consumer]
            assert message.error and message.deliveries >= 1
    executor = (await quarantined(services["executor"].address)).messages
    raised = [m for m in executor if m.consumer == "executor" and "0x00" in m.error]
    assert [m.deliveries for m in raised] == [2]  # failed its bounded number of times
    never = (await quarantined(services["intelligence"].address)).messages[0]
    assert never.deliveries == 3 and "never" in never.error
    # the poison is terminated: nothing waits for an ack or a redelivery any more
    for stream, durable in (
        ("TASKS", "executor"),
        ("TASKS", "reconciler-claims"),
        ("EVALUATIONS", "intelligence-evaluations"),
    ):
        await eventually(
            lambda s=stream, d=durable: bus.js.consumer_info(s, d),
            lambda info: info.num_ack_pending == 0 and info.num_pending == 0,
            timeout=20,
            wanted=f"{durable} settled",
        )
    # The gateway's bus user may not publish task.status (the reconciler reads it too): its
    # quarantine refuses to replay the status event, and keeps it.
    [status] = (await quarantined(services["gateway"].address)).messages
    async with admin_channel(services["gateway"].address) as channel:
        stub = quarantine_pb2_grpc.QuarantineServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReplayMessage(pb.ReplayMessageRequest(id=status.id))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "task.status.x.failed" in (refused.value.details() or "")
        assert (await stub.ListMessages(pb.ListMessagesRequest())).total == 1


async def test_a_quarantined_evaluation_event_is_replayed_once_it_can_apply(start_service, bus):
    services = {"intelligence": await start_intelligence(start_service)}
    await bus.publish(
        evaluations.EVALUATION_RUN_RECORDED, run_recorded("early", "early-0"), msg_id="early-0"
    )
    listed = await eventually(
        lambda: quarantined(services["intelligence"].address),
        lambda r: r.total == 1,
        timeout=30,
        wanted="the early run quarantined",
    )
    await bus.publish(evaluations.EVALUATION_STARTED, started("early"), msg_id="early:started")

    async with admin_channel(services["intelligence"].address) as channel:
        stub = quarantine_pb2_grpc.QuarantineServiceStub(channel)
        intelligence = intelligence_pb2_grpc.IntelligenceServiceStub(channel)

        async def evaluation():
            try:
                return await intelligence.GetEvaluation(
                    intelligence_pb2.GetEvaluationRequest(evaluation_id="early")
                )
            except grpc.aio.AioRpcError:
                return None

        await eventually(evaluation, lambda e: e is not None, timeout=30, wanted="registered")
        await stub.ReplayMessage(pb.ReplayMessageRequest(id=listed.messages[0].id))
        applied = await eventually(
            evaluation, lambda e: e.run_count == 1, timeout=30, wanted="the replayed run applied"
        )
        assert applied.run_count == 1
        assert (await stub.ListMessages(pb.ListMessagesRequest())).total == 0
