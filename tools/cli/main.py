"""``dispo``: run the stack, submit work and operate it (docs/cli.md lists every command).

dispo up [--detach] [--tls] | down | status  the stack on this machine
dispo submit FILE|- [--wait]                  a task from JSON or YAML
dispo tasks list|count|show|watch|cancel      the gateway's tasks
dispo failed list|show|resume|abandon|resolve the reconciler's failed, parked and uncertain work
dispo downstreams list|pause|resume           downstream health and pauses
dispo businesses list|pause|resume            fair-share weights, paused businesses
dispo pool status|queue|evaluations|boost|bounds   the cron pool
dispo jobs list|show|trigger                  intelligence analysis and comparison jobs
dispo quarantine list|show|replay|discard     messages a service's consumers set aside
dispo retention show                          finished tasks past their retention (a dry run)
dispo tokens create|list|revoke|rotate-secret|finish-rotation|secrets   API tokens (admin)
dispo worker run module:attribute             a worker serving worker actions' queues
dispo bench submit|pool|faults|purge|fairness|scale|soak [options]   benchmarks

Every command that calls the stack takes ``--json`` (a test checks); the exit codes are in
:mod:`dispo.tools.cli._common`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Annotated

import typer
from dispo.libs.health import UNREACHABLE as NOT_ANSWERING
from dispo.libs.health import health_status, http_health_status
from dispo.libs.settings import DEFAULT_CONSOLE_PORT
from dispo.tools.cli import catalogue, operate, retention, schedules, tasks, tokens, workers
from dispo.tools.cli._common import (
    ENDED_BADLY,
    OK,
    UNREACHABLE,
    Target,
    data_dir,
    out,
    service_addresses,
)
from dispo.tools.cli.lifecycle import (
    DOWN_TIMEOUT_SECONDS,
    banner,
    describe_running,
    detach,
    down,
)
from dispo.tools.stack.ownership import StackRunning
from dispo.tools.stack.state import CONSOLE, SERVICES, caller_tls, read_state, service_metrics

if TYPE_CHECKING:
    from dispo.tools.stack.stack import Stack

app = typer.Typer(
    name="dispo",
    help="Dispo: durable execution platform. Exit codes: 0 ok, 1 the task ended failed or"
    " cancelled, 2 usage, 3 unreachable, 4 refused.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class PoolDriver(StrEnum):
    local = "local"
    openclaw = "openclaw"


# The command line as given (``dispo up --detach`` starts ``dispo up`` with the rest of it).
_ARGV: list[str] = []


def _version(value: bool) -> None:
    if value:
        try:
            print(f"dispo {version('dispo')}")
        except PackageNotFoundError:
            print("dispo (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    data_dir_: Annotated[
        str | None,
        typer.Option(
            "--data-dir", help="stack folder (default: $DISPO_DATA_DIR or ./.dispo)", metavar="DIR"
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="the API token calls carry (default: $DISPO_TOKEN, else the admin token"
            " dispo up wrote in the data folder)"
        ),
    ] = None,
    _show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    ctx.obj = Target(data_dir(data_dir_), token)


@app.command()
def up(
    ctx: typer.Context,
    database_url: Annotated[
        str | None, typer.Option(help="use this PostgreSQL instead of the embedded one")
    ] = None,
    nats_url: Annotated[
        str | None,
        typer.Option(help="use these NATS servers (comma-separated) instead of the embedded one"),
    ] = None,
    nats_port: Annotated[int, typer.Option(help="port of the embedded nats-server")] = 4222,
    services: Annotated[
        str | None, typer.Option(help=f"comma-separated subset of {','.join(SERVICES)}")
    ] = None,
    demo_port: Annotated[
        int,
        typer.Option(
            help="port of the demo downstream the example catalogue calls (0: don't start it)"
        ),
    ] = 8181,
    console_port: Annotated[
        int,
        typer.Option(
            envvar="DISPO_CONSOLE_PORT",
            help="port of the web console, started with the gateway (0: don't start it)",
        ),
    ] = DEFAULT_CONSOLE_PORT,
    pool_driver: Annotated[
        PoolDriver,
        typer.Option(
            help="where the pool's crons run: the pool-worker (local) or an OpenClaw gateway"
            " (started by the stack unless --openclaw-url names one)",
        ),
    ] = PoolDriver.local,
    openclaw_url: Annotated[
        str | None, typer.Option(help="attach to this OpenClaw gateway (ws://...)")
    ] = None,
    openclaw_token: Annotated[str | None, typer.Option(help="the OpenClaw gateway's token")] = None,
    openclaw_port: Annotated[
        int, typer.Option(help="port of the gateway the stack starts")
    ] = 18789,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="serve and call over TLS only, with a local CA and certificates made in the"
            " data folder (tls/) and kept; mTLS when DISPO_TLS_CLIENT_AUTH=true",
        ),
    ] = False,
    executors: Annotated[
        int,
        typer.Option(
            min=1,
            help="executor processes: they share the task.create work, each on one core at"
            " most (one Python thread), so a machine with cores to spare runs more",
        ),
    ] = 1,
    detach_: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="run in the background (output in logs/up.log); `dispo down` stops it",
        ),
    ] = False,
) -> None:
    """Start PostgreSQL, NATS and the services; Ctrl-C stops all."""
    _log_to_console()
    # Only here: what starts a stack (the database layer, the bus, the services' processes)
    # is none of the business of the commands that call one.
    from dispo.tools.stack.stack import Stack, StackOptions

    options = StackOptions(
        data_dir=ctx.obj.data_dir,
        database_url=database_url or os.environ.get("DISPO_DATABASE_URL"),
        nats_url=nats_url or os.environ.get("DISPO_NATS_URL"),
        nats_port=nats_port,
        services=tuple(services.split(",")) if services else SERVICES,
        demo_port=demo_port,
        console_port=console_port,
        pool_driver=pool_driver.value,
        openclaw_url=openclaw_url,
        openclaw_token=openclaw_token,
        openclaw_port=openclaw_port,
        tls=tls,
        replicas={"executor": executors},
    )
    if detach_:
        raise typer.Exit(detach(options, [a for a in _ARGV if a != "--detach"]))
    raise typer.Exit(asyncio.run(_up(Stack(options, progress=_progress))))


def _progress(line: str) -> None:
    """What a slow step of the start is doing (installing OpenClaw, say), as it happens."""
    print(line, flush=True)


async def _up(stack: Stack) -> int:
    from dispo.libs.process import ExitedBeforeReady  # with the stack: logs, processes

    options = stack.options
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        stale = await asyncio.to_thread(stack.claim)
    except StackRunning as running:
        print(describe_running(running), file=sys.stderr)
        return 1
    if stale is not None:
        print("cleaned up after a dispo up that did not stop", end="")
        stopped = [f"{p.name} (pid {p.pid})" for p in stale]
        print(f"; stopped {', '.join(stopped)}" if stopped else "", flush=True)
    try:
        try:
            addresses = await stack.start()
        except ExitedBeforeReady as error:  # what it printed says why, e.g. a port taken
            print(f"the stack did not start: {error}", file=sys.stderr, flush=True)
            return 1
        print("\n".join(banner(options, addresses, stack.metrics_addresses())))
        print("Ctrl-C stops everything.", flush=True)
        watcher = asyncio.create_task(stack.watch())
        await stop.wait()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    finally:
        print("stopping…", flush=True)
        failed = await stack.stop()
    if failed:
        print(f"stopped, but these did not stop cleanly: {', '.join(failed)}", flush=True)
        return 1
    print("stopped", flush=True)
    return 0


@app.command(name="down")
def down_(
    ctx: typer.Context,
    timeout: Annotated[
        float, typer.Option(help="seconds to let it stop in order before killing it")
    ] = DOWN_TIMEOUT_SECONDS,
) -> None:
    """Stop the stack running in the data folder."""
    raise typer.Exit(down(ctx.obj.data_dir, timeout))


@app.command()
def status(
    ctx: typer.Context,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object keyed by service")
    ] = False,
) -> None:
    """Health and address of each service (exit 3 when one does not answer, 1 when one
    answers but is not serving)."""
    addresses = service_addresses(ctx.obj.data_dir)
    tls = caller_tls(ctx.obj.data_dir)
    metrics = service_metrics(ctx.obj.data_dir)

    console = (read_state(ctx.obj.data_dir) or {}).get("console")

    async def probe() -> dict[str, dict[str, str]]:
        statuses = await asyncio.gather(*(health_status(a, tls=tls) for a in addresses.values()))
        report = {
            name: {"address": address, "status": status, "metrics": metrics.get(name, "")}
            for (name, address), status in zip(addresses.items(), statuses, strict=True)
        }
        if console:  # the stack runs one: its HTTP health
            report[CONSOLE] = {
                "address": console,
                "status": await http_health_status(f"{console}/healthz"),
                "metrics": "",
            }
        return report

    report = asyncio.run(probe())
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for name, info in report.items():
            line = f"{name:<13} {info['address']:<22} {info['status']:<13} {info['metrics']}"
            out.print(line.rstrip(), highlight=False)
    found = {info["status"] for info in report.values()}
    raise typer.Exit(
        OK if found <= {"SERVING"} else UNREACHABLE if NOT_ANSWERING in found else ENDED_BADLY
    )


BENCHMARKS = {
    "submit": "dispo.tools.bench.run",  # tasks through the pipeline: throughput, latency, CPU, ceiling
    "pool": "dispo.tools.bench.pool",  # cron claims and run recordings under contention
    "faults": "dispo.tools.bench.faults",  # the fault campaign: lost, stuck, duplicate effects
    "purge": "dispo.tools.bench.purge",  # the submit bench beside a retention purge
    "scale": "dispo.tools.bench.scale",  # the hot paths on empty and on loaded tables
    "soak": "dispo.tools.bench.soak",  # a steady rate for days of a jumping clock: disk sampled
    "fairness": "dispo.tools.bench.fairness",  # a flooding and a trickling business (ADR-0109)
}


Benchmark = StrEnum("Benchmark", {name: name for name in BENCHMARKS})  # type: ignore[misc]


@app.command(
    # Everything after the benchmark's name is its own (``dispo bench submit --help`` is the
    # benchmark's help); ``dispo bench --help`` is this command's.
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
    },
)
def bench(
    ctx: typer.Context,
    benchmark: Annotated[
        Benchmark,
        typer.Argument(
            help="submit, pool, faults, purge, fairness, scale or soak; its own options follow (--help lists them)"
        ),
    ],
) -> None:
    """Run a benchmark and print throughput and latency percentiles."""
    import importlib

    _log_to_console()
    module = importlib.import_module(BENCHMARKS[benchmark.value])
    # The stack folder ``--data-dir`` names, where a benchmark finds a running stack.
    os.environ["DISPO_DATA_DIR"] = str(ctx.obj.data_dir)
    sys.argv = [f"dispo bench {benchmark.value}", *ctx.args]
    module.main()


app.add_typer(tasks.tasks_app, name="tasks")
app.command(name="submit")(tasks.submit)
app.add_typer(operate.failed_app, name="failed")
app.add_typer(operate.downstreams_app, name="downstreams")
app.add_typer(operate.businesses_app, name="businesses")
app.command(name="queues")(operate.queues)
app.add_typer(operate.pool_app, name="pool")
app.add_typer(operate.jobs_app, name="jobs")
app.add_typer(operate.quarantine_app, name="quarantine")
app.add_typer(retention.retention_app, name="retention")
app.add_typer(tokens.tokens_app, name="tokens")
app.add_typer(schedules.schedules_app, name="schedules")
app.add_typer(catalogue.catalogue_app, name="catalogue")
app.add_typer(workers.worker_app, name="worker")


def _log_to_console() -> None:
    """Log lines of what a command runs in this process (the stack, a benchmark), readable,
    at ``DISPO_LOG_LEVEL``. Only the commands that run something log: the ones that call a
    stack print their replies and do not import the logging set-up."""
    from dispo.libs.logging import configure_logging

    configure_logging("console", os.environ.get("DISPO_LOG_LEVEL", "WARNING"))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _ARGV[:] = argv
    app(args=argv, prog_name="dispo")
