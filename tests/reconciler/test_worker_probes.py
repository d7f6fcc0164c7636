"""Probes served by workers (ADR-0100), through real processes: gateway, executor,
reconciler, and the Python SDK's worker (tests/executor/worker_app.py) run by ``dispo worker
run``, which records every effect and deduplicates nothing. A non-idempotent worker node
whose worker is SIGKILLed mid-run is UNKNOWN; a second worker's probe handler settles it.
The reconciler's clock is a file the test moves."""

from __future__ import annotations

from pathlib import Path

import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.sdk import cell
from executor.test_workers import QUEUES, RUN_LEASE, WORKER_CELLS, Workers
from pipeline_fixtures import TEST_CATALOGUE, Downstream, Pipeline, dump, wait_until
from support import eventually
from support.auth import worker_token

KEY = "{task_id}/w_slow_once.run"


@pytest.fixture
def catalogue_file(tmp_path: Path, downstream: Downstream) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text((TEST_CATALOGUE + WORKER_CELLS).format(url=downstream.url))
    return path


@pytest.fixture
async def pipeline(start_service, catalogue_file, egress_allow, executor_port):
    p = Pipeline(start_service, catalogue_file, egress_allow, executor_port=executor_port)
    await p.start_gateway()
    await p.start_executor(DISPO_EXECUTOR_RUN_LEASE_SECONDS=RUN_LEASE)
    yield p


@pytest.fixture
async def reconciler(start_reconciler):
    # A probe no worker answers costs the settle sweep this long.
    return await start_reconciler(DISPO_RECONCILER_HTTP_TIMEOUT_SECONDS="2")


@pytest.fixture
async def workers(pipeline, tmp_path):
    found = Workers(pipeline, tmp_path, await worker_token(pipeline.gateway.address, *QUEUES))
    yield found
    found.kill_all()


@pytest.fixture
async def client(pipeline):
    async with pipeline.client() as c:
        yield c


async def unknown_then_parked(client, reconciler, task_id: str) -> None:
    """The node UNKNOWN (its worker's lease ran out), its task awaiting settlement."""
    await wait_until(
        client,
        task_id,
        lambda v: v.node("w_slow_once.run").status == "UNKNOWN",
        timeout=60,
        wanted="the node UNKNOWN",
    )
    await reconciler.wait_state(task_id, pb.RECOVERY_STATE_AWAITING_SETTLEMENT, timeout=60)


async def settled(client, reconciler, task_id: str):
    """Sweep (past the redrive's backoff) until the task ended; its view."""
    for _ in range(20):
        await reconciler.sweep(seconds=11)
        view = await client.get(task_id)
        if view.status in ("SUCCEEDED", "FAILED"):
            return view
    return view


async def settlements(reconciler, task_id: str) -> list[tuple[str, int, int]]:
    detail = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))
    return [(s.node_id, s.method, s.outcome) for s in detail.settlements]


async def test_a_worker_killed_after_its_effect_is_settled_done_by_a_probe(
    client, reconciler, workers
):
    first = workers.start(WORKER_HOLD="60")
    task = await client.submit("tests", [cell("w_slow_once", name="done")])
    [(_, key, _, pid)] = await workers.wait_effects(1)
    assert (key, pid) == (KEY.format(task_id=task.task_id), first.pid)
    first.kill()  # SIGKILL, after its effect, before its completion
    await unknown_then_parked(client, reconciler, task.task_id)
    workers.start()  # answers the queue's probes

    view = await settled(client, reconciler, task.task_id)
    assert view.status == "SUCCEEDED", dump(view)
    node = view.node("w_slow_once.run")
    assert node.output == {"done_by": first.pid}  # the probe's output, recorded
    assert workers.effects() == [("slow_once", key, 1, first.pid)]  # one effect, never re-sent
    assert await settlements(reconciler, task.task_id) == [
        ("w_slow_once.run", pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_SUCCEEDED)
    ]


async def test_a_worker_killed_before_its_effect_is_run_again_once_after_a_fenced_probe(
    client, reconciler, workers, tmp_path
):
    starts = tmp_path / "starts.txt"
    first = workers.start(WORKER_HOLD_BEFORE="60", WORKER_STARTS=str(starts))
    task = await client.submit("tests", [cell("w_slow_once", name="fenced")])
    await eventually(
        lambda: starts.read_text() if starts.exists() else "",
        lambda text: str(first.pid) in text,
        timeout=30,
        wanted="the run started",
    )
    first.kill()  # SIGKILL before its effect
    await unknown_then_parked(client, reconciler, task.task_id)

    # No worker serves the queue's probes yet: no answer, asked again later. (The sweep
    # loop may run the settle sweep the clock's move made due alongside RunSweep's.)
    await reconciler.sweep(seconds=2)
    held = await eventually(
        lambda: reconciler.held(task.task_id),
        lambda held: "no worker of queue 'slow_once' answered the probe" in held.reason,
        timeout=30,
        wanted="the probe unanswered",
    )
    assert held.state == pb.RECOVERY_STATE_AWAITING_SETTLEMENT

    second = workers.start()
    view = await settled(client, reconciler, task.task_id)
    assert view.status == "SUCCEEDED", dump(view)
    key = KEY.format(task_id=task.task_id)
    # Not done, fenced: PENDING at once, then run again once, under the same key.
    assert workers.effects() == [("slow_once", key, 2, second.pid)]
    assert view.node("w_slow_once.run").output == {"done": "fenced"}
    assert await settlements(reconciler, task.task_id) == [
        ("w_slow_once.run", pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_PENDING)
    ]
