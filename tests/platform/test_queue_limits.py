"""A worker queue's ``max_calls_per_second`` holds across the cluster (ADR-0108, "Worker
queues"): three executor processes and a Python worker on each, with room for ten runs
apiece, against a queue limited to four runs a second. The runs are all offered before
the workers start, so each executor alone could hand out thirty at once; the workers see
at most four begin in any one second, and every task completes. A newer catalogue version
changes the limit on the running executors."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.sdk import AsyncClient, RunContext, Worker, cell
from support import eventually
from support.auth import admin_channel, worker_token

RATE = 4
TASKS = 36
TIMEOUT_MS = 60_000

CATALOGUE = """
cells:
  paced:
    description: One run on a queue with a limit a second.
    fields:
      n: {{type: integer}}
    actions:
      run: {{kind: worker, queue: paced, idempotent: true, timeout_ms: {timeout_ms}}}
queues:
  paced:
    max_calls_per_second: {rate}
"""


async def paced_queue(address: str) -> executor_pb2.Queue:
    async with admin_channel(address) as channel:
        reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListQueues(
            executor_pb2.ListQueuesRequest()
        )
    return {q.name: q for q in reply.queues}["paced"]


def dispo_queues(executor: str, token: str) -> list[dict]:
    host, port = executor.rsplit(":", 1)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dispo"), "--token", token, "queues", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DISPO_EXECUTOR_HOST": host, "DISPO_EXECUTOR_PORT": port},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["queues"]


async def test_three_executors_hand_out_at_most_a_queues_runs_a_second_together(
    start_service, tmp_path, tokens
):
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(CATALOGUE.format(rate=RATE, timeout_ms=TIMEOUT_MS))
    env = {
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_LOG_LEVEL": "WARNING",
        "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": "0",
        # The runs wait offered for the workers, not withdrawn.
        "DISPO_EXECUTOR_QUEUE_IDLE_SECONDS": "600",
        "DISPO_CATALOGUE_CHECK_INTERVAL_SECONDS": "0.5",
    }
    gateway = await start_service("gateway", env)
    env["DISPO_CATALOGUE_GATEWAY_ADDRESS"] = gateway.address
    executors = [await start_service("executor", env) for _ in range(3)]

    # Runs handed out in each second of the executors' clock, across the workers: a run's
    # deadline is its claim plus the action's timeout (the moment a worker's handler starts
    # lags the claim by however busy this machine is, and would blur the seconds).
    began: Counter[int] = Counter()
    secret = await worker_token(gateway.address, "paced")
    workers = [Worker(e.address, secret, concurrency=10, grace=1.0) for e in executors]
    for worker in workers:

        @worker.action("paced")
        async def run(ctx: RunContext, payload: dict) -> dict:
            assert ctx.deadline is not None
            claimed = ctx.deadline - timedelta(milliseconds=TIMEOUT_MS)
            began[math.floor(claimed.timestamp())] += 1
            return {}

    async with AsyncClient(gateway.address, token=tokens.admin) as client:
        ids = [
            (await client.submit("shop", [cell("paced", n=i)], idempotency_key=f"p{i}")).task_id
            for i in range(TASKS)
        ]
        await eventually(
            lambda: paced_queue(executors[0].address),
            lambda q: q.offered == TASKS,
            timeout=60,
            wanted="every run offered",
        )
        running = [asyncio.create_task(w.run(handle_signals=False)) for w in workers]
        try:
            for task_id in ids:
                done = await client.wait(task_id, timeout=120)
                assert done.status == "SUCCEEDED", done
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.gather(*running, return_exceptions=True)

        assert sum(began.values()) == TASKS
        busiest = max(began.values())
        assert busiest <= RATE, f"{busiest} runs began in one second: {sorted(began.items())}"
        # The limit was used, not starved.
        assert busiest >= RATE // 2, sorted(began.items())

        # Every executor shows the limit, and the use of the last second is the cluster's.
        views = [await paced_queue(e.address) for e in executors]
        assert all(v.max_calls_per_second == RATE for v in views)
        assert all(v.taken_last_second <= RATE for v in views)
        listed = await asyncio.to_thread(dispo_queues, executors[1].address, tokens.admin)
        assert [(q["name"], q["max_calls_per_second"]) for q in listed] == [("paced", RATE)]

        # A newer catalogue version's limit reaches the running executors.
        current = await client.get_catalogue()
        document = current.document
        document["queues"]["paced"]["max_calls_per_second"] = 2 * RATE
        await client.apply_catalogue(document, current.version)
        for e in executors:
            await eventually(
                lambda e=e: paced_queue(e.address),
                lambda q: q.max_calls_per_second == 2 * RATE,
                timeout=30,
                wanted="the new limit",
            )
