"""Benchmark: submit throughput and end-to-end latency through the real pipeline.

    python -m dispo.gateway.bench --start                 # own embedded stack (gateway + executor)
    python -m dispo.gateway.bench --address 127.0.0.1:50051 --tasks 2000 --concurrency 64

Submits ``--tasks`` tasks of ``--cell`` (default ``noop``: measures the platform, not a
downstream) with ``--concurrency`` in flight, then follows each to its terminal status.
Prints submit throughput, Submit RPC latency and submit→terminal latency (p50/p95/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from dispo.libs.bench import latency_line, rate_line
from dispo.libs.sdk import AsyncClient, cell


async def run(address: str, tasks: int, concurrency: int, cell_name: str, business: str) -> None:
    async with AsyncClient(address) as client:
        await client.submit(business, [cell(cell_name)])  # warm-up
        submitted: list[str] = []
        submit_latency: list[float] = []
        end_to_end: list[float] = []
        statuses: dict[str, int] = {}
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(tasks):
            queue.put_nowait(i)

        async def submitter() -> None:
            while not queue.empty():
                queue.get_nowait()
                started = time.perf_counter()
                accepted = await client.submit(business, [cell(cell_name)])
                submit_latency.append(time.perf_counter() - started)
                submitted.append(accepted.task_id)

        began = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(concurrency)))
        submit_seconds = time.perf_counter() - began

        semaphore = asyncio.Semaphore(concurrency)

        async def follow(task_id: str) -> None:
            async with semaphore:
                view = await client.wait(task_id, timeout=600)
            # Terminal time as recorded by the executor, so a late watcher does not inflate it.
            finished = view.raw.updated_at.ToDatetime().timestamp()
            accepted = view.raw.created_at.ToDatetime().timestamp()
            end_to_end.append(max(0.0, finished - accepted))
            statuses[view.status] = statuses.get(view.status, 0) + 1

        await asyncio.gather(*(follow(t) for t in submitted))
        total_seconds = time.perf_counter() - began

    print(f"tasks={tasks} concurrency={concurrency} cell={cell_name}")
    print(rate_line("submitted", tasks, submit_seconds))
    print(rate_line("completed (to last)", tasks, total_seconds))
    print(latency_line("Submit RPC latency", submit_latency))
    print(latency_line("accepted→terminal", end_to_end))
    print(f"statuses                 {statuses}")


async def with_stack(args: argparse.Namespace) -> None:
    from dispo.libs.stack.nats import free_port
    from dispo.libs.stack.stack import Stack, StackOptions

    with tempfile.TemporaryDirectory(prefix="dispo-bench-") as root:
        ports = {"gateway": free_port(), "executor": free_port()}
        options = StackOptions(
            data_dir=Path(root),
            nats_port=free_port(),
            ports=ports,
            services=("gateway", "executor"),
            demo_port=0,
            extra_env={"DISPO_LOG_LEVEL": os.environ.get("DISPO_LOG_LEVEL", "WARNING")},
        )
        stack = Stack(options)
        addresses = await stack.start()
        try:
            await run(addresses["gateway"], args.tasks, args.concurrency, args.cell, args.business)
        finally:
            await stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="gateway address")
    parser.add_argument(
        "--start",
        action="store_true",
        help="start an embedded stack (gateway + executor) for the run",
    )
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--cell", default="noop")
    parser.add_argument("--business", default="bench")
    args = parser.parse_args()
    if args.start:
        asyncio.run(with_stack(args))
    else:
        asyncio.run(run(args.address, args.tasks, args.concurrency, args.cell, args.business))


if __name__ == "__main__":
    main()
