"""``dispo bench fairness``: a flooding business and a trickling one through the real
pipeline, on the bench's own embedded stack (ADR-0109).

    dispo bench fairness                                   # 20,000 flood, then 200 trickle
    dispo bench fairness --flood 5000 --trickle 100 --shape http --rate 20

The flooding business submits ``--flood`` tasks as fast as SubmitMany takes them; once they
are all accepted, the trickling business submits ``--trickle`` tasks at ``--rate`` a second
while the flood drains. Prints, per business, its throughput (tasks over the time from its
first submit to its last task's end) and its submit→terminal latency percentiles, and how
much of the flood was still unfinished when the trickle's last task ended: with a fair
share the trickle's latencies stay those of an idle stack, whatever the flood's size.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict
from typing import Any

from dispo.libs.eventloop import loop_factory
from dispo.sdk import AsyncClient, TaskRequest, cell
from dispo.tools.bench.load import UNFINISHED, outcomes, unfinished
from dispo.tools.bench.report import latency, latency_text, per_second
from dispo.tools.bench.run import start_stack
from dispo.tools.bench.shapes import SHAPES, Shape

FLOOD, TRICKLE = "flood", "trickle"
# Tasks per SubmitMany of the flood, and such calls at once.
BATCH, CALLS = 500, 4


async def _flood(client: AsyncClient, shape: Shape, count: int) -> float:
    """Submit the flood; the moment its first submit left."""
    began = time.time()
    sent = 0

    async def one_call(size: int) -> None:
        await client.submit_many([TaskRequest(FLOOD, [cell(shape.cell)]) for _ in range(size)])

    while sent < count:
        sizes = []
        for _ in range(CALLS):
            size = min(BATCH, count - sent)
            if size <= 0:
                break
            sizes.append(size)
            sent += size
        await asyncio.gather(*(one_call(s) for s in sizes))
    return began


async def _trickle(client: AsyncClient, shape: Shape, count: int, rate: float) -> float:
    began = time.time()
    for i in range(count):
        await client.submit(TRICKLE, [cell(shape.cell)])
        if rate > 0:
            await asyncio.sleep(max(0.0, began + (i + 1) / rate - time.time()))
    return began


def _business(name: str, began: float, ends: list[tuple[float, float]]) -> dict[str, Any]:
    last = max((end for _, end in ends), default=began)
    return {
        "business": name,
        "tasks": len(ends),
        "throughput_per_second": per_second(len(ends), last - began),
        "latency": asdict(latency([end - start for start, end in ends])),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    env = {"DISPO_EXECUTOR_PASSES": str(args.passes)} if args.passes else {}
    async with (
        start_stack(
            ("gateway", "executor", "reconciler"), downstream=shape.http, extra_env=env
        ) as own,
        AsyncClient(own.gateways[0], token=own.token) as client,
    ):
        flood_began = await _flood(client, shape, args.flood)
        trickle_began = await _trickle(client, shape, args.trickle, args.rate)
        trickled = await outcomes(client, TRICKLE, args.timeout)
        flood_left = 0
        async for _ in client.list(business=FLOOD, statuses=UNFINISHED, page_size=500):
            flood_left += 1
        while await unfinished(client, FLOOD):
            await asyncio.sleep(0.5)
        flooded = await outcomes(client, FLOOD, args.timeout)
    return {
        "shape": shape.name,
        "flood": args.flood,
        "trickle": args.trickle,
        "trickle_rate": args.rate,
        "flood_unfinished_when_trickle_ended": flood_left,
        "businesses": [
            _business(FLOOD, flood_began, [(o.accepted_at, o.updated_at) for o in flooded]),
            _business(TRICKLE, trickle_began, [(o.accepted_at, o.updated_at) for o in trickled]),
        ],
    }


def render(report: dict[str, Any]) -> list[str]:
    lines = [
        f"fairness                 shape {report['shape']}: {report['flood']} flood tasks, then"
        f" {report['trickle']} trickle tasks at {report['trickle_rate'] or 'full'}/s",
    ]
    for b in report["businesses"]:
        rate = b["throughput_per_second"]
        lines.append(f"{b['business']:<24} {b['tasks']} tasks, {rate or 0:.1f} tasks/s")
        lines.append(latency_text(f"  {b['business']} latency", b["latency"]))
    lines.append(
        f"flood unfinished         {report['flood_unfinished_when_trickle_ended']} when the"
        " trickle's last task ended"
    )
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dispo bench fairness", description=__doc__.split("\n")[0])
    p.add_argument("--flood", type=int, default=20_000, help="tasks the flooding business submits")
    p.add_argument("--trickle", type=int, default=200, help="tasks the trickling business submits")
    p.add_argument(
        "--rate", type=float, default=20.0, help="the trickle's submits a second (0: at once)"
    )
    p.add_argument("--shape", choices=("noop", "dag3", "http"), default="noop")
    p.add_argument("--passes", type=int, default=0, help="DISPO_EXECUTOR_PASSES (0: its default)")
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds to wait for each business"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.flood < 1 or args.trickle < 1:
        parser().error("--flood and --trickle must be at least 1")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        report = runner.run(bench(args))
    print("\n".join(render(report)))


if __name__ == "__main__":
    main()
