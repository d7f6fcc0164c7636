"""``dispo bench soak``: a steady submit rate for days of the stack's clock, the disk sampled.

    dispo bench soak --rate 50 --retention-days 1 --days 5 --day-seconds 120

It starts its own embedded stack (gateway, executor, reconciler) on a file clock
(``DISPO_CLOCK=file:…``) that runs at the wall's pace but jumps a day ahead every
``--day-seconds``: each service sees ``--days`` days go by, and its retention (the business
policy's ``--retention-days`` for every business, passes every few seconds) deletes what
it keeps about the tasks that finished more than that long ago. Meanwhile ``dag3`` tasks
are submitted at ``--rate`` a second. Every ``--sample-seconds`` it reads the size of every
table of the three services (``pg_total_relation_size``: rows, indexes, TOAST) and the
bytes each NATS stream keeps on disk. It prints the samples (the clock's day, the tasks
held, each table's size in MiB, the streams) and writes them as JSON to ``--results``:
after ``--retention-days`` + 1 days every size is flat, up to the space autovacuum reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from dispo.libs.clock import write_file_clock
from dispo.libs.db.roles import asyncpg_url
from dispo.sdk import AsyncClient, cell
from dispo.tools.bench import load, run
from dispo.tools.bench.shapes import SHAPES

SCHEMAS = ("gateway", "executor", "reconciler")
TASKS = ("gateway.tasks", "executor.task_runs", "reconciler.completions")
# How often the file clock is written (it runs at the wall's pace between two jumps).
TICK = 0.02

_SIZES = """
SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = ANY($1::text[]) ORDER BY 1
"""


class JumpingClock:
    """The file a file clock reads: the wall's time plus a whole number of days."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.days = 0

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(days=self.days)

    def write(self) -> None:
        write_file_clock(self.path, self.now())

    async def run(self, day_seconds: float) -> None:
        """Keep the file current, a day further every ``day_seconds``; until cancelled."""
        began = time.monotonic()
        while True:
            self.days = int((time.monotonic() - began) // day_seconds)
            self.write()
            await asyncio.sleep(TICK)


def stream_bytes(root: Path) -> dict[str, int]:
    """The bytes each JetStream stream keeps on disk under ``root`` (by stream name)."""
    sizes: dict[str, int] = {}
    for streams in root.rglob("streams"):
        for stream in (p for p in streams.iterdir() if p.is_dir()):
            files: Iterator[Path] = (f for f in stream.rglob("*") if f.is_file())
            sizes[stream.name] = sizes.get(stream.name, 0) + sum(f.stat().st_size for f in files)
    return sizes


async def sample(
    database_url: str, root: Path, clock: JumpingClock, began: float
) -> dict[str, Any]:
    conn = await asyncpg.connect(asyncpg_url(database_url))
    try:
        tables = {name: size for name, size in await conn.fetch(_SIZES, list(SCHEMAS))}
        held = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TASKS}
    finally:
        await conn.close()
    return {
        "seconds": round(time.monotonic() - began, 1),
        "day": clock.days,
        "tasks_held": held,
        "tables_bytes": tables,
        "postgres_bytes": sum(tables.values()),
        "streams_bytes": stream_bytes(root),
    }


def policy_yaml(retention_days: int) -> str:
    return f"default:\n  retention_days: {retention_days}\n"


