"""A downstream's limits hold across the cluster (ADR-0108): three executor processes call a
downstream that records how many calls it had at once and how many began in each second;
under a load that would take three times its limits, it never sees more than its
``max_concurrency`` at once nor more than its ``max_calls_per_second`` in a second. An
executor killed while it holds slots gives them back when its share's lease runs out (not
before: its calls may still be under way); with PostgreSQL paused, no executor can renew
its share, and none calls beyond it. A downstream limited per business holds each business
to its part, whatever the number of executors, while the others' calls get through."""

import asyncio
import math
import os
import signal
import time
from collections import Counter
from pathlib import Path

from aiohttp import web
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.sdk import AsyncClient, TaskRequest, cell
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


PER_BUSINESS = """
downstreams:
  labels:
    base_url: {url}
    timeout_ms: 5000
    max_concurrency: 4
    per_business: {{max_concurrency: 2}}
cells:
  label:
    description: One call to the label service, naming the business it is for.
    fields: {{who: {{type: string, required: true}}}}
    actions:
      set: {{kind: http, downstream: labels, path: "/label/{{payload.who}}", idempotent: true}}
"""


class ByBusiness:
    """The downstream's view per business (named in the path): the most calls it had at
    once of each, every call counted (no deduplication), and its calls in all."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.all_now = 0
        self.all_most = 0

    async def label(self, request: web.Request) -> web.Response:
        who = request.match_info["who"]
        self.now[who] += 1
        self.calls[who] += 1
        self.all_now += 1
        self.most[who] = max(self.most[who], self.now[who])
        self.all_most = max(self.all_most, self.all_now)
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.now[who] -= 1
            self.all_now -= 1
        return web.json_response({})


async def submit_for(client: AsyncClient, business: str, count: int) -> list[str]:
    requests = [
        TaskRequest(business, [cell("label", who=business)], idempotency_key=f"{business}{i}")
        for i in range(count)
    ]
    return [t.task_id for t in await client.submit_many(requests)]


async def test_a_business_flooding_a_downstream_holds_no_more_than_its_part_of_it(
    start_service, fake_server, tmp_path, tokens
):
    # Two executors, each of which alone would hold the downstream's 4 calls at once: the
    # flooding business gets 2 of them across the cluster, the other business the rest.
    recorder = ByBusiness(hold=0.3)
    downstream = await fake_server({("POST", "/label/{who}"): recorder.label})
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(PER_BUSINESS.format(url=downstream.url))
    env = {
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_LOG_LEVEL": "WARNING",
        "DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0",
        "DISPO_EXECUTOR_BREAKER_THRESHOLD": "100000",
        "DISPO_EXECUTOR_SHARE_LEASE_SECONDS": LEASE,
        # Room in hand for the trickle's messages behind the flood's, on either executor
        # (the flood's passes wait for its slots with their messages in hand).
        "DISPO_EXECUTOR_BATCH": "40",
        "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": "0",
    }
    gateway = await start_service("gateway", env)
    executors = [await start_service("executor", env) for _ in range(2)]
    async with AsyncClient(gateway.address, token=tokens.admin) as client:
        flood = await submit_for(client, "flood", 60)
        await eventually(lambda: recorder.calls["flood"] >= 4, wanted="the flood under way")
        trickle = await submit_for(client, "trickle", 6)
        await all_succeeded(client, trickle)
        assert recorder.most["flood"] <= 2, f"{recorder.most['flood']} flood calls at once"
        # The trickle got through while the flood still had calls to make (60 at 2 at once
        # take at least 9 s of the downstream's time).
        assert recorder.calls["flood"] < 60, "the trickle waited for the flood"
        await all_succeeded(client, flood, timeout=180)
    assert recorder.calls["flood"] >= 60 and recorder.calls["trickle"] >= 6
    assert recorder.most["flood"] <= 2, f"{recorder.most['flood']} flood calls at once"
    assert recorder.most["flood"] == 2  # its part was used, not starved
    assert recorder.all_most <= 4, f"{recorder.all_most} calls at once"
    views = [(await downstreams(e.address))["labels"] for e in executors]
    assert all(v.per_business_max_concurrency == 2 for v in views)
