"""A worker queue's health (ADR-0101) with real processes: gateway, an executor and the
reconciler on one file clock the test moves, the Python SDK's worker run by ``dispo worker
run`` (tests/executor/worker_app.py, one line per effect, nothing deduplicated). With no
worker connected a worker node waits offered; once it has waited the configured time on
its clock its node is demoted and parked with the reconciler, which releases it when the
queue has a live worker again; the node then runs once."""

from __future__ import annotations

from pathlib import Path

import pytest
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.sdk import cell
from executor.test_workers import QUEUES, WORKER_CELLS, Workers
from pipeline_fixtures import TEST_CATALOGUE, Downstream, Pipeline, dump, wait_status
from support import eventually
from support.auth import admin_channel, worker_token

pytestmark = pytest.mark.long_file

IDLE_SECONDS = 20


@pytest.fixture
def catalogue_file(tmp_path: Path, downstream: Downstream) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text((TEST_CATALOGUE + WORKER_CELLS).format(url=downstream.url))
    return path


async def queues_of(executor) -> dict[str, executor_pb2.Queue]:
    async with admin_channel(executor.address) as channel:
        reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListQueues(
            executor_pb2.ListQueuesRequest()
        )
    return {q.name: q for q in reply.queues}


async def test_no_live_worker_demotes_after_the_idle_time_then_released_and_run_once(
    start_service, catalogue_file, egress_allow, executor_port, start_reconciler, tmp_path
):
    reconciler = await start_reconciler()  # sets the shared clock to now
    pipeline = Pipeline(start_service, catalogue_file, egress_allow, executor_port=executor_port)
    await pipeline.start_gateway()
    executor = await pipeline.start_executor(
        **reconciler.clock.env, DISPO_EXECUTOR_QUEUE_IDLE_SECONDS=str(IDLE_SECONDS)
    )
    workers = Workers(pipeline, tmp_path, await worker_token(pipeline.gateway.address, *QUEUES))
    try:
        async with pipeline.client() as client:
            task = await client.submit("tests", [cell("w_ticket", name="later")])
            await eventually(
                lambda: queues_of(executor),
                lambda q: "tickets" in q and q["tickets"].offered == 1,
                wanted="the run offered",
            )
            assert not (await queues_of(executor))["tickets"].live

            # Not yet the idle time: still offered, nothing parked.
            reconciler.clock.advance(seconds=IDLE_SECONDS - 5)
            await eventually(lambda: queues_of(executor), lambda q: q["tickets"].offered == 1)
            assert (await reconciler.held(task.task_id)) is None

            reconciler.clock.advance(seconds=6)  # past it: withdrawn, demoted, parked
            view = await wait_status(client, task.task_id, {"DEMOTED"})
            node = view.node("w_ticket.open")
            assert node.status == "DEMOTED", dump(view)
            assert "queue tickets had no live worker" in node.last_error, node.last_error
            held = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_DEMOTED)
            assert list(held.downstreams) == ["queue:tickets"]
            assert "tickets" not in await queues_of(executor)  # no run, no worker seen

            # Still no worker: probed unhealthy, nothing released.
            await reconciler.sweep(0.5, "health")
            assert (await reconciler.sweep(0.5, "release"))["release"] == 0
            assert (await reconciler.held(task.task_id)).state == pb.RECOVERY_STATE_DEMOTED
            assert workers.effects() == []

            workers.start(executor=0)
            await eventually(
                lambda: queues_of(executor),
                lambda q: "tickets" in q and q["tickets"].live_workers == 1 and q["tickets"].live,
                wanted="the queue live",
            )
            await reconciler.sweep(0.5, "health")
            # Released by this sweep, or by the one the health pass kicked just before it.
            await reconciler.sweep(0.5, "release")
            done = await client.wait(task.task_id, timeout=60)
        assert done.status == "SUCCEEDED", dump(done)
        detail = await reconciler.stub.GetRecoveryTask(
            pb.GetRecoveryTaskRequest(task_id=task.task_id)
        )
        releases = [r for r in detail.redrives if r.trigger == pb.REDRIVE_TRIGGER_RELEASE]
        assert len(releases) == 1, detail
        assert [key for _, key, _, _ in workers.effects()] == [f"{task.task_id}/w_ticket.open"]
    finally:
        workers.kill_all()
