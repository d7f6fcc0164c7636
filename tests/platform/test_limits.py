"""A downstream's limits hold across the cluster (ADR-0108): three executor processes call a
downstream that records how many calls it had at once and how many began in each second;
under a load that would take three times its limits, it never sees more than its
``max_concurrency`` at once nor more than its ``max_calls_per_second`` in a second. An
executor killed while it holds slots gives them back when its share's lease runs out (not
before: its calls may still be under way); with PostgreSQL paused, no executor can renew
its share, and none calls beyond it."""

import asyncio
import math
import os
import signal
import time
from collections import Counter
from pathlib import Path

from aiohttp import web
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.sdk import AsyncClient, cell
from support import eventually
from support.auth import admin_channel

CATALOGUE = """
downstreams:
  labels:
    base_url: {url}
    timeout_ms: 2000
    max_concurrency: {concurrency}
    max_calls_per_second: {rate}
cells:
  label:
    description: One call to the label service.
    fields: {{}}
    actions:
      set: {{kind: http, downstream: labels, path: "/label/{{task_id}}", idempotent: true}}
"""

LEASE = "1.5"


class Recorder:
    """The downstream's own view: calls at once (its high-water mark) and calls begun in
    each second."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.now = 0
        self.most = 0
        self.seconds: Counter[int] = Counter()
        self.calls = 0

    async def label(self, request: web.Request) -> web.Response:
        self.now += 1
        self.calls += 1
        self.most = max(self.most, self.now)
        self.seconds[math.floor(time.time())] += 1
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.now -= 1
        return web.json_response({})


async def limited_stack(start_service, fake_server, tmp_path: Path, recorder, *, concurrency, rate):
    downstream = await fake_server({("POST", "/label/{task}"): recorder.label})
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(CATALOGUE.format(url=downstream.url, concurrency=concurrency, rate=rate))
    env = {
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_LOG_LEVEL": "WARNING",
        "DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0",
        "DISPO_EXECUTOR_BREAKER_THRESHOLD": "100000",
        "DISPO_EXECUTOR_SHARE_LEASE_SECONDS": LEASE,
        # A few messages in hand each: the load spreads over the executors.
        "DISPO_EXECUTOR_BATCH": "4",
        "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": "0",
    }
    gateway = await start_service("gateway", env)
    return gateway, env


async def submit_all(client: AsyncClient, count: int, prefix: str) -> list[str]:
    ids = []
    for i in range(count):
        task = await client.submit("shop", [cell("label")], idempotency_key=f"{prefix}{i}")
        ids.append(task.task_id)
    return ids


async def all_succeeded(client: AsyncClient, ids: list[str], timeout: float = 120.0) -> None:
    async def done() -> int:
        return sum([(await client.get(t)).status == "SUCCEEDED" for t in ids])

    await eventually(
        done, lambda n: n == len(ids), timeout=timeout, interval=0.5, wanted="all SUCCEEDED"
    )


async def downstreams(address: str) -> dict[str, executor_pb2.Downstream]:
    async with admin_channel(address) as channel:
        reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListDownstreams(
            executor_pb2.ListDownstreamsRequest()
        )
    return {d.name: d for d in reply.downstreams}


async def test_three_executors_never_exceed_a_downstreams_limits_together(
    start_service, fake_server, tmp_path, tokens
):
    # Each executor alone would hold 3 calls at once and start 10 a second: three times the
    # limits for three executors.
    recorder = Recorder(hold=0.1)
    gateway, env = await limited_stack(
        start_service, fake_server, tmp_path, recorder, concurrency=3, rate=10
    )
    executors = [await start_service("executor", env) for _ in range(3)]
    async with AsyncClient(gateway.address, token=tokens.admin) as client:
        ids = await submit_all(client, 90, "t")
        await all_succeeded(client, ids)
    assert recorder.calls >= 90
    assert recorder.most <= 3, f"{recorder.most} calls at once"
    busiest = max(recorder.seconds.values())
    assert busiest <= 10, f"{busiest} calls in one second: {sorted(recorder.seconds.items())}"
    # The limit was used, not starved: more than one call at once, several seconds at it.
    assert recorder.most >= 2
    views = [(await downstreams(e.address))["labels"] for e in executors]
    assert all(v.max_concurrency == 3 and v.max_calls_per_second == 10 for v in views)
    assert sum(v.slots_share for v in views) <= 3 and sum(v.per_second_share for v in views) <= 10
    assert all(v.cluster_slots <= 3 and v.cluster_per_second <= 10 for v in views)


async def test_a_killed_executors_slots_come_back_when_its_share_runs_out(
    start_service, fake_server, tmp_path, tokens
):
    recorder = Recorder(hold=1.0)
    gateway, env = await limited_stack(
        start_service, fake_server, tmp_path, recorder, concurrency=2, rate=0
    )
    first = await start_service("executor", env)
    async with AsyncClient(gateway.address, token=tokens.admin) as client:
        ids = await submit_all(client, 2, "a")
        await eventually(lambda: recorder.now == 2, wanted="two calls under way")
        first.kill()  # SIGKILL while holding both slots, its calls still under way
        second = await start_service("executor", env)
        ids += await submit_all(client, 4, "b")
        # Its share comes back, whole, to the one executor left, within the lease.
        await eventually(
            lambda: downstreams(second.address),
            lambda d: d["labels"].slots_share == 2,
            timeout=30,
            wanted="the whole limit held by the executor left",
        )
        await all_succeeded(client, ids)
    assert recorder.most <= 2, f"{recorder.most} calls at once"


def postgres_processes(data_dir: Path) -> list[int]:
    """The postmaster of ``data_dir`` and its children."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                children.append(int(entry.name))
    return [postmaster, *children]


async def test_with_postgresql_paused_no_executor_calls_beyond_its_share(
    start_service, fake_server, tmp_path, tokens, infra
):
    recorder = Recorder(hold=0.05)
    gateway, env = await limited_stack(
        start_service, fake_server, tmp_path, recorder, concurrency=2, rate=0
    )
    executors = [await start_service("executor", env) for _ in range(3)]
    async with AsyncClient(gateway.address, token=tokens.admin) as client:
        ids = await submit_all(client, 30, "p")
        await eventually(lambda: recorder.calls >= 3, wanted="calls under way")
        paused = postgres_processes(infra.postgres.data_dir)
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            # Past every share's lease (1.5 s and the 2 s timeout): no share is proven, no
            # call leaves, whatever the executors had in hand.
            await asyncio.sleep(4.0)
            before = recorder.calls
            await asyncio.sleep(2.0)
            assert recorder.calls == before, "calls left without a share"
            assert recorder.most <= 2
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        await all_succeeded(client, ids)
    assert recorder.most <= 2
    assert len(executors) == 3
