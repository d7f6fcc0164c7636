"""``dispo bench purge``: the submit bench beside a retention purge of many old tasks.

    dispo bench purge --old-tasks 200000 --shape dag3 --tasks 6000

It starts its own embedded stack (gateway, executor, reconciler; retention passes every
second), runs the submit bench once on empty tables (the baseline), then loads
``--old-tasks`` finished tasks 60 days old into every table the three services purge (the
gateway's tasks, the executor's runs and three nodes each, the reconciler's completion
facts; rows of the sizes a three-node task leaves) and runs the same bench again while each
service deletes them in its batches (ADR-0105). It prints both runs' figures, how many old
rows each service deleted during the second and at what rate, and what became of every
task of the runs: none may be lost (every one SUCCEEDED).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from dispo.tools.bench import run
from dispo.tools.bench.report import render
from dispo.tools.bench.shapes import SHAPES

OLD = "bench-old"
# Where each service keeps a task, the table counted for it.
COUNTED = {
    "gateway": "gateway.tasks",
    "executor": "executor.task_runs",
    "reconciler": "reconciler.completions",
}
CHUNK = 20_000
# Row sizes about those a finished three-node task leaves (docs/retention.md).
VIEW_BYTES, ENVELOPE_BYTES, FACT_BYTES = 3000, 1200, 800

_LOAD = """
WITH ids AS (SELECT $1 || '-' || n AS id FROM generate_series($2::int, $3::int) AS n),
tasks AS (
  INSERT INTO gateway.tasks (task_id, business, request_hash, status, node_count, version,
    view, created_at, updated_at, finished_at)
  SELECT id, $1, md5(id), 'succeeded', 3, 3, convert_to(repeat('v', $5), 'UTF8'), $4, $4, $4
  FROM ids RETURNING 1),
runs AS (
  INSERT INTO executor.task_runs (task_id, business, status, version, envelope, created_at,
    updated_at, finished_at)
  SELECT id, $1, 'succeeded', 3, convert_to(repeat('e', $6), 'UTF8'), $4, $4, $4
  FROM ids RETURNING 1),
nodes AS (
  INSERT INTO executor.node_runs (task_id, node_id, position, status, attempts, started_at,
    finished_at, output)
  SELECT id, 'n' || k, k, 'succeeded', 1, $4, $4, convert_to(repeat('o', 200), 'UTF8')
  FROM ids, generate_series(0, 2) AS k RETURNING 1),
facts AS (
  INSERT INTO reconciler.completions (task_id, business, status, version, envelope,
    finished_at, recorded_at, notify_state, reconcile_state)
  SELECT id, $1, 'succeeded', 3, convert_to(repeat('f', $7), 'UTF8'), $4, $4, 'none', 'matched'
  FROM ids RETURNING 1)
SELECT (SELECT count(*) FROM tasks) + (SELECT count(*) FROM runs)
  + (SELECT count(*) FROM nodes) + (SELECT count(*) FROM facts)
"""


async def load_old(database_url: str, count: int, finished: datetime) -> float:
    """``count`` finished tasks of the business ``bench-old`` in every purged table, finished
    at ``finished``, in chunks (each a transaction of its own); the seconds it took."""
    began = time.monotonic()
    conn = await asyncpg.connect(database_url)
    try:
        for start in range(0, count, CHUNK):
            end = min(count, start + CHUNK) - 1
            await conn.fetchval(
                _LOAD, OLD, start, end, finished, VIEW_BYTES, ENVELOPE_BYTES, FACT_BYTES
            )
    finally:
        await conn.close()
    return time.monotonic() - began


async def old_rows(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {
            service: await conn.fetchval(f"SELECT count(*) FROM {table} WHERE business = $1", OLD)
            for service, table in COUNTED.items()
        }
    finally:
        await conn.close()


def lost(report: dict[str, Any]) -> int:
    """Tasks of the run that did not end SUCCEEDED."""
    statuses = report["statuses"]
    return sum(n for status, n in statuses.items() if status != "SUCCEEDED")


async def bench(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    shape = SHAPES[args.shape]
    async with run.start_stack(
        run.DEFAULT_SERVICES,
        downstream=shape.http,
        extra_env={"DISPO_RETENTION_INTERVAL_SECONDS": "1"},
    ) as own:
        assert own.stack.postgres is not None
        url = own.stack.postgres.url
        target = run.Target(
            own.gateways, own.stack.pids(), url, own.token, own.stack.metrics_addresses()
        )
        baseline = await run.measure(args, target)
        loaded = await load_old(url, args.old_tasks, datetime.now(UTC) - timedelta(days=60))
        before = await old_rows(url)
        began = time.monotonic()
        beside = await run.measure(args, target)
        seconds = time.monotonic() - began
        after = await old_rows(url)
        purge = {
            "old_tasks": args.old_tasks,
            "load_seconds": round(loaded, 1),
            "run_seconds": round(seconds, 1),
            "old_rows_before": before,
            "old_rows_after": after,
            "purged_per_second": {
                s: round((before[s] - after[s]) / seconds) for s in COUNTED if seconds
            },
        }
        return baseline, beside, purge


def parser() -> argparse.ArgumentParser:
    p = run.parser()
    p.prog = "dispo bench purge"
    p.description = (__doc__ or "").splitlines()[0]
    p.add_argument(
        "--old-tasks",
        type=int,
        default=200_000,
        help="finished tasks 60 days old loaded before the second run, for retention to purge",
    )
    p.set_defaults(start=True, shape="dag3", tasks=6000, ceiling_seconds=0.0)
    return p


def main() -> None:
    args = parser().parse_args()
    args.start = True
    baseline, beside, purge = asyncio.run(bench(args))
    for title, report in (("on empty tables", baseline), ("beside the purge", beside)):
        print(f"--- {title}")
        print("\n".join(render(report)))
    print("--- the purge")
    for key, value in purge.items():
        print(f"{key:<24} {value}")
    missing = lost(baseline) + lost(beside)
    print(f"tasks not SUCCEEDED      {missing}")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
