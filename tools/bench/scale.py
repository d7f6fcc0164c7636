"""``dispo bench scale``: the hot paths on empty tables and on tables of many finished rows.

    dispo bench scale --rows 10000000 --tasks 2000

It starts its own embedded stack (gateway, executor, reconciler) and measures twice, the
same way: once on empty tables, once after loading ``--rows`` finished tasks into every
table the services keep a task in (the gateway's tasks — their outbox rows gone, as the
relay leaves them —, the executor's runs and three nodes each, the reconciler's completion
facts), spread over 30 days and 20 businesses of skewed sizes, 96 % SUCCEEDED, a quarter
labelled, each row with the bytes of a real task the first run finished. The rows are
written by the server (``INSERT … SELECT … FROM generate_series``, a chunk per transaction), then vacuumed and
analysed as autovacuum leaves a table that has run for months.

Each time it runs ``dispo bench submit`` (the Submit latency), then times GetTask,
ListTasks (a business and a day, newest first; with a label; with a status) and
CountTasks through the gateway's gRPC API, and the statements behind them and the
executor's hot ones (its claim of a task, its pass-end write, the relay's outbox read)
with ``EXPLAIN (ANALYZE, BUFFERS)``, naming the indexes each plan reads and any
sequential scan of a table. It prints both runs side by side, with every table's rows and
size, and writes the result as JSON to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from dispo.executor.store import status_events, task_runs
from dispo.gateway import store as gateway_store
from dispo.libs.db.driver import Statement
from dispo.libs.db.roles import asyncpg_url
from dispo.sdk import AsyncClient
from dispo.tools.bench import run
from dispo.tools.bench.report import latency, render

BUSINESSES = 20
PREFIX = "scale"
DAYS = 30
CHUNK = 50_000
# Tables a loaded task has rows in, and every other table measured, by service schema.
TABLES = (
    "gateway.tasks",
    "gateway.outbox",
    "executor.task_runs",
    "executor.node_runs",
    "executor.outbox",
    "reconciler.completions",
    "reconciler.outbox",
)

# Task n of the load: business (skewed: the first is the largest), created_at spread over
# DAYS before the load's start, a status (96 % succeeded, 2.5 % cancelled, 1.5 % failed),
# a label on every fourth (one of 500 campaigns). All from n, so a probe knows its rows.
_ROWS = f"""
SELECT md5(n::text) AS id,
  '{PREFIX}-' || lpad(floor({BUSINESSES} * power(((n * 7919) % 1000) / 1000.0, 2))::text, 2, '0')
    AS business,
  $3::timestamptz - make_interval(secs => {DAYS} * 86400.0 * ((n * 104729) % 1000003) / 1000003)
    AS created,
  CASE WHEN n % 1000 < 960 THEN 'succeeded' WHEN n % 1000 < 985 THEN 'cancelled'
    ELSE 'failed' END AS status,
  CASE WHEN n % 4 = 0 THEN jsonb_build_object('campaign', 'c-' || (n % 500)) END AS labels
FROM generate_series($1::bigint, $2::bigint) AS n
"""

# The bytes of a real task (one the submit bench ran, SUCCEEDED) stand for every loaded
# one's: its view and accepted envelope, its run's envelope, its nodes' outputs, its
# completion fact's envelope. $4 … $8.
_TEMPLATE = """
SELECT g.view, g.accepted, r.envelope AS run,
  (SELECT n.output FROM executor.node_runs n WHERE n.task_id = g.task_id
   ORDER BY n.position LIMIT 1) AS output,
  c.envelope AS fact
FROM gateway.tasks g JOIN executor.task_runs r USING (task_id)
JOIN reconciler.completions c USING (task_id)
WHERE g.status = 'succeeded' ORDER BY g.created_at LIMIT 1
"""

_LOAD = f"""
WITH ids AS MATERIALIZED ({_ROWS}),
tasks AS (
  INSERT INTO gateway.tasks (task_id, business, request_hash, status, node_count, version,
    view, accepted, labels, created_at, updated_at, finished_at)
  SELECT id, business, id, status, 3, 3, $4, $5, labels,
    created, created + interval '2 s', created + interval '2 s'
  FROM ids RETURNING 1),
runs AS (
  INSERT INTO executor.task_runs (task_id, business, status, version, envelope, created_at,
    updated_at, finished_at)
  SELECT id, business, status, 3, $6, created, created + interval '2 s',
    created + interval '2 s'
  FROM ids RETURNING 1),
