"""Benchmark: the queue under contention — claims and run recordings through the pool's
real SQL on PostgreSQL (no driver, no HTTP: this measures the pool, not a target).

    python -m dispo.tools.bench.pool                                  # own embedded PostgreSQL
    python -m dispo.tools.bench.pool --database-url postgresql://… --crons 20 --evaluations 2000

``--crons`` crons wake concurrently in rounds; each round every cron takes the top queue
item and records the runs it owes (``--runs`` per evaluation, all due at once). Prints
claims/s, runs/s and WakeCron / RecordRun latency percentiles, and checks that every
evaluation was taken exactly once and completed.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dispo.libs.clock import ManualClock
from dispo.libs.db import create_engine, migrate
from dispo.libs.db.driver import Database
from dispo.libs.egress import AllowList
from dispo.libs.evaluation import Line, Verdict
from dispo.pool.app import MIGRATIONS
from dispo.pool.domain import (
    DriverCron,
    Evaluation,
    EvaluationStatus,
    PoolPolicy,
    RunResult,
    Schedule,
    TestCase,
)
from dispo.pool.operations import Pool
from dispo.pool.sweeps import create_cron
from dispo.tools.bench import latency_line
from sqlalchemy import text

TARGET = "http://127.0.0.1:9"  # the evaluations' target, never called


class NullDriver:
    name = "null"

    async def create(self, cron_id: str, state: dict[str, Any]) -> None: ...
    async def remove(self, cron_id: str) -> None: ...
    async def list(self) -> list[DriverCron]:
        return []

    async def find(self, cron_id: str) -> DriverCron | None:
        return None

    async def write_state(self, cron_id: str, state: dict[str, Any]) -> None: ...
    async def trigger(self, cron_id: str) -> None: ...

    async def drain(self) -> None: ...


async def run(url: str, crons: int, evaluations: int, runs: int) -> None:
    engine = create_engine(url, "pool_bench", pool_size=max(10, crons))
    await migrate(engine, "pool_bench", MIGRATIONS)
    db = await Database.open(url, "pool_bench", size=max(10, crons))
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    pool = Pool(
        db,
        NullDriver(),
        clock,
        PoolPolicy(max_size=max(crons, 20), runs_per_wake=runs),
        egress=AllowList.parse(TARGET),  # never called: the bench records runs itself
    )
    ids = [await create_cron(pool) for _ in range(crons)]
    await pool.settle()
    case = (TestCase("c1"),)
    for i in range(evaluations):
        await pool.create_evaluation(
            Evaluation(
                id=f"bench-{i:06d}",
                series="bench",
                line=Line.TRIAL,
                period="p",
                configuration_json="{}",
                analysis_model="",
                target_url=TARGET,
                cases=case,
                schedule=Schedule(clock.now(), 3600, 1, runs),
                status=EvaluationStatus.QUEUED,
            )
        )
    wakes: list[float] = []
    records: list[float] = []
    taken: list[str] = []

    async def serve(cron_id: str) -> bool:
        started = time.perf_counter()
        woke = await pool.wake_cron(cron_id)
        wakes.append(time.perf_counter() - started)
        if woke.evaluation is None:
            return False
        taken.append(woke.evaluation.id)
        for index in range(woke.next_run_index, woke.next_run_index + woke.runs_owed):
            started = time.perf_counter()
            await pool.record_run(
                cron_id, woke.evaluation.id, index, "c1", RunResult(Verdict.PASS, 1.0, 1)
            )
            records.append(time.perf_counter() - started)
        return True

    began = time.perf_counter()
    while any(await asyncio.gather(*(serve(c) for c in ids))):
        pass
    elapsed = time.perf_counter() - began
    await db.close()
    async with engine.begin() as conn:
        done = (
            await conn.execute(text("SELECT count(*) FROM evaluations WHERE status = 'completed'"))
        ).scalar_one()
        await conn.execute(text("DROP SCHEMA pool_bench CASCADE"))
    await engine.dispose()
    assert len(taken) == len(set(taken)) == evaluations == done, (
        "an evaluation was taken twice or not completed"
    )
    print(
        f"{crons} crons, {evaluations} evaluations x {runs} runs in {elapsed:.2f} s: "
        f"{evaluations / elapsed:.0f} claims/s, {len(records) / elapsed:.0f} runs/s"
    )
    print(latency_line("WakeCron", wakes))
    print(latency_line("RecordRun", records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", help="PostgreSQL to use (default: a temporary embedded one)"
    )
    parser.add_argument("--crons", type=int, default=20)
    parser.add_argument("--evaluations", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    if options.database_url:
        asyncio.run(run(options.database_url, options.crons, options.evaluations, options.runs))
        return
    from dispo.tools.stack.postgres import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="dispo-pool-bench-") as root:
        postgres = EmbeddedPostgres(Path(root) / "postgres")
        url = postgres.start()
        try:
            asyncio.run(run(url, options.crons, options.evaluations, options.runs))
        finally:
            postgres.stop("immediate")


if __name__ == "__main__":
    main()
