"""``dispo``: run the stack and look at it.

dispo up [--data-dir .dispo]        start PostgreSQL, NATS and the five services
dispo up --detach                   the same in the background
dispo up --pool-driver openclaw     the pool's crons as automations of an OpenClaw gateway
dispo up --tls                      every server and channel over TLS, with a local CA
dispo down                          stop a stack running in the background (or elsewhere)
dispo status [--json]               health and address of each service
dispo tokens create|list|revoke     API tokens and webhook signing secrets (admin): see
                                    dispo.libs.cli.tokens
dispo bench submit|pool [options]   benchmarks: throughput and latency percentiles
dispo bench faults [options]        the fault campaign: what a crash loses, leaves or repeats
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from dispo.libs.auth import caller_token
from dispo.libs.cli import tokens
from dispo.libs.cli.lifecycle import (
    DOWN_TIMEOUT_SECONDS,
    banner,
    describe_running,
    detach,
    down,
)
from dispo.libs.health import health_status
from dispo.libs.logging import configure_logging
from dispo.libs.settings import CommonSettings, server_settings
from dispo.libs.stack.ownership import StackRunning
from dispo.libs.stack.stack import SERVICES, Stack, StackOptions, caller_tls, read_state


def _data_dir(value: str | None) -> Path:
    return Path(value or CommonSettings().data_dir).resolve()


def cmd_up(args: argparse.Namespace) -> int:
    options = StackOptions(
        data_dir=_data_dir(args.data_dir),
        database_url=args.database_url or os.environ.get("DISPO_DATABASE_URL"),
        nats_url=args.nats_url or os.environ.get("DISPO_NATS_URL"),
        nats_port=args.nats_port,
        services=tuple(args.services.split(",")) if args.services else SERVICES,
        demo_port=args.demo_port,
        pool_driver=args.pool_driver,
        openclaw_url=args.openclaw_url,
        openclaw_token=args.openclaw_token,
        openclaw_port=args.openclaw_port,
        tls=args.tls,
    )
    if args.detach:
        return detach(options, [a for a in args.argv if a != "--detach"])
    return asyncio.run(_up(options))


async def _up(options: StackOptions) -> int:
    stack = Stack(options)
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
        addresses = await stack.start()
        print("\n".join(banner(options, addresses)))
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


def cmd_down(args: argparse.Namespace) -> int:
    return down(_data_dir(args.data_dir), args.timeout)


def service_addresses(data_dir: Path) -> dict[str, str]:
    """From the running stack's state file, else from DISPO_<SERVICE>_HOST/PORT settings."""
    state = read_state(data_dir)
    if state:
        return {name: info["address"] for name, info in state["services"].items()}
    return {name: server_settings(name).address for name in SERVICES}


def cmd_status(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args.data_dir)
    addresses = service_addresses(data_dir)
    tls = caller_tls(data_dir)

    async def probe() -> dict[str, dict[str, str]]:
        statuses = await asyncio.gather(*(health_status(a, tls=tls) for a in addresses.values()))
        return {
            name: {"address": address, "status": status}
            for (name, address), status in zip(addresses.items(), statuses, strict=True)
        }

    report = asyncio.run(probe())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, info in report.items():
            print(f"{name:<13} {info['address']:<22} {info['status']}")
    return 0 if all(info["status"] == "SERVING" for info in report.values()) else 1


def cmd_tokens(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args.data_dir)
    gateway = args.gateway or service_addresses(data_dir)["gateway"]
    token = caller_token(args.token, data_dir)
    if not token:
        print(
            "no token: pass --token, set DISPO_TOKEN, or run dispo up (it writes an admin token"
            f" to {data_dir / 'admin.token'})",
            file=sys.stderr,
        )
        return 1
    return tokens.run(args, gateway, token, caller_tls(data_dir))


BENCHMARKS = {
    "submit": "dispo.libs.bench.run",  # tasks through the pipeline: throughput, latency, CPU, ceiling
    "pool": "dispo.pool.bench",  # cron claims and run recordings under contention
    "faults": "dispo.libs.bench.faults",  # the fault campaign: lost, stuck, duplicate effects
}


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(BENCHMARKS[args.benchmark])
    sys.argv = [f"dispo bench {args.benchmark}", *args.options]
    module.main()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dispo", description="Dispo: durable execution platform")
    parser.add_argument("--data-dir", help="stack folder (default: $DISPO_DATA_DIR or ./.dispo)")
    parser.add_argument(
        "--token",
        help="the API token calls carry (default: $DISPO_TOKEN, else the admin token"
        " dispo up wrote in the data folder)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start PostgreSQL, NATS and the services; Ctrl-C stops all")
    up.add_argument("--database-url", help="use this PostgreSQL instead of the embedded one")
    up.add_argument(
        "--nats-url", help="use these NATS servers (comma-separated) instead of the embedded one"
    )
    up.add_argument("--nats-port", type=int, default=4222, help="port of the embedded nats-server")
    up.add_argument("--services", help=f"comma-separated subset of {','.join(SERVICES)}")
    up.add_argument(
        "--demo-port",
        type=int,
        default=8181,
        help="port of the demo downstream the example catalogue calls (0: don't start it)",
    )
    up.add_argument(
        "--pool-driver",
        choices=("local", "openclaw"),
        default="local",
        help="where the pool's crons run: the pool-worker (local) or an OpenClaw gateway"
        " (started by the stack unless --openclaw-url names one)",
    )
    up.add_argument("--openclaw-url", help="attach to this OpenClaw gateway (ws://...)")
    up.add_argument("--openclaw-token", help="the OpenClaw gateway's token")
    up.add_argument(
        "--openclaw-port", type=int, default=18789, help="port of the gateway the stack starts"
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="serve and call over TLS only, with a local CA and certificates made in the data"
        " folder (tls/) and kept; mTLS when DISPO_TLS_CLIENT_AUTH=true",
    )
    up.add_argument(
        "--detach",
        action="store_true",
        help="run in the background (output in logs/up.log); `dispo down` stops it",
    )
    up.set_defaults(run=cmd_up)

    down_ = sub.add_parser("down", help="stop the stack running in the data folder")
    down_.add_argument(
        "--timeout",
        type=float,
        default=DOWN_TIMEOUT_SECONDS,
        help="seconds to let it stop in order before killing it",
    )
    down_.set_defaults(run=cmd_down)

    status = sub.add_parser("status", help="health and address of each service")
    status.add_argument("--json", action="store_true", help="one JSON object keyed by service")
    status.set_defaults(run=cmd_status)

    tokens.add_parser(sub).set_defaults(run=cmd_tokens)

    bench = sub.add_parser(
        "bench", help="run a benchmark and print throughput and latency percentiles"
    )
    bench.add_argument("benchmark", choices=sorted(BENCHMARKS))
    bench.add_argument(
        "options", nargs=argparse.REMAINDER, help="passed to the benchmark (--help for its own)"
    )
    bench.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    configure_logging("console", os.environ.get("DISPO_LOG_LEVEL", "WARNING"))
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv
    sys.exit(args.run(args))
