"""The ``wait`` shape's phase between its submits and its outcomes (ADR-0102): every task
parked on its wait node, the executor's memory and CPU read while they all wait (and
before the run, to compare), then every task signalled, each once.

    figures = await waiting_phase(clients, business, task_ids, pids, seconds=10)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dispo.sdk import AsyncClient
from dispo.tools.bench import machine

# The signal the ``wait`` shape's wait node waits for, and the payload the bench sends.
SIGNAL = "go"
PAYLOAD = {"ok": True}
# Signals in flight at once.
SIGNAL_CONCURRENCY = 64


def rss_bytes(pid: int) -> int:
    """The resident memory of a process and its descendants, in bytes (0: gone)."""
    total = 0
    for one in _tree(pid):
        try:
            status = (Path("/proc") / str(one) / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (times := machine.process_times(int(entry.name))):
            children.setdefault(times[0], []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def executor_pids(pids: Mapping[str, int]) -> dict[str, int]:
    """The executor processes among a stack's (named ``executor``, ``executor-2`` ...)."""
    return {name: pid for name, pid in pids.items() if name.startswith("executor")}


def sample(pids: Mapping[str, int]) -> dict[str, Any]:
    """The executors' resident memory now (MiB)."""
    return {"rss_mib": round(sum(rss_bytes(p) for p in pids.values()) / 2**20, 1)}


async def all_waiting(client: AsyncClient, business: str, count: int, timeout: float) -> float:
    """Until the business's ``count`` tasks are all RUNNING (each parked on its wait node);
    the seconds it took."""
    started = time.monotonic()
    while True:
        counts = await client.count(business=business)
        if counts.get("RUNNING", 0) >= count:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{counts.get('RUNNING', 0)} of {count} tasks waiting")
        await asyncio.sleep(0.5)


async def signal_all(clients: Sequence[AsyncClient], task_ids: Sequence[str]) -> float:
    """Every task signalled once (its signal id the bench's); the seconds it took."""
    started = time.monotonic()
    gate = asyncio.Semaphore(SIGNAL_CONCURRENCY)

    async def one(i: int, task_id: str) -> None:
        async with gate:
            await clients[i % len(clients)].signal(
                task_id, SIGNAL, PAYLOAD, signal_id=f"bench-{task_id}"
            )

    await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids)))
    return time.monotonic() - started


async def waiting_phase(
    clients: Sequence[AsyncClient],
    business: str,
    task_ids: Sequence[str],
    pids: Mapping[str, int],
    baseline: Mapping[str, Any],
    seconds: float,
    timeout: float,
) -> dict[str, Any]:
    """Wait for every task to park, read the executors' memory and CPU over ``seconds``
    while they all wait, then signal every one. ``baseline``: :func:`sample` before the run."""
    executors = executor_pids(pids)
    parked = await all_waiting(clients[0], business, len(task_ids), timeout)
    cpu_before = machine.tree_cpu_seconds(executors)
    wall_before = time.monotonic()
    await asyncio.sleep(seconds)
    cpu_after = machine.tree_cpu_seconds(executors)
    wall = time.monotonic() - wall_before
    used = sum(cpu_after.values()) - sum(cpu_before.values())
    waiting = sample(executors)
    signalled = await signal_all(clients, task_ids)
    return {
        "tasks": len(task_ids),
        "parked_seconds": round(parked, 1),
        "executor_rss_mib_before": baseline.get("rss_mib"),
        "executor_rss_mib_waiting": waiting["rss_mib"],
        "executor_cpu_percent_waiting": round(100 * used / wall, 1) if wall else None,
        "sampled_seconds": round(wall, 1),
        "signalled_seconds": round(signalled, 1),
    }


def waiting_text(figures: Mapping[str, Any]) -> str:
    """The phase's line of the report."""
    return (
        f"{figures['tasks']} tasks waiting at once (parked in {figures['parked_seconds']} s):"
        f" executor RSS {figures['executor_rss_mib_before']} MiB before the run,"
        f" {figures['executor_rss_mib_waiting']} MiB while they wait; executor CPU"
        f" {figures['executor_cpu_percent_waiting']}% of a core over"
        f" {figures['sampled_seconds']} s of waiting; all signalled in"
        f" {figures['signalled_seconds']} s"
    )
