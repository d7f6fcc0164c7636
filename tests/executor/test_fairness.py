"""Fair share, priority and pausing a business, end to end (ADR-0109): a gateway and an
executor running few passes at once, a real downstream.

- business A floods, then B submits a few: B's tasks finish while A's backlog still drains;
- a business's higher-priority tasks start first;
- a paused business's tasks wait, ACCEPTED, and run on resume.
"""

from __future__ import annotations

import time

import grpc
import pytest
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.sdk import TaskRequest, cell
from pipeline_fixtures import Pipeline
from support import eventually
from support.auth import admin_channel

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# Few passes, and a small hold: a backlog of a few thousand is a flood to this executor.
FAIR_ENV = {
    "DISPO_EXECUTOR_PASSES": "4",
    "DISPO_EXECUTOR_BUSINESS_HOLD": "128",  # a paused business holds an eighth: 16
    "DISPO_EXECUTOR_BATCH": "256",
}


@pytest.fixture
async def fair(start_service, catalogue_file, egress_allow, executor_port) -> Pipeline:
    p = Pipeline(start_service, catalogue_file, egress_allow, executor_port=executor_port)
    await p.start_gateway(DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND="0")  # floods are the point
    await p.start_executor(**FAIR_ENV)
    return p


async def submit(client, business: str, count: int, priority: int = 0) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 100):
        batch = [
            TaskRequest(business, [cell("step", name=f"{business}-{i}")], priority=priority)
            for i in range(start, min(count, start + 100))
        ]
        ids += [s.task_id for s in await client.submit_many(batch)]
    return ids


async def finished(client, business: str) -> int:
    counts = await client.count(business=business)
    return sum(counts[s] for s in TERMINAL)


async def test_a_trickling_business_finishes_while_a_flooding_one_still_drains(fair):
    flood, trickle = 1500, 30
    async with fair.client() as client:
        await submit(client, "bulk", flood)
        # B arrives behind A's whole backlog.
        backlog = flood - await finished(client, "bulk")
        started = time.monotonic()
        await submit(client, "takedown", trickle)
        await eventually(
            lambda: finished(client, "takedown"),
            lambda done: done == trickle,
            timeout=300,
            wanted="every takedown task finished",
        )
        left = flood - await finished(client, "bulk")
        latencies = sorted(
            [
                (t.updated_at - t.created_at).total_seconds()
                async for t in client.list(business="takedown")
            ]
        )
        await eventually(
            lambda: finished(client, "bulk"),
            lambda done: done == flood,
            timeout=600,
            wanted="every bulk task finished",
        )
        drained = time.monotonic() - started
    assert backlog > flood / 2, "the flood should still be queued when B submits"
    # B overtook A's backlog: most of it was still there when B's last task finished ...
    assert left > backlog / 2, (left, backlog)
    # ... and B's p99 is under the time A took for a quarter of its backlog (A's own rate).
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    bulk_rate = backlog / drained
    assert p99 * bulk_rate < backlog / 4, (p99, bulk_rate, backlog)


async def test_a_paused_business_waits_accepted_and_runs_in_priority_order_on_resume(fair):
    async with admin_channel(fair.executor_address) as channel:
        executor = executor_pb2_grpc.ExecutorServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await executor.PauseBusiness(executor_pb2.PauseBusinessRequest(business="a.b"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        paused = await executor.PauseBusiness(
            executor_pb2.PauseBusinessRequest(business="review", actor="ops", reason="incident")
        )
        assert paused.business.paused and paused.business.paused_reason == "incident"
        async with fair.client() as client:
            low = await submit(client, "review", 12, priority=5)
            high = await submit(client, "review", 4, priority=1)
            other = await submit(client, "other", 3)
            await eventually(
                lambda: finished(client, "other"), lambda n: n == 3, wanted="other's tasks done"
            )
            listed = await eventually(
                lambda: executor.ListBusinesses(executor_pb2.ListBusinessesRequest()),
                lambda r: any(
                    b.business == "review" and b.waiting_here == 16 for b in r.businesses
                ),
                wanted="the paused business's 16 tasks waiting in the executor",
            )
            assert [b.paused for b in listed.businesses if b.business == "review"] == [True]
            # Accepted, not run: the paused depth.
            assert (await client.count(business="review"))["ACCEPTED"] == 16
            resumed = await executor.ResumeBusiness(
                executor_pb2.ResumeBusinessRequest(business="review")
            )
            assert not resumed.business.paused
            await eventually(
                lambda: finished(client, "review"), lambda n: n == 16, wanted="review's tasks done"
            )
            # When each task's call started (its node claimed by its pass): the order the
            # intake started the passes in, whatever each call then took on this machine.
            started = {t: (await client.get(t)).nodes[0].started_at for t in [*low, *high]}
    assert len(other) == 3
    # Priority 1 first: every one of them started before all but the first few priority 5.
    passes = int(FAIR_ENV["DISPO_EXECUTOR_PASSES"])
    lows = sorted(started[t] for t in low)
    highs = sorted(started[t] for t in high)
    assert max(highs) <= lows[passes], (highs, lows)
