"""The real intelligence service process: gRPC and reflection, crash recovery, shutdown order."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
from dispo.intelligence.app import SHUTDOWN_ORDER
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as pb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from support import eventually
from support.auth import admin_channel, session_tokens

from .conftest import CONFIG

GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def llm_env(fake_llm, **extra: str) -> dict[str, str]:
    return {
        "DISPO_INTELLIGENCE_MODELS": json.dumps([fake_llm.config().model_dump()]),
        "DISPO_INTELLIGENCE_DEFAULT_ANALYSIS_MODEL": "fake-gpt",
        **extra,
    }


async def feed(stub, evaluation_id: str, line=common_pb2.LINE_TRIAL) -> None:
    await stub.CreateEvaluation(
        pb.CreateEvaluationRequest(
            evaluation_id=evaluation_id,
            series="proc",
            line=line,
            period="2026-01",
            configuration_json=json.dumps(CONFIG),
        )
    )
    await stub.RecordRunResults(
        pb.RecordRunResultsRequest(
            evaluation_id=evaluation_id,
            runs=[
                pb.RunResult(
                    run_id=f"{evaluation_id}-1",
                    case_id="c1",
                    verdict=common_pb2.VERDICT_PASS,
                    score=1,
                    latency_ms=10,
                ),
                pb.RunResult(
                    run_id=f"{evaluation_id}-2",
                    case_id="c2",
                    verdict=common_pb2.VERDICT_FAIL,
                    score=0,
                    latency_ms=30,
                    failure_reason="nope",
                ),
            ],
        )
    )
    await stub.CompleteEvaluation(
        pb.CompleteEvaluationRequest(
            evaluation_id=evaluation_id, status=pb.EVALUATION_STATUS_COMPLETED
        )
    )


async def job_status(stub, evaluation_id: str) -> int:
    try:
        return (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id=evaluation_id))).job.status
    except grpc.aio.AioRpcError:
        return pb.JOB_STATUS_UNSPECIFIED


async def wait_status(stub, evaluation_id: str, status: int, timeout: float = 30.0) -> None:
    await eventually(
        lambda: job_status(stub, evaluation_id),
        lambda current: current == status,
        timeout=timeout,
        wanted=f"job of {evaluation_id} {pb.JobStatus.Name(status)}",
        describe=pb.JobStatus.Name,
    )


def log_events(path: Path, *events: str) -> list[dict]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") in events:
            found.append(record)
    return found


async def test_real_process_serves_the_feed_and_jobs_over_grpc_and_reflection(
    start_service, fake_llm
):
    service = await start_service("intelligence", env=llm_env(fake_llm))
    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await feed(stub, "proc-1", line=common_pb2.LINE_FORMAL)  # formal: analysis starts by itself
        await wait_status(stub, "proc-1", pb.JOB_STATUS_COMPLETED)
        analysis = await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="proc-1"))

    assert analysis.narrative == fake_llm.reply and analysis.stats.pass_rate == 0.5
    described = subprocess.run(
        [
            GRPCURL,
            "-plaintext",
            service.address,
            "describe",
            "dispo.intelligence.v1.IntelligenceService",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rpc TriggerAnalysis" in described.stdout
    listed = subprocess.run(
        [
            GRPCURL,
            "-plaintext",
            "-H",
            f"authorization: Bearer {session_tokens().admin}",
            "-d",
            '{"evaluation_id": "proc-1"}',
            service.address,
            "dispo.intelligence.v1.IntelligenceService/ListJobs",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(listed.stdout)["jobs"][0]["status"] == "JOB_STATUS_COMPLETED"


async def test_killed_mid_generation_the_job_is_recovered_after_restart(
    start_service, fake_llm, file_clock
):
    fake_llm.gate = asyncio.Event()
    service = await start_service("intelligence", env={**llm_env(fake_llm), **file_clock.env})
    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await feed(stub, "crash-1")
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="crash-1"))
        await wait_status(stub, "crash-1", pb.JOB_STATUS_GENERATING)
        await eventually(lambda: fake_llm.requests, wanted="a request to the model")

    service.kill()
    fake_llm.gate.set()
    file_clock.advance(minutes=16)  # the dead worker's claim is now stale
    service.spawn()
    await service.wait_ready()

    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await wait_status(stub, "crash-1", pb.JOB_STATUS_COMPLETED)
        job = (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="crash-1"))).job
    assert job.recovery_attempts == 1 and job.attempts == 2


async def test_shutdown_stops_parts_upstream_first_and_hands_running_jobs_back(
    start_service, fake_llm
):
    fake_llm.gate = asyncio.Event()
    env = llm_env(fake_llm, DISPO_INTELLIGENCE_JOBS_SHUTDOWN_GRACE_SECONDS="0.2")
    service = await start_service("intelligence", env=env)
    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await feed(stub, "stop-1")
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="stop-1"))
        await wait_status(stub, "stop-1", pb.JOB_STATUS_GENERATING)

    assert await service.stop() == 0

    stopped = [
        record.get("part") or record.get("resource")
        for record in log_events(service.log_path, "part stopped", "resource closed")
    ]
    assert stopped == list(SHUTDOWN_ORDER)
    assert SHUTDOWN_ORDER == ("sweeps", "evaluation feed", "intelligence jobs", "analysis models")
    assert log_events(service.log_path, "job interrupted; re-queued")

    fake_llm.gate.set()
    await service.restart()
    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await wait_status(stub, "stop-1", pb.JOB_STATUS_COMPLETED)
        job = (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="stop-1"))).job
    assert job.recovery_attempts == 1


async def test_a_job_that_never_settles_across_restarts_fails_after_three_recoveries(
    start_service, fake_llm, file_clock
):
    fake_llm.gate = asyncio.Event()  # the model never answers: every attempt dies mid-generation
    service = await start_service("intelligence", env={**llm_env(fake_llm), **file_clock.env})
    async with admin_channel(service.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await feed(stub, "doomed")
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="doomed"))
        await wait_status(stub, "doomed", pb.JOB_STATUS_GENERATING)

    for recovery in range(1, 5):
        service.kill()
        file_clock.advance(minutes=16)
        service.spawn()
        await service.wait_ready()
        async with admin_channel(service.address) as channel:
            stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
            if recovery <= 3:
                await wait_status(stub, "doomed", pb.JOB_STATUS_GENERATING)
                job = (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="doomed"))).job
                assert job.recovery_attempts == recovery
            else:
                await wait_status(stub, "doomed", pb.JOB_STATUS_FAILED)
                job = (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="doomed"))).job

    assert (
        job.error
        == "gave up after 3 restart recoveries: the job was re-queued 3 times without settling"
    )
    assert job.attempts == 4


async def test_two_replicas_a_killed_owners_generation_is_taken_over_by_the_other(
    start_service, fake_llm, file_clock
):
    fake_llm.gate = asyncio.Event()
    env = {**llm_env(fake_llm), **file_clock.env}
    owner = await start_service("intelligence", env=env)
    other = await start_service("intelligence", env=env)
    async with admin_channel(owner.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        await feed(stub, "orphan")
        await stub.TriggerAnalysis(pb.TriggerJobRequest(evaluation_id="orphan"))
        await wait_status(stub, "orphan", pb.JOB_STATUS_GENERATING)
        await eventually(lambda: fake_llm.requests, wanted="the owner's request to the model")

    owner.kill()  # its heartbeat stops with it
    fake_llm.gate.set()
    async with admin_channel(other.address) as channel:
        stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        # Sixteen minutes without a heartbeat: the other replica's next sweep takes it over
        # (the boundary itself: test_replicas.py, on a manual clock).
        file_clock.advance(minutes=16)
        await wait_status(stub, "orphan", pb.JOB_STATUS_COMPLETED)
        job = (await stub.GetAnalysis(pb.GetJobRequest(evaluation_id="orphan"))).job

    assert job.recovery_attempts == 1 and job.attempts == 2
    assert len(fake_llm.requests) == 2  # the owner's, then the other replica's
    assert log_events(other.log_path, "job recovered")
