"""``dispo-pool-wake --cron <id> --pool <address>``: one wake of a cron, the command an
OpenClaw automation runs (the openclaw driver's command payload).

It follows the cron protocol through the pool's gRPC API exactly as a pool-worker loop does
(WakeCron, the runs owed against the target, RecordRun for each), prints what it did as one
JSON line and exits 0; a cron the pool removed or marked stuck exits 3, any other failure 1
(OpenClaw records the exit code in the automation's run history).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import dispo.libs  # noqa: F401  # gRPC's fork mode, before grpc is imported
import grpc
import httpx
from dispo.auth.bootstrap import read_token_file
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.settings import CommonSettings
from dispo.pool.worker.loop import GONE, serve_cron

GONE_EXIT = 3


async def wake(cron_id: str, pool_address: str, http_timeout: float, token: str) -> int:
    async with (
        open_channel(pool_address, token) as channel,
        httpx.AsyncClient(timeout=http_timeout) as http,
    ):
        return await serve_cron(pool_pb2_grpc.PoolServiceStub(channel), http, cron_id, http_timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispo-pool-wake", description=__doc__.split("\n")[0])
    parser.add_argument("--cron", required=True, help="the cron's id")
    parser.add_argument("--pool", required=True, help="the pool's gRPC address (host:port)")
    parser.add_argument(
        "--token-file",
        help="a file holding the token to call the pool with (default: DISPO_SERVICE_TOKEN)",
    )
    parser.add_argument(
        "--http-timeout",
        type=float,
        default=30.0,
        help="seconds one call to the target may take in all (a run's deadline)",
    )
    args = parser.parse_args(argv)
    try:
        token = (
            read_token_file(Path(args.token_file))
            if args.token_file
            else CommonSettings().service_token
        )
        runs = asyncio.run(wake(args.cron, args.pool, args.http_timeout, token))
    except grpc.aio.AioRpcError as error:
        print(json.dumps({"cron": args.cron, "code": error.code().name, "detail": error.details()}))
        return GONE_EXIT if error.code() in GONE else 1
    print(json.dumps({"cron": args.cron, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
