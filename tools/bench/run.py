"""``dispo bench submit``: tasks through the real pipeline, measured against the machine.

    dispo bench submit --start --tasks 3000 --concurrency 32            # saturation, noop
    dispo bench submit --start --tasks 3000 --concurrency 32 --batch 20 # SubmitMany of 20
    dispo bench submit --start --shape http --rate 300 --tasks 3000     # fixed offered rate
    dispo bench submit --start --shape worker --workers 2               # worker actions
    dispo bench submit --start --gateways 2 --executors 3 --cluster     # scale-out, NATS cluster
    dispo bench submit --start --shape http --executors 3 --downstream-concurrency 16 \
        --downstream-delay-ms 20                 # a downstream's limit held by 3 executors
    dispo bench submit --address 127.0.0.1:50051 --tasks 2000           # a running stack

With ``--start`` the bench runs its own embedded stack (PostgreSQL, NATS — one node or a
three-node cluster —, the services, for the HTTP shapes the demo downstream as a fast
local HTTP server, and for ``--shape worker`` the bench's worker processes), with a catalogue
written for the run. It measures PostgreSQL's commit
ceiling with ``pgbench``, samples the CPU time of every process the stack started, submits,
waits until every task is terminal, samples again, prints the report and writes it as JSON
to ``--results`` (``bench-results/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from dispo.libs.db.roles import asyncpg_url
from dispo.libs.eventloop import loop_factory
from dispo.libs.settings import CommonSettings
from dispo.sdk import AsyncClient, Client, DispoError, cell
from dispo.tools.bench import ceiling, group_commits, load, machine, waiting
from dispo.tools.bench.report import (
    CLIENT,
    LoadFacts,
    build_report,
    render,
    result_name,
    table_row,
)
from dispo.tools.bench.shapes import SHAPES, Shape, catalogue_yaml
from dispo.tools.bench.worker import DEFAULT_CONCURRENCY, worker_processes
from dispo.tools.cli._common import progress_bar
from dispo.tools.stack.state import live_processes, metrics_addresses, read_state

if TYPE_CHECKING:
    from dispo.tools.stack.stack import Stack

DEFAULT_SERVICES = ("gateway", "executor", "reconciler")
# The Submit rate limit of the bench's own stack, per business (and its burst): far above any
# offered load, so the bench measures the stack, limit check included, never the limit.
BENCH_SUBMIT_RATE = 1_000_000


@dataclass
class Target:
    """Where the load goes: gateway addresses, and what the bench may measure there."""

    gateways: list[str]
    pids: dict[str, int]
    database_url: str | None
    # The token the load sends (empty: DISPO_TOKEN, as the SDK reads it).
    token: str = ""
    # Where each service process serves its metrics, by name (the group commits are read
    # there; empty: not read).
    metrics: dict[str, str] = field(default_factory=dict)
    # The demo downstream the HTTP shapes call ("": none of the bench's own).
    downstream_url: str = ""


@dataclass
class OwnStack:
    """A stack a bench started for itself: the stack (its processes, their supervisors),
    every service's address, the gateways and the demo downstream's URL."""

    stack: Stack
    addresses: dict[str, str]
    gateways: list[str]
    downstream_url: str

    @property
    def token(self) -> str:
        """The stack's admin token, which the load sends."""
        assert self.stack.credentials is not None, "the stack has not started"
        return self.stack.credentials.admin.secret