async def soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    clock = JumpingClock(root / "clock")
    clock.write()
    policy = root / "policy.yaml"
    policy.write_text(policy_yaml(args.retention_days))
    env = {
        "DISPO_CLOCK": f"file:{clock.path}",
        "DISPO_BUSINESS_POLICY": str(policy),
        "DISPO_RETENTION_INTERVAL_SECONDS": str(args.retention_interval),
    }
    seconds = args.days * args.day_seconds
    async with run.start_stack(
        run.DEFAULT_SERVICES, downstream=False, extra_env=env, folder=root / "stack"
    ) as own:
        assert own.stack.postgres is not None
        url = own.stack.postgres.url
        ticking = asyncio.create_task(clock.run(args.day_seconds))
        clients = [AsyncClient(address, token=own.token) for address in own.gateways]
        submitter = load.Submitter(clients, "soak", lambda: [cell(SHAPES["dag3"].cell)])
        began = time.monotonic()
        submitting = asyncio.create_task(load.offer(submitter, int(seconds * args.rate), args.rate))
        samples = []
        try:
            while not submitting.done():
                samples.append(await sample(url, root, clock, began))
                line = samples[-1]
                print(
                    f"{line['seconds']:>7} s day {line['day']:>3}"
                    f" tasks {line['tasks_held']['gateway.tasks']:>8,}"
                    f" postgres {line['postgres_bytes'] / 2**20:>9,.1f} MiB"
                    f" streams {sum(line['streams_bytes'].values()) / 2**20:>7,.1f} MiB",
                    file=sys.stderr,
                )
                await asyncio.wait({submitting}, timeout=args.sample_seconds)
            facts = submitting.result()
            samples.append(await sample(url, root, clock, began))
        finally:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking
            for client in clients:
                await client.close()
    return {
        "rate": args.rate,
        "retention_days": args.retention_days,
        "days": args.days,
        "day_seconds": args.day_seconds,
        "submitted": len(facts.accepted),
        "submit_errors": len(facts.submissions) - len(facts.accepted),
        "samples": samples,
    }


def flat_after(result: dict[str, Any]) -> dict[str, Any]:
    """The samples once the first tasks' retention has passed (day > retention + 1): the
    smallest and the largest of PostgreSQL's bytes and of the tasks held."""
    late = [s for s in result["samples"] if s["day"] > result["retention_days"] + 1]
    if not late:
        return {}
    sizes = [s["postgres_bytes"] for s in late]
    held = [s["tasks_held"]["gateway.tasks"] for s in late]
    return {
        "samples": len(late),
        "postgres_bytes": (min(sizes), max(sizes)),
        "gateway_tasks_held": (min(held), max(held)),
    }


def text(result: dict[str, Any]) -> list[str]:
    tables = sorted({t for s in result["samples"] for t in s["tables_bytes"]})
    big = [t for t in tables if max(s["tables_bytes"][t] for s in result["samples"]) > 2**20]
    streams = sorted({n for s in result["samples"] for n in s["streams_bytes"]})
    lines = [
        "seconds day   tasks  postgres MiB  "
        + "  ".join(f"{t} MiB" for t in big)
        + "  "
        + "  ".join(f"{n} MiB" for n in streams)
    ]
    for s in result["samples"]:
        cells = [
            f"{s['seconds']:>7}",
            f"{s['day']:>3}",
            f"{s['tasks_held']['gateway.tasks']:>7}",
            f"{s['postgres_bytes'] / 2**20:>12.1f}",
            *(f"{s['tables_bytes'].get(t, 0) / 2**20:>{len(t) + 4}.1f}" for t in big),
            *(f"{s['streams_bytes'].get(n, 0) / 2**20:>{len(n) + 4}.1f}" for n in streams),
        ]
        lines.append("  ".join(cells))
    lines.append(f"submitted {result['submitted']:,} ({result['submit_errors']} errors)")
    lines.append(f"after retention + 1 days {flat_after(result)}")
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dispo bench soak", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=50.0, help="Submits per second (dag3 tasks)")
    p.add_argument(
        "--retention-days", type=int, default=1, help="every business's retention (days)"
    )
    p.add_argument("--days", type=int, default=5, help="days of the stack's clock the soak runs")
    p.add_argument(
        "--day-seconds", type=float, default=120.0, help="wall seconds of one day of the clock"
    )
    p.add_argument("--sample-seconds", type=float, default=10.0, help="seconds between samples")
    p.add_argument(
        "--retention-interval",
        type=float,
        default=5.0,
        help="seconds between retention passes when nothing is due",
    )
    p.add_argument("--keep", default="", metavar="FOLDER", help="keep the stack's data in FOLDER")
    p.add_argument(
        "--results", default="bench-results", help="folder for the JSON result ('' for none)"
    )
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    if args.retention_days < 1 or args.days < 1 or args.day_seconds <= 0 or args.rate <= 0:
        p.error("--retention-days and --days must be at least 1, the rest above 0")
    import tempfile

    with contextlib.ExitStack() as scratch:
        root = (
            Path(args.keep)
            if args.keep
            else Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="dispo-soak-")))
        )
        root.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(soak(args, root))
    print("\n".join(text(result)))
    if args.results:
        folder = Path(args.results)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-soak-rate{args.rate:g}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"result                   {path}")


if __name__ == "__main__":
    main()
