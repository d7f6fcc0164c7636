"""``dispo bench faults``: a steady load, one fault at a time, what became of every task.

    dispo bench faults                                    # every fault, 100 tasks each at 10/s
    dispo bench faults --faults gateway,postgres --tasks-per-fault 30

It starts its own embedded stack (PostgreSQL, NATS, a gateway, two executors, the
reconciler, supervised as by ``dispo up``: whatever dies is restarted) and the demo
downstream switched to count an effect for every call that gets through (it does not
deduplicate by key). For each fault it offers three-node DAGs of the ``mixed`` shape (two
non-idempotent actions with status probes, one idempotent) at a fixed rate, sending a
Submit answered UNAVAILABLE again under its idempotency key as a careful caller would. The
fault strikes a third of the way through the load; then the campaign waits until every
task of the phase is terminal (at most the recovery window) and reads each task from the
gateway and each effect from the downstream. Between two faults the whole stack is back up
and ready.

The faults: SIGKILL of the gateway, of one of the two executors, of the reconciler and of
nats-server (each restarted by the stack's supervisor); PostgreSQL stopped immediately
(SIGQUIT to the postmaster, what ``pg_ctl stop -m immediate`` sends: no checkpoint, crash
recovery at the restart); a downstream that performs the effect and answers only after
the caller's timeout, for a few seconds; one of the two executors paused (SIGSTOP) past its
lease, then resumed (SIGCONT) — its twin takes its tasks over while it holds claimed calls;
and a downstream whose non-idempotent calls perform their effect only after the caller gave
up on them, for a few seconds (the probe's early "not done" must not be taken as final).

It prints a table per fault (:mod:`.fault_report` defines the figures), writes the result
as JSON to ``--results`` (``bench-results/``) and exits 1 when a task was lost or stuck, a
non-idempotent effect performed twice, or a retried Submit recorded a second task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
from dispo.libs.process import ExitedBeforeReady
from dispo.libs.proto_enums import node_status_name
from dispo.sdk import AsyncClient, DispoError, cell
from dispo.tools.bench import load, machine
from dispo.tools.bench.fault_report import (
    NodeFacts,
    PhaseFacts,
    TaskFacts,
    build_campaign,
    campaign_result_name,
    exit_code,
    fault_row,
    render_campaign,
    table,
)
from dispo.tools.bench.run import OwnStack, git_commit, start_stack, write_result
from dispo.tools.bench.shapes import SHAPES, catalogue_yaml

SHAPE = SHAPES["mixed"]
SERVICES = ("gateway", "executor", "reconciler")
EXECUTORS = 2


Injector = Callable[[OwnStack, argparse.Namespace], Awaitable[float]]


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    # Strikes and returns when the fault happened (epoch seconds; for a fault that lasts,
    # when it ended).
    inject: Injector


def _kill(process: str, sig: signal.Signals) -> Injector:
    """Send ``sig`` to the stack's ``process``; its supervisor restarts it."""

    async def inject(own: OwnStack, _: argparse.Namespace) -> float:
        os.kill(own.stack.pids()[process], sig)
        return time.time()

    return inject