@contextlib.asynccontextmanager
async def start_stack(
    services: tuple[str, ...],
    *,
    downstream: bool,
    gateways: int = 1,
    executors: int = 1,
    nats_nodes: int = 1,
    catalogue: Callable[[str], str] = catalogue_yaml,
    extra_env: Mapping[str, str] | None = None,
    folder: Path | None = None,
) -> AsyncIterator[OwnStack]:
    """An embedded stack on free ports, with the catalogue ``catalogue(downstream_url)`` and
    (``downstream``) the demo downstream; stopped on exit. It keeps its data and logs in
    ``folder``, kept afterwards, or in a scratch folder removed afterwards."""
    from dispo.libs.process import free_port
    from dispo.tools.stack.stack import Stack, StackOptions, replica_names

    with contextlib.ExitStack() as scratch:
        root = folder or Path(
            scratch.enter_context(tempfile.TemporaryDirectory(prefix="dispo-bench-"))
        )
        root.mkdir(parents=True, exist_ok=True)
        demo_port = free_port()
        downstream_url = f"http://127.0.0.1:{demo_port}"
        catalogue_path = root / "catalogue.yaml"
        catalogue_path.write_text(catalogue(downstream_url))
        options = StackOptions(
            data_dir=root,
            nats_port=free_port(),
            ports={name: free_port() for name in services},
            metrics_ports={name: free_port() for name in services},
            services=services,
            demo_port=demo_port if downstream else 0,
            extra_env={
                "DISPO_LOG_LEVEL": os.environ.get("DISPO_LOG_LEVEL", "WARNING"),
                "DISPO_CATALOGUE": str(catalogue_path),
                "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": str(BENCH_SUBMIT_RATE),
                "DISPO_GATEWAY_SUBMIT_BURST": str(BENCH_SUBMIT_RATE),
                **(extra_env or {}),
            },
            replicas={"gateway": gateways, "executor": executors},
            nats_nodes=nats_nodes,
        )
        stack = Stack(options)
        try:
            addresses = await stack.start()
            yield OwnStack(
                stack,
                addresses,
                [addresses[name] for name in replica_names("gateway", gateways)],
                downstream_url,
            )
        finally:
            await stack.stop()


@contextlib.asynccontextmanager
async def own_stack(args: argparse.Namespace, shape: Shape) -> AsyncIterator[Target]:
    services = ("gateway",) if args.submit_only else tuple(args.services.split(","))
    async with (
        start_stack(
            services,
            downstream=shape.http,
            gateways=args.gateways,
            executors=args.executors,
            nats_nodes=3 if args.cluster else 1,
            folder=Path(args.keep) if args.keep else None,
            catalogue=partial(
                catalogue_yaml,
                concurrency=args.downstream_concurrency,
                rate=args.downstream_rate,
            ),
        ) as own,
        worker_processes(
            args.workers if shape.worker and "executor" in own.addresses else 0,
            own.addresses.get("executor", ""),
            own.token,
            own.stack.options.data_dir,
            args.worker_concurrency,
        ) as workers,
    ):
        assert own.stack.postgres is not None
        yield Target(
            own.gateways,
            {**own.stack.pids(), **workers},
            own.stack.postgres.url,
            own.token,
            own.stack.metrics_addresses(),
            own.downstream_url if shape.http else "",
        )


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _config(args: argparse.Namespace, shape: Shape, cell_name: str) -> dict[str, Any]:
    return {
        "shape": shape.name,
        "cell": cell_name,
        "nodes_per_task": shape.nodes,
        "mode": "rate" if args.rate else "saturation",
        "tasks": args.tasks,
        "concurrency": None if args.rate or args.threads else args.concurrency,
        # Threads sharing the blocking client (instead of coroutines), or None.
        "threads": args.threads or None,
        # Tasks per call: 1 = Submit, more = SubmitMany (latency figures are then per call).
        "batch": args.batch,
        # One task per submit(), gathered by the SDK into SubmitEach calls (not --unary).
        "gather": args.batch == 1 and not args.unary,
        "rate": args.rate,
        "gateways": args.gateways if args.start else len(args.address.split(",")),
        "executors": (0 if args.submit_only else args.executors) if args.start else None,
        # The bench's worker processes and the runs each handles at once (--shape worker).
        "workers": args.workers if shape.worker and args.start else None,
        "worker_concurrency": args.worker_concurrency if shape.worker and args.start else None,
        "nats_nodes": (3 if args.cluster else 1) if args.start else None,
        "services": ("gateway" if args.submit_only else args.services) if args.start else None,
        "submit_only": args.submit_only,
        "submit_rate_limit": f"{BENCH_SUBMIT_RATE}/s" if args.start else "the stack's",
        # The bench downstream's limits (HTTP shapes, --start), across every executor.
        "downstream_limits": (
            f"{args.downstream_concurrency} at once"
            + (f", {args.downstream_rate}/s" if args.downstream_rate else "")
            + (f", answers in {args.downstream_delay_ms} ms" if args.downstream_delay_ms else "")
            if shape.http and args.start
            else None
        ),
        "stack": "embedded" if args.start else "running",
        "commit": git_commit(),
    }


