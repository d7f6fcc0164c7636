"""A worker the worker-action tests run as a real process (``dispo worker run
worker_app:worker``). Every effect is a line appended to ``WORKER_EFFECTS``: ``<queue>
<idempotency key> <attempt> <pid>``; nothing is deduplicated. ``WORKER_HOLD``: seconds a
``slow`` / ``slow_once`` run waits after its effect, on its first attempt."""

from __future__ import annotations

import asyncio
import os

from dispo.sdk import RetryableError, RunContext, Worker

worker = Worker(concurrency=int(os.environ.get("WORKER_CONCURRENCY", "10")), grace=2.0)


def effect(ctx: RunContext) -> None:
    line = f"{ctx.queue} {ctx.idempotency_key} {ctx.attempt} {os.getpid()}\n"
    fd = os.open(os.environ["WORKER_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@worker.action("tickets")
async def open_ticket(ctx: RunContext, payload: dict) -> dict:
    effect(ctx)
    return {"ticket_id": f"W-{payload['name']}", "key": ctx.idempotency_key}


@worker.action("echo")
async def echo(ctx: RunContext, payload: dict) -> dict:
    effect(ctx)
    if payload.get("name") == "retry" and ctx.attempt == 1:
        raise RetryableError("not yet")
    if payload.get("name") == "boom":
        raise ValueError("boom")
    return payload


async def slow(ctx: RunContext, payload: dict) -> dict:
    effect(ctx)
    if ctx.attempt == 1:
        await asyncio.sleep(float(os.environ.get("WORKER_HOLD", "0")))
    return {"done": payload["name"]}


worker.action("slow")(slow)
worker.action("slow_once")(slow)