nodes AS (
  INSERT INTO executor.node_runs (task_id, node_id, position, status, attempts, started_at,
    finished_at, output)
  SELECT id, 'n' || k, k, CASE WHEN status = 'failed' THEN 'failed' ELSE 'succeeded' END, 1,
    created, created + interval '2 s', $7
  FROM ids, generate_series(0, 2) AS k RETURNING 1),
facts AS (
  INSERT INTO reconciler.completions (task_id, business, status, version, envelope,
    finished_at, recorded_at, notify_state, reconcile_state)
  SELECT id, business, status, 3, $8, created + interval '2 s', created + interval '2 s',
    'none', 'matched'
  FROM ids RETURNING 1)
SELECT (SELECT count(*) FROM tasks)
"""


def business(index: int) -> str:
    return f"{PREFIX}-{index:02d}"


def loaded_ids(rows: int, count: int) -> list[str]:
    """Ids of ``count`` tasks spread over a load of ``rows``, as the load names them."""
    import hashlib

    step = max(1, rows // max(1, count))
    return [hashlib.md5(str(n).encode()).hexdigest() for n in range(0, rows, step)][:count]


async def load(database_url: str, rows: int, now: datetime, chunk: int = CHUNK) -> float:
    """``rows`` finished tasks in every table, a chunk per transaction, then vacuumed and
    analysed; the seconds it took."""
    began = time.monotonic()
    conn = await asyncpg.connect(asyncpg_url(database_url))
    try:
        template = await conn.fetchrow(_TEMPLATE)
        if template is None:
            raise SystemExit("no SUCCEEDED task to copy: the submit bench ran none")
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk) - 1
            await conn.fetchval(_LOAD, start, end, now, *template)
            print(f"loaded {end + 1:,} of {rows:,}", file=sys.stderr)
        for table in TABLES:
            await conn.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        await conn.close()
    return time.monotonic() - began


async def tables(database_url: str) -> dict[str, dict[str, int]]:
    """Every measured table's rows and total size in bytes (its indexes and TOAST too)."""
    conn = await asyncpg.connect(asyncpg_url(database_url))
    try:
        return {
            table: {
                "rows": await conn.fetchval(f"SELECT count(*) FROM {table}"),
                "bytes": await conn.fetchval("SELECT pg_total_relation_size($1)", table),
            }
            for table in TABLES
        }
    finally:
        await conn.close()


class Recorder:
    """A connection that runs nothing: it keeps the statement a store function sends and
    its parameters, so the bench explains the store's own SQL."""

    def __init__(self) -> None:
        self.sent: list[tuple[Statement, dict[str, Any]]] = []

    async def fetch(
        self, sql: Statement | str, params: Mapping[str, Any] | None = None
    ) -> list[Any]:
        statement = sql if isinstance(sql, Statement) else Statement(sql)
        self.sent.append((statement, dict(params or {})))
        return []


async def recorded(call: Callable[[Any], Awaitable[Any]]) -> tuple[Statement, dict[str, Any]]:
    """The one statement ``call(conn)`` sends, with its parameters."""
    recorder = Recorder()
    await call(recorder)
    (sent,) = recorder.sent
    return sent