async def measure(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    cell_name = args.cell or shape.cell
    stamp = datetime.now(UTC)
    business = f"{args.business}-{stamp:%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
    clients = [
        AsyncClient(address, token=target.token or None, gather=not args.unary)
        for address in target.gateways
    ]
    try:
        if target.downstream_url and args.downstream_delay_ms:
            await downstream_control(target.downstream_url, delay_ms=args.downstream_delay_ms)
        # Warm-up: a few tasks through every gateway, finished before measuring.
        warm = load.Submitter(clients, f"{business}-warmup", lambda: [cell(cell_name)])
        warmed = await load.saturate(warm, 4 * len(clients), len(clients))
        if shape.wait:  # its tasks end only once signalled
            await waiting.signal_all(clients, [s.task_id for s in warmed.accepted])
        await load.outcomes(clients[0], warm.business, timeout=0 if args.submit_only else 120)
        ceiling_figures = None
        if args.ceiling_seconds > 0 and target.database_url:
            ceiling_figures = await asyncio.to_thread(
                ceiling.commit_ceiling, target.database_url, (1, 32), args.ceiling_seconds
            )

        def cpu() -> dict[str, float]:
            return {**machine.tree_cpu_seconds(target.pids), CLIENT: machine.self_cpu_seconds()}

        baseline = waiting.sample(waiting.executor_pids(target.pids))
        wal_before = await wal_position(target.database_url)
        groups_before = await group_commits.read(target.metrics)
        cpu_before, busy_before = cpu(), machine.busy_cpu_seconds()
        wall_before = time.monotonic()
        with progress_bar(args.tasks, "submitting") as answered:
            submitter = load.Submitter(
                clients, business, lambda: [cell(cell_name)], answered=answered
            )
            if args.rate:
                facts = await load.offer(submitter, args.tasks, args.rate)
            elif args.threads:
                facts = await blocking_load(args, target, submitter)
            else:
                facts = await load.saturate(submitter, args.tasks, args.concurrency, args.batch)
        parked = None
        if shape.wait:  # every task parked, the executor read while they wait, then signalled
            parked = await waiting.waiting_phase(
                clients,
                business,
                [s.task_id for s in facts.accepted],
                target.pids,
                baseline,
                args.wait_seconds,
                args.timeout,
            )
            print(waiting.waiting_text(parked), file=sys.stderr)
        # Submit-only: the tasks as they are once every Submit is answered, no waiting.
        wait = 0 if args.submit_only else args.timeout
        outcomes = await load.outcomes(clients[0], business, timeout=wait)
        cpu_after, busy_after = cpu(), machine.busy_cpu_seconds()
        wall = time.monotonic() - wall_before
        groups_after = await group_commits.read(target.metrics)
        wal_after = await wal_position(target.database_url)
        events = None
        if not args.submit_only:
            events = await status_events(clients[0], [s.task_id for s in facts.accepted])
    finally:
        for client in clients:
            await client.close()
    report = build_report(
        created=stamp.isoformat(timespec="seconds"),
        machine=machine.describe(),
        config=_config(args, shape, cell_name),
        nodes_per_task=shape.nodes,
        load=facts,
        outcomes=outcomes,
        cpu_before=cpu_before,
        cpu_after=cpu_after,
        machine_busy=(busy_after - busy_before, wall),
        ceiling=ceiling_figures,
        status_events=events,
        wal_bytes=wal_after - wal_before
        if wal_before is not None and wal_after is not None
        else None,
        group_commits=group_commits.between(groups_before, groups_after)
        if target.metrics
        else None,
    )
    if parked is not None:
        report["waiting"] = parked
    if target.downstream_url:
        report["downstream"] = await downstream_seen(target.downstream_url)
    return report


async def downstream_control(url: str, **switches: Any) -> None:
    """Set the demo downstream's switches (``delay_ms``: each call answered that late)."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(f"{url}/control", json=switches)).raise_for_status()


async def downstream_seen(url: str) -> dict[str, int] | None:
    """What the demo downstream saw: the most calls at once and in one second (its limits
    hold across every executor, ADR-0108); None when it cannot be read."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30) as http:
            seen = (await http.get(f"{url}/calls")).json()
    except (httpx.HTTPError, ValueError) as error:
        print(f"downstream not read: {error!r}", file=sys.stderr)
        return None
    return {"most_at_once": seen["most_at_once"], "busiest_second": seen["busiest_second"]}


async def blocking_load(
    args: argparse.Namespace, target: Target, submitter: load.Submitter
) -> LoadFacts:
    """``--threads``: the run's tasks from that many threads sharing the blocking client
    of each gateway (gathered, unless ``--unary``), keyed and recorded by ``submitter``."""
    clients = [
        Client(address, token=target.token or None, gather=not args.unary)
        for address in target.gateways
    ]
    try:
        return await asyncio.to_thread(
            load.saturate_threads, submitter, clients, args.tasks, args.threads
        )
    finally:
        for client in clients:
            client.close()


async def wal_position(database_url: str | None) -> int | None:
    """PostgreSQL's current write-ahead log position in bytes (the WAL written between two
    readings is their difference); None without a database to ask, or when it cannot be
    read (said on stderr)."""
    if not database_url:
        return None
    position = await _value(
        database_url, "WAL not measured", "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
    )
    return None if position is None else int(position)


# Tasks whose histories the bench reads back to count their status events.
STATUS_EVENTS_SAMPLE = 100


async def status_events(client: AsyncClient, task_ids: list[str]) -> tuple[int, int] | None:
    """The status snapshots in the histories (ListTaskEvents) of up to
    :data:`STATUS_EVENTS_SAMPLE` of these tasks, spread evenly over the run, and how many
    tasks were read; None when a history cannot be read (said on stderr). A read the
    gateway answers UNAVAILABLE (the stream in a leader election, say) is tried again."""
    sample = task_ids[:: max(1, len(task_ids) // STATUS_EVENTS_SAMPLE)][:STATUS_EVENTS_SAMPLE]
    events = 0
    try:
        for task_id in sample:
            events += len(await load.retrying(partial(client.events, task_id)))
    except DispoError as error:
        print(f"status events not counted: {error}", file=sys.stderr)
        return None
    return events, len(sample)


async def _value(database_url: str, failing: str, sql: str, *args: Any) -> Any:
    """The one value ``sql`` reads from the stack's database; None when it cannot be read,
    said on stderr after ``failing``."""
    try:
        conn = await asyncpg.connect(asyncpg_url(database_url))
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()
    except (OSError, asyncpg.PostgresError) as error:
        print(f"{failing}: {error!r}", file=sys.stderr)
        return None


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    if args.start:
        async with own_stack(args, shape) as target:
            return await measure(args, target)
    if shape.name != "noop" and not args.cell:
        raise SystemExit(
            f"--shape {shape.name} needs --start (its cells are in the bench catalogue)"
        )
    gateways = args.address.split(",")
    pids, metrics = running_stack(gateways, Path(CommonSettings().data_dir))
    return await measure(args, Target(gateways, pids, args.database_url, metrics=metrics))


def running_stack(gateways: Sequence[str], data_dir: Path) -> tuple[dict[str, int], dict[str, str]]:
    """The processes of the stack ``dispo up`` runs in ``data_dir`` and where its services
    serve their metrics, when the load goes to one of its services: the bench then reports
    their CPU and group commits as for a stack of its own. Nothing for a stack elsewhere."""
    state = read_state(data_dir)
    if state is None or not {i.get("address") for i in state["services"].values()} & {*gateways}:
        return {}, {}
    pids = live_processes(state)
    metrics = {n: url for n, url in metrics_addresses(state).items() if n in pids}
    return pids, metrics


def write_result(report: dict[str, Any], folder: Path, name: str | None = None) -> Path:
    """``report`` as JSON in ``folder``, named ``name`` (default: the submit bench's name)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or result_name(report))
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dispo bench submit", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--start", action="store_true", help="run on an embedded stack of its own")
    p.add_argument(
        "--address",
        default="127.0.0.1:50051",
        help="gateway address(es) of a running stack, comma-separated (without --start)",
    )
    p.add_argument("--database-url", help="PostgreSQL of a running stack, for the commit ceiling")
    p.add_argument("--shape", choices=sorted(SHAPES), default="noop", help="the workload")
    p.add_argument("--cell", default="", help="submit this cell instead of the shape's")
    p.add_argument("--tasks", type=int, default=1000, help="tasks to submit")
    p.add_argument(
        "--wait-seconds",
        type=float,
        default=10.0,
        help="the wait shape: seconds the executor is read while every task waits",
    )
    p.add_argument(
        "--concurrency", type=int, default=32, help="Submits in flight (saturation mode)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="tasks per call: 1 = Submit, N > 1 = SubmitMany of N (concurrency counts calls;"
        " saturation mode only)",
    )
    p.add_argument(
        "--unary",
        action="store_true",
        help="one Submit call per task, as a client without the SDK sends them (default: the"
        " SDK's submit(), which gathers the submits in flight into SubmitEach calls)",
    )
    p.add_argument(
        "--rate", type=float, help="offered Submits per second, open loop (instead of saturation)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="submit from this many threads sharing the blocking Client, each sending its next"
        " task once the last is answered (instead of --concurrency coroutines; saturation mode)",
    )
    p.add_argument("--gateways", type=int, default=1, help="gateway processes (with --start)")
    p.add_argument("--executors", type=int, default=1, help="executor processes (with --start)")
    p.add_argument(
        "--downstream-concurrency",
        type=int,
        default=256,
        help="the bench downstream's max_concurrency, across every executor (HTTP shapes)",
    )
    p.add_argument(
        "--downstream-rate",
        type=int,
        default=0,
        help="the bench downstream's max_calls_per_second, across every executor (0: none)",
    )
    p.add_argument(
        "--downstream-delay-ms",
        type=int,
        default=0,
        help="the demo downstream answers each call this late (HTTP shapes, --start): calls"
        " overlap there, so its record of the most at once says something",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes serving the worker shape's queue (with --start)",
    )
    p.add_argument(
        "--worker-concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="runs each worker process handles at once (with --start)",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="a three-node NATS JetStream cluster, streams with 3 replicas (with --start)",
    )
    p.add_argument(
        "--services",
        default=",".join(DEFAULT_SERVICES),
        help="services the own stack runs (with --start)",
    )
    p.add_argument(
        "--ceiling-seconds",
        type=float,
        default=3.0,
        help="pgbench seconds per client count (0: skip the commit ceiling)",
    )
    p.add_argument(
        "--keep",
        default="",
        metavar="FOLDER",
        help="keep the own stack's data and logs in FOLDER, e.g. to size its logs per task"
        " (with --start; default: a scratch folder removed afterwards)",
    )
    p.add_argument(
        "--submit-only",
        action="store_true",
        help="measure durable acceptance alone: no executor (with --start), no wait for results",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="longest wait for terminal tasks")
    p.add_argument("--business", default="bench", help="business prefix of the submitted tasks")
    p.add_argument(
        "--results", default="bench-results", help="folder for the JSON result ('' for none)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    if args.batch < 1 or (args.batch > 1 and args.rate):
        p.error("--batch must be at least 1, and above 1 only in saturation mode (no --rate)")
    if args.unary and args.batch > 1:
        p.error("--unary sends one Submit per task; --batch sends SubmitMany calls: not both")
    if args.workers < 1 or args.worker_concurrency < 1:
        p.error("--workers and --worker-concurrency must be at least 1")
    if args.threads < 0 or (args.threads and (args.rate or args.batch > 1)):
        p.error("--threads is a saturation mode of one task per submit: not with --rate or --batch")
    began = time.perf_counter()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        report = runner.run(bench(args))
    print("\n".join(render(report)))
    if args.results:
        print(f"result                   {write_result(report, Path(args.results))}")
    print(f"README row               {table_row(report)}")
    print(f"bench took               {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
