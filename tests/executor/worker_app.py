"""A worker the worker-action tests run as a real process (``dispo worker run
worker_app:worker``). Every effect is a line appended to ``WORKER_EFFECTS``: ``<queue>
<idempotency key> <attempt> <pid>``; nothing is deduplicated. ``WORKER_HOLD``: seconds a
``slow`` / ``slow_once`` run waits after its effect, on its first attempt;
``WORKER_HOLD_BEFORE``: seconds it waits before its effect, on its first attempt (each
start is a line of ``WORKER_STARTS``, when set). A ``limited`` run writes, in place of its
attempt, how many were under way in all workers as it began.

The probe of ``slow_once`` (ADR-0100) reads the effects file: an effect under the key is
"done" (its output names the pid that had it); none is "not done", fenced: the key and the
attempt asked about go to ``<WORKER_EFFECTS>.fenced``, and a run of that key up to that
attempt is refused from then on."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from dispo.sdk import ProbeAnswer, RetryableError, RunContext, Worker

worker = Worker(concurrency=int(os.environ.get("WORKER_CONCURRENCY", "10")), grace=2.0)


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def effect(ctx: RunContext, attempt: int | None = None) -> None:
    append(
        os.environ["WORKER_EFFECTS"],
        f"{ctx.queue} {ctx.idempotency_key} {attempt or ctx.attempt} {os.getpid()}\n",
    )


def lines(path: str) -> list[list[str]]:
    return (
        [line.split() for line in Path(path).read_text().splitlines()]
        if Path(path).exists()
        else []
    )


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
    if starts := os.environ.get("WORKER_STARTS"):
        append(starts, f"{ctx.queue} {ctx.idempotency_key} {ctx.attempt} {os.getpid()}\n")
    if ctx.attempt == 1:
        await asyncio.sleep(float(os.environ.get("WORKER_HOLD_BEFORE", "0")))
    fenced = os.environ["WORKER_EFFECTS"] + ".fenced"
    if any(k == ctx.idempotency_key and ctx.attempt <= int(a) for k, a in lines(fenced)):
        raise ValueError(f"{ctx.idempotency_key} is fenced up to this attempt")
    effect(ctx)
    if ctx.attempt == 1:
        await asyncio.sleep(float(os.environ.get("WORKER_HOLD", "0")))
    return {"done": payload["name"]}


worker.action("slow")(slow)
worker.action("slow_once")(slow)


def running(change: int) -> int:
    """Runs of ``limited`` under way in every worker process now (a count kept in the file
    ``WORKER_RUNNING`` under an exclusive lock), after adding ``change``."""
    fd = os.open(os.environ["WORKER_RUNNING"], os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = int(os.read(fd, 32) or b"0") + change
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(now).encode())
        return now
    finally:
        os.close(fd)


@worker.action("limited")
async def limited(ctx: RunContext, payload: dict) -> dict:
    """Records, as its effect's attempt field, how many runs of the queue were under way
    across all workers when it started (its own high-water mark)."""
    seen = running(+1)
    try:
        effect(ctx, seen)
        await asyncio.sleep(0.2)
    finally:
        running(-1)
    return {}


@worker.probe("slow_once")
async def slow_once_probe(ctx: RunContext) -> ProbeAnswer:
    for _, key, _, pid in lines(os.environ["WORKER_EFFECTS"]):
        if key == ctx.idempotency_key:
            return ProbeAnswer(done=True, output={"done_by": int(pid)})
    append(os.environ["WORKER_EFFECTS"] + ".fenced", f"{ctx.idempotency_key} {ctx.attempt}\n")
    return ProbeAnswer(done=False, fenced=True)