def plan_facts(plan: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The indexes a plan reads and the tables it reads whole (sequential scans)."""
    indexes: set[str] = set()
    scanned: set[str] = set()

    def walk(node: dict[str, Any]) -> Iterator[None]:
        if "Index Name" in node:
            indexes.add(node["Index Name"])
        if node.get("Node Type") == "Seq Scan":
            scanned.add(node.get("Relation Name", "?"))
        for child in node.get("Plans", ()):
            yield from walk(child)
        yield None

    for _ in walk(plan["Plan"]):
        pass
    return indexes, scanned


async def explain(
    conn: asyncpg.Connection,
    schema: str,
    statement: Statement,
    params: Mapping[str, Any] | None,
) -> tuple[float | None, set[str], set[str]]:
    """The plan of ``statement`` in ``schema``: with ``params``, run (``EXPLAIN ANALYZE``,
    in a transaction rolled back: a write changes nothing) and its execution time in ms;
    without, the generic plan a prepared statement takes for any parameters (no time)."""
    tr = conn.transaction()
    await tr.start()
    try:
        await conn.execute(f"SET LOCAL search_path = {schema}")
        if params is not None:
            raw = await conn.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement.sql}",
                *statement.arguments(params),
            )
        else:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE scale_generic AS {statement.sql}")
            nulls = ", ".join("NULL" for _ in statement.names)
            raw = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) EXECUTE scale_generic{f'({nulls})' if nulls else ''}"
            )
            await conn.execute("DEALLOCATE scale_generic")
    finally:
        await tr.rollback()
    (plan,) = json.loads(raw) if isinstance(raw, str) else raw
    indexes, scanned = plan_facts(plan)
    return plan.get("Execution Time"), indexes, scanned


def _summary(seconds: list[float]) -> dict[str, Any]:
    figures = latency(seconds)
    return {"n": figures.n, "p50_ms": figures.p50_ms, "p99_ms": figures.p99_ms}


async def probe(
    gateway: str, token: str, database_url: str, ids: list[str], repeat: int
) -> dict[str, Any]:
    """Each operation ``repeat`` times through the gateway (its latency) and each statement
    explained ``repeat`` times (its execution time and plan), on the first business."""
    now = datetime.now(UTC)
    day = {"created_after": now - timedelta(days=1), "created_before": now}
    biggest = business(0)
    label = {"campaign": "c-0"}
    client = AsyncClient(gateway, token=token)

    async def first_page(**kwargs: Any) -> None:
        async for _ in client.list(page_size=50, **kwargs):
            break

    calls: dict[str, Callable[[int], Awaitable[Any]]] = {
        "GetTask": lambda i: client.get(ids[i % len(ids)]),
        "ListTasks business, day": lambda _: first_page(business=biggest, **day),
        "ListTasks business, day, label": lambda _: first_page(
            business=biggest, labels=label, **day
        ),
        "ListTasks business, day, status": lambda _: first_page(
            business=biggest, statuses=["FAILED"], **day
        ),
        "CountTasks business, day": lambda _: client.count(
            business=biggest, created_after=day["created_after"], created_before=now
        ),
    }
    api: dict[str, Any] = {}
    try:
        for name, call in calls.items():
            seconds = []
            for i in range(repeat):
                began = time.perf_counter()
                await call(i)
                seconds.append(time.perf_counter() - began)
            api[name] = _summary(seconds)
    finally:
        await client.close()

    window = gateway_store.TaskFilter(
        business=biggest, created_after=day["created_after"], created_before=now
    )
    labelled = gateway_store.TaskFilter(
        business=biggest,
        created_after=day["created_after"],
        created_before=now,
        labels=tuple(label.items()),
    )

    def listing(matching: gateway_store.TaskFilter, statuses: list[str]) -> Any:
        return lambda c: gateway_store.task_list(
            c, matching, statuses=statuses, after=None, limit=51
        )

    statements: dict[str, tuple[str, Statement, Mapping[str, Any] | None]] = {}
    for name, call in {
        "GetTask": lambda c: gateway_store.task_get(c, ids[0]),
        "ListTasks business, day": listing(window, []),
        "ListTasks business, day, label": listing(labelled, []),
        "ListTasks business, day, status": listing(window, ["failed"]),
        "CountTasks business, day": lambda c: gateway_store.task_counts(c, window),
        "executor claim (tasks_open_many)": lambda c: task_runs.tasks_open_many(
            c, [(i, "bench") for i in ids[:8]], now, 30.0
        ),
    }.items():
        statement, params = await recorded(call)
        schema = "executor" if name.startswith("executor") else "gateway"
        statements[name] = (schema, statement, params)
    # Plans alone (no parameters a run would write with): the pass-end write of a task's
    # status and its events, and the relay's read of the outbox.
    statements["executor pass-end write (tasks_write_many)"] = (
        "executor",
        status_events._WRITE_MANY,
        None,
    )
    relay = _relay_read()
    statements["executor relay outbox read"] = ("executor", relay, {"limit": 256, "now": now})

    explained: dict[str, Any] = {}
    conn = await asyncpg.connect(asyncpg_url(database_url))
    try:
        for name, (schema, statement, values) in statements.items():
            times: list[float] = []
            indexes: set[str] = set()
            scanned: set[str] = set()
            for _ in range(repeat if values is not None else 1):
                ms, indexes, scanned = await explain(conn, schema, statement, values)
                if ms is not None:
                    times.append(ms / 1000)
            explained[name] = {
                **(_summary(times) if times else {"n": 0, "p50_ms": None, "p99_ms": None}),
                "indexes": sorted(indexes),
                "seq_scans": sorted(scanned),
            }
    finally:
        await conn.close()
    return {"api": api, "statements": explained}


def _relay_read() -> Statement:
    """The relay's read of the executor's outbox (its next rows to publish)."""
    from dispo.libs.outbox import _sql

    return _sql(status_events.outbox)._unsent[(True, False)]


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    async with run.start_stack(run.DEFAULT_SERVICES, downstream=False) as own:
        assert own.stack.postgres is not None
        url = own.stack.postgres.url
        target = run.Target(
            own.gateways, own.stack.pids(), url, own.token, own.stack.metrics_addresses()
        )
        result: dict[str, Any] = {"rows": args.rows}
        for phase in ("empty", "loaded"):
            if phase == "loaded":
                result["load_seconds"] = round(await load(url, args.rows, datetime.now(UTC)), 1)
            submit = await run.measure(args, target)
            ids = loaded_ids(args.rows, 64) if phase == "loaded" else await _some_ids(own)
            result[phase] = {
                "tables": await tables(url),
                "submit": submit,
                **await probe(own.gateways[0], own.token, url, ids, args.probes),
            }
        return result


async def _some_ids(own: run.OwnStack) -> list[str]:
    """Ids of tasks the stack holds (the submit bench's), for GetTask on empty tables."""
    client = AsyncClient(own.gateways[0], token=own.token)
    try:
        return [t.task_id async for t in client.list(page_size=64)][:64]
    finally:
        await client.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def text(result: dict[str, Any]) -> list[str]:
    """The result side by side: tables, then every operation empty vs loaded."""
    empty, loaded = result["empty"], result["loaded"]
    lines = [f"--- tables (loaded {result['rows']:,} tasks in {result.get('load_seconds')} s)"]
    for table, facts in loaded["tables"].items():
        lines.append(f"{table:<26} {facts['rows']:>12,} rows {facts['bytes'] / 2**20:>10,.1f} MiB")
    lines.append("--- Submit (dispo bench submit)")
    for phase, run_ in (("empty", empty), ("loaded", loaded)):
        submit = run_["submit"]["latency"]["submit"]
        lines.append(f"{phase:<7} p50 {_ms(submit['p50_ms'])} ms  p99 {_ms(submit['p99_ms'])} ms")
    lines.append(f"--- {'operation':<44} {'empty p50/p99 ms':>18} {'loaded p50/p99 ms':>18}")
    for part in ("api", "statements"):
        for name, after in loaded[part].items():
            before = empty[part][name]
            line = (
                f"{('gRPC ' if part == 'api' else 'SQL  ') + name:<48}"
                f" {_ms(before['p50_ms']):>8}/{_ms(before['p99_ms']):<8}"
                f" {_ms(after['p50_ms']):>8}/{_ms(after['p99_ms']):<8}"
            )
            if part == "statements":
                line += f" {', '.join(after['indexes']) or '-'}"
                if after["seq_scans"]:
                    line += f"  SEQ SCAN {', '.join(after['seq_scans'])}"
            lines.append(line)
    return lines


def seq_scans(result: dict[str, Any], big: tuple[str, ...] = TABLES) -> list[str]:
    """The loaded run's statements that read a big table whole."""
    names = {t.split(".")[1] for t in big if not t.endswith("outbox")}
    return [
        name
        for name, facts in result["loaded"]["statements"].items()
        if names & set(facts["seq_scans"])
    ]


def parser() -> argparse.ArgumentParser:
    p = run.parser()
    p.prog = "dispo bench scale"
    p.description = (__doc__ or "").splitlines()[0]
    p.add_argument(
        "--rows", type=int, default=1_000_000, help="finished tasks loaded before the second run"
    )
    p.add_argument("--probes", type=int, default=50, help="calls of each operation timed")
    p.set_defaults(start=True, shape="dag3", tasks=2000, ceiling_seconds=0.0)
    return p


def main() -> None:
    args = parser().parse_args()
    args.start = True
    result = asyncio.run(bench(args))
    for phase in ("empty", "loaded"):
        print(f"--- dispo bench submit, {phase} tables")
        print("\n".join(render(result[phase]["submit"])))
    print("\n".join(text(result)))
    if args.results:
        folder = Path(args.results)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-scale-{args.rows}.json"
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"result                   {path}")
    whole = seq_scans(result)
    if whole:
        print(f"sequential scans of a big table: {', '.join(whole)}")
    sys.exit(1 if whole else 0)


if __name__ == "__main__":
    main()