async def _pause_executor(own: OwnStack, args: argparse.Namespace) -> float:
    """SIGSTOP one executor for ``--pause-seconds`` (past its lease), then SIGCONT."""
    pid = own.stack.pids()["executor-2"]
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(args.pause_seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return time.time()


async def _late_effects(own: OwnStack, args: argparse.Namespace) -> float:
    """For ``--late-seconds``, every non-idempotent call performs its effect only after the
    caller's timeout (then answers)."""
    late = {"ms": args.call_timeout_ms + args.late_extra_ms, "times": -1, "path": "/bench/once/"}
    await control(own.downstream_url, late_effect=late)
    try:
        await asyncio.sleep(args.late_seconds)
    finally:
        await control(own.downstream_url, late_effect=None)
    return time.time()


async def _late_downstream(own: OwnStack, args: argparse.Namespace) -> float:
    await control(own.downstream_url, late_ms=args.call_timeout_ms + args.late_extra_ms)
    try:
        await asyncio.sleep(args.late_seconds)
    finally:
        await control(own.downstream_url, late_ms=0)
    return time.time()


FAULTS = {
    fault.name: fault
    for fault in (
        Fault("gateway", "gateway SIGKILL", _kill("gateway", signal.SIGKILL)),
        Fault("executor", "executor SIGKILL (1 of 2)", _kill("executor-2", signal.SIGKILL)),
        Fault("reconciler", "reconciler SIGKILL", _kill("reconciler", signal.SIGKILL)),
        Fault("nats", "nats-server SIGKILL", _kill("nats", signal.SIGKILL)),
        Fault("postgres", "PostgreSQL immediate stop", _kill("postgres", signal.SIGQUIT)),
        Fault("late-downstream", "downstream late after effect", _late_downstream),
        Fault("executor-paused", "executor paused past its lease", _pause_executor),
        Fault("late-effect", "effect after the timeout", _late_effects),
    )
}


async def control(url: str, **switches: Any) -> None:
    """Set switches of the demo downstream (``late_ms``, ``dedupe``, …)."""
    async with httpx.AsyncClient(timeout=10) as http:
        (await http.post(f"{url}/control", json=switches)).raise_for_status()


async def effects(url: str) -> dict[str, int]:
    """Effects the downstream performed, per idempotency key."""
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.get(f"{url}/calls")
        reply.raise_for_status()
        counted: dict[str, int] = reply.json()["effects"]
        return counted


async def whole(own: OwnStack, timeout: float) -> None:
    """Until every process of the stack runs again and is ready."""
    async with asyncio.timeout(timeout):
        for supervisor in (own.stack.infrastructure, own.stack.supervisor):
            for child in (supervisor.children if supervisor else {}).values():
                while True:
                    while not child.process.running():
                        await asyncio.sleep(0.1)
                    try:
                        await child.process.wait_ready(timeout)
                        break
                    except ExitedBeforeReady:  # its supervisor starts it again
                        continue


async def settle(client: AsyncClient, business: str, timeout: float) -> None:
    """Until no task of ``business`` is unfinished, or ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        with contextlib.suppress(DispoError):
            if not await load.unfinished(client, business):
                return
        await asyncio.sleep(0.5)


async def read_tasks(
    client: AsyncClient, business: str, accepted: set[str], downstream_url: str
) -> list[TaskFacts]:
    """Every task of the phase as the gateway has it, each node with its counted effects."""
    outcomes = await load.retrying(lambda: load.outcomes(client, business, timeout=0))
    updated = {o.task_id: o.updated_at for o in outcomes}
    counted = await effects(downstream_url)
    limit = asyncio.Semaphore(16)

    async def one(task_id: str) -> TaskFacts:
        async with limit:
            try:
                view = await load.retrying(lambda: client.get(task_id))
            except DispoError as error:
                if error.code is grpc.StatusCode.NOT_FOUND:
                    return TaskFacts(task_id, None)
                raise
        nodes = tuple(
            NodeFacts(
                node_status_name(node.status),
                node.spec.idempotent,
                counted.get(node.idempotency_key, 0),
                node.idempotency_key,
                node.retry.attempts,
                node.last_error,
            )
            for node in view.raw.nodes
        )
        return TaskFacts(
            task_id, view.status, updated.get(task_id, 0.0), nodes, view.raw.idempotency_key
        )

    return list(await asyncio.gather(*(one(t) for t in sorted(accepted | set(updated)))))


async def run_phase(
    fault: Fault, own: OwnStack, clients: list[AsyncClient], business: str, args: argparse.Namespace
) -> PhaseFacts:
    submitter = load.Submitter(
        clients, business, lambda: [cell(SHAPE.cell)], retry_seconds=args.submit_retry_seconds
    )
    offering = asyncio.create_task(load.offer(submitter, args.tasks_per_fault, args.rate))
    await asyncio.sleep(args.fault_after * args.tasks_per_fault / args.rate)
    fault_at = await fault.inject(own, args)
    facts = await offering
    await settle(clients[0], business, args.recovery_seconds)
    accepted = {
        s.task_id: facts.started_at + s.sent_at + s.seconds
        for s in facts.submissions
        if not s.error
    }
    return PhaseFacts(
        fault=fault.description,
        offered=len(facts.submissions),
        accepted=accepted,
        refused=Counter(s.error for s in facts.submissions if s.error),
        retried=sum(1 for s in facts.submissions if not s.error and s.tries > 1),
        tasks=await read_tasks(clients[0], business, set(accepted), own.downstream_url),
        fault_at=fault_at,
    )


def _config(args: argparse.Namespace, faults: list[Fault]) -> dict[str, Any]:
    return {
        "shape": SHAPE.name,
        "faults": ",".join(f.name for f in faults),
        "tasks_per_fault": args.tasks_per_fault,
        "rate": args.rate,
        "executors": EXECUTORS,
        "call_timeout_ms": args.call_timeout_ms,
        "late_seconds": args.late_seconds,
        "pause_seconds": args.pause_seconds,
        "recovery_seconds": args.recovery_seconds,
        "submit_retry_seconds": args.submit_retry_seconds,
        "commit": git_commit(),
    }


async def campaign(args: argparse.Namespace) -> dict[str, Any]:
    faults = [FAULTS[name] for name in args.faults.split(",")]
    stamp = datetime.now(UTC)
    prefix = f"{args.business}-{stamp:%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
    async with start_stack(
        SERVICES,
        downstream=True,
        executors=EXECUTORS,
        catalogue=lambda url: catalogue_yaml(url, timeout_ms=args.call_timeout_ms),
        folder=Path(args.keep_folder).resolve() if args.keep_folder else None,
    ) as own:
        watching = asyncio.create_task(own.stack.watch())  # restarts whatever dies
        clients = [AsyncClient(address, token=own.token) for address in own.gateways]
        try:
            await control(own.downstream_url, dedupe=False)
            warm = load.Submitter(clients, f"{prefix}-warmup", lambda: [cell(SHAPE.cell)])
            await load.saturate(warm, 4, 2)
            await load.outcomes(clients[0], warm.business, timeout=120)
            busy_before, wall_before = machine.busy_cpu_seconds(), time.monotonic()
            rows = []
            for index, fault in enumerate(faults, 1):
                await whole(own, args.recovery_seconds)
                business = f"{prefix}-{index}-{fault.name}"
                phase = await run_phase(fault, own, clients, business, args)
                rows.append(fault_row(phase))
                print(f"{fault.description:<30} done", flush=True)
            busy = (machine.busy_cpu_seconds() - busy_before, time.monotonic() - wall_before)
        finally:
            for client in clients:
                await client.close()
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    return build_campaign(
        created=stamp.isoformat(timespec="seconds"),
        machine=machine.describe(),
        config=_config(args, faults),
        rows=rows,
        machine_busy=busy,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dispo bench faults", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"faults to run, in order, comma-separated (of {', '.join(FAULTS)})",
    )
    p.add_argument("--tasks-per-fault", type=int, default=100, help="tasks offered per fault")
    p.add_argument("--rate", type=float, default=10.0, help="offered Submits per second")
    p.add_argument(
        "--fault-after",
        type=float,
        default=1 / 3,
        help="when the fault strikes, as a share of the phase's load",
    )
    p.add_argument(
        "--recovery-seconds",
        type=float,
        default=120.0,
        help="after the load, how long every task has to become terminal before it counts as stuck",
    )
    p.add_argument(
        "--call-timeout-ms", type=int, default=2000, help="the downstream's per-call timeout"
    )
    p.add_argument(
        "--late-seconds",
        type=float,
        default=5.0,
        help="how long the downstream answers, or acts, after the timeout (late-downstream and"
        " late-effect faults)",
    )
    p.add_argument(
        "--pause-seconds",
        type=float,
        default=15.0,
        help="how long the paused executor stays stopped (executor-paused fault; the lease is 5 s)",
    )
    p.add_argument(
        "--late-extra-ms",
        type=int,
        default=1000,
        help="how far past the call timeout a late answer or a late effect comes",
    )
    p.add_argument(
        "--submit-retry-seconds",
        type=float,
        default=30.0,
        help="how long a Submit answered UNAVAILABLE is sent again under its key (0: never)",
    )
    p.add_argument(
        "--keep-folder",
        default="",
        help="keep the stack's data and logs in this (new) folder instead of a scratch one",
    )
    p.add_argument("--business", default="faults", help="business prefix of the submitted tasks")
    p.add_argument(
        "--results", default="bench-results", help="folder for the JSON result ('' for none)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    unknown = [name for name in args.faults.split(",") if name not in FAULTS]
    if unknown:
        raise SystemExit(f"unknown fault(s) {', '.join(unknown)}: choose from {', '.join(FAULTS)}")
    began = time.perf_counter()
    report = asyncio.run(campaign(args))
    print("\n".join(render_campaign(report)))
    if args.results:
        path = write_result(report, Path(args.results), campaign_result_name(report))
        print(f"result    {path}")
    print("README table:\n" + "\n".join(table(report)))
    print(f"campaign took {time.perf_counter() - began:.1f} s")
    raise SystemExit(exit_code(report))


if __name__ == "__main__":
    main()
