"""Recovery with the real pipeline: gateway, executor and reconciler processes, the demo
downstream as a real process. The reconciler's clock is a file the test moves, so no
test sleeps through a backoff; the executor keeps its fast test timings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from pipeline_fixtures import catalogue_file, downstream, dump, pipeline, stream_messages, wait_status  # noqa: F401

from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.sdk import cell

from .conftest import CONFIG


@dataclass
class Reconciler:
    process: Any
    clock: Any
    channel: grpc.aio.Channel
    stub: reconciler_pb2_grpc.ReconcilerServiceStub

    async def tick(self, seconds: float = 0.5, settle: float = 0.2) -> None:
        """Move the reconciler's clock; its sweep loop runs a round per 0.5 s of it."""
        self.clock.advance(seconds=seconds)
        await asyncio.sleep(settle)

    async def held(self, task_id: str) -> pb.RecoveryTask | None:
        try:
            return (await self.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))).task
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def wait_state(self, task_id: str, state: int, timeout: float = 30.0) -> pb.RecoveryTask:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            task = await self.held(task_id)
            if task is not None and task.state == state:
                return task
            if loop.time() > deadline:
                raise TimeoutError(f"{task_id}: {task}")
            await asyncio.sleep(0.05)


@pytest.fixture
async def reconciler(start_service, file_clock, catalogue_file, tmp_path: Path):  # noqa: F811
    config = {**CONFIG,
              "redrive": {"default": {"max_redrives": 3, "base_delay": 10, "max_delay": 10, "jitter": 0},
                          "rules": [{"business": "flaky", "max_redrives": 1}]},
              "reconciliation": {"delay": 5, "sample_percent": 100},
              "arbitration": {"window_seconds": 60, "priority": [{"business": "trust_safety"}],
                              "conflicts": {"pair": {"key": "name", "effect": "paired"}}}}
    path = tmp_path / "recovery.yaml"
    path.write_text(yaml.safe_dump(config))
    file_clock.set(datetime.now(UTC))
    process = await start_service("reconciler", {
        **file_clock.env, "DISPO_RECONCILER_CONFIG": str(path), "DISPO_RECONCILER_CATALOGUE": str(catalogue_file),
        "DISPO_RECONCILER_SWEEP_INTERVAL": "0.5", "DISPO_RECONCILER_CALLBACK_SECRET": "e2e-secret"})
    async with grpc.aio.insecure_channel(process.address) as channel:
        yield Reconciler(process, file_clock, channel, reconciler_pb2_grpc.ReconcilerServiceStub(channel))


async def test_retry_exhaustion_redriven_after_backoff_succeeds_without_rerunning_succeeded_nodes(
        pipeline, downstream, reconciler):  # noqa: F811
    await downstream.control(fail={"status": 500, "times": 4, "path": "/step/x"})
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("step", ref="ok", name="ok"),
                                             cell("step", ref="x", name="x").after("ok"),
                                             cell("step", ref="after", name="after").after("x"),
                                             cell("noop")])
        await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
        held = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        assert held.error_class == "http_5xx" and list(held.downstreams) == ["demo"]
        calls_before = await downstream.calls()
        assert calls_before[f"{task.task_id}/ok.call"] == 1 and calls_before[f"{task.task_id}/x.call"] == 4

        await reconciler.tick(9)  # backoff is 10 s: not yet
        assert (await reconciler.held(task.task_id)).state == pb.RECOVERY_STATE_PARKED_FAILED
        await reconciler.tick(1.5)
        done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED", dump(done)
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/ok.call"] == 1  # succeeded before the failure: not called again
    assert calls[f"{task.task_id}/x.call"] == 5
    assert calls[f"{task.task_id}/after.call"] == 1
    resolved = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_RESOLVED)
    assert resolved.redrives == 1


async def test_spent_policy_shows_the_task_failed_with_the_reason_through_the_gateway(
        pipeline, downstream, reconciler):  # noqa: F811
    await downstream.control(fail={"status": 503, "times": 1000, "path": "/step/x"})
    async with pipeline.client() as client:
        task = await client.submit("flaky", [cell("step", ref="x", name="x"), cell("noop")])
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        await reconciler.tick(11)
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_FAILED)
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "FAILED", dump(view)
    assert "redrive policy spent: 1 of 1 redrives used" in view.status_reason
    assert "HTTP 503" in view.status_reason
    assert (await downstream.calls())[f"{task.task_id}/x.call"] == 8  # two rounds of 1 + 3 short retries


async def test_finished_task_notifies_its_callback_once(pipeline, downstream, reconciler, tmp_path):  # noqa: F811
    from .fakes import CallbackReceiver
    receiver = CallbackReceiver()
    await receiver.start()
    try:
        async with pipeline.client() as client:
            task = await client.submit("tests", [cell("step", name="cb")], callback_url=receiver.url)
            await client.wait(task.task_id, timeout=30)
        for _ in range(60):
            await reconciler.tick()
            if receiver.received:
                break
        await reconciler.tick(30)
        completion = (await reconciler.stub.GetCompletion(pb.GetCompletionRequest(task_id=task.task_id))).completion
    finally:
        await receiver.stop()
    assert len(receiver.received) == 1
    assert completion.notify_state == "DELIVERED" and completion.reconcile_state == "MATCHED"
