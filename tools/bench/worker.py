"""The bench's worker: serves the queue of the ``worker`` shape, each run answered at once
with a small output, so the bench measures the platform and the SDK worker, not the work.

    dispo worker run dispo.tools.bench.worker:worker --executor 127.0.0.1:50052

``dispo bench submit --start --shape worker`` runs ``--workers N`` of them, each a process of
its own started with ``dispo worker run`` as a user starts theirs (:func:`worker_processes`),
their CPU reported beside the stack's as ``worker-1``, ``worker-2``…
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dispo.libs.process import ProcessSpec, python_module
from dispo.sdk import RunContext, Worker
from dispo.tools.bench.shapes import WORKER_QUEUE
from dispo.tools.stack.supervisor import Supervisor

# Runs one worker process handles at once (its credit), unless the bench is told otherwise.
DEFAULT_CONCURRENCY = 100

worker = Worker()


@worker.action(WORKER_QUEUE)
async def answer(ctx: RunContext, payload: Any) -> dict[str, Any]:
    """Does nothing but answer a small output."""
    return {"ok": True, "attempt": ctx.attempt}


def worker_specs(
    count: int, executor: str, token: str, data_dir: Path, concurrency: int
) -> list[ProcessSpec]:
    """``count`` processes of ``dispo worker run`` serving :data:`worker` against
    ``executor`` with ``token``, logging to ``data_dir/logs/worker-<k>.log``."""
    return [
        ProcessSpec(
            f"worker-{k}",
            [
                *python_module("dispo.tools.cli"),
                "--data-dir",
                str(data_dir),
                "worker",
                "run",
                f"{__name__}:worker",
                "--executor",
                executor,
                "--concurrency",
                str(concurrency),
                "--grace",
                "5",
            ],
            {"DISPO_TOKEN": token},
            None,
            data_dir / "logs" / f"worker-{k}.log",
            new_session=True,
        )
        for k in range(1, count + 1)
    ]


@contextlib.asynccontextmanager
async def worker_processes(
    count: int, executor: str, token: str, data_dir: Path, concurrency: int
) -> AsyncIterator[dict[str, int]]:
    """The bench's worker processes (:func:`worker_specs`), started, then stopped on exit;
    yields their pids by name (none for ``count`` 0)."""
    supervisor = Supervisor(worker_specs(count, executor, token, data_dir, concurrency))
    try:
        await supervisor.start_all()
        yield {
            name: pid for name in supervisor.children if (pid := supervisor.pid(name)) is not None
        }
    finally:
        await supervisor.stop_all([])
