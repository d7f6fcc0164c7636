"""``dispo worker``: run a worker process (docs/workers.md).

dispo worker run tickets_app:worker [--executor HOST:PORT] [--concurrency N] [--grace S]

``module:attribute`` names a :class:`dispo.sdk.Worker` in an importable module (the current
folder is on the import path). The executor is ``--executor``, else the running stack's;
the token is ``--token``, else ``DISPO_TOKEN``, else the admin token ``dispo up`` wrote.
SIGTERM or Ctrl-C stops taking runs, lets those in flight finish within the grace, then
hands back what is left.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from typing import Annotated

import typer
from dispo.sdk import Worker
from dispo.tools.cli._common import target, usage
from dispo.tools.stack.state import caller_tls

worker_app = typer.Typer(
    help="Run a worker: your own functions as the steps of worker actions.",
    no_args_is_help=True,
)


def load_worker(spec: str) -> Worker:
    """The Worker ``module:attribute`` names (a usage error otherwise)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        usage(f"{spec!r}: name the worker as module:attribute")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        usage(f"{spec!r}: cannot import {module_name}: {error}")
    found = getattr(module, attribute, None)
    if not isinstance(found, Worker):
        usage(f"{spec!r}: {attribute} is not a dispo.sdk.Worker")
    return found


@worker_app.command()
def run(
    ctx: typer.Context,
    spec: Annotated[str, typer.Argument(help="module:attribute of a dispo.sdk.Worker")],
    executor: Annotated[
        str, typer.Option(help="The executor's gRPC address (default: the running stack's)")
    ] = "",
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Runs handled at once at most (default: the worker's)")
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            min=0, help="Seconds runs in flight get to finish at SIGTERM (default: the worker's)"
        ),
    ] = None,
) -> None:
    """Serve the queues of the worker's actions until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker = load_worker(spec)
    where = target(ctx)
    worker.address = executor or where.address("executor")
    worker.token = where.token()
    if worker.tls is None:
        worker.tls = caller_tls(where.data_dir)
    if concurrency is not None:
        worker.concurrency = concurrency
    if grace is not None:
        worker.grace = grace
    asyncio.run(worker.run())
