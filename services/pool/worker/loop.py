"""Worker loops: one per cron of the local registry, woken by the tick or a NATS wake-up.

A loop talks to the pool only through the cron protocol (WakeCron / RecordRun), exactly
as an OpenClaw automation would, so the pool's DB stays the authority.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal

import grpc
import httpx
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.bus import Bus, inbox_prefix
from dispo.libs.clock import Clock, clock_from_spec
from dispo.libs.evaluation import VERDICT_TO_PB
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Periodic
from dispo.libs.private_files import PRIVATE_FOLDER, open_private
from dispo.libs.settings import CommonSettings
from dispo.pool.convert import rule_kind
from dispo.pool.domain import Rule, TestCase
from dispo.pool.drivers.local import WAKE_SUBJECT, Registry
from dispo.pool.settings import WorkerSettings
from dispo.pool.worker.agent import run_case

log = get_logger(__name__)

MAX_ROUNDS = 20
# A pool restarting is waited for (the channel reconnects) rather than failed fast.
CALL_TIMEOUT = 30.0  # seconds, with wait_for_ready
GONE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def case_from_pb(case: pb.TestCase) -> TestCase:
    return TestCase(
        case.id,
        case.method or "GET",
        case.path or "/",
        case.body,
        tuple(Rule(rule_kind(r.kind), r.value, r.path) for r in case.rules),
    )


class Worker:
    def __init__(
        self,
        registry: Registry,
        stub: pool_pb2_grpc.PoolServiceAsyncStub,
        clock: Clock,
        tick_seconds: float,
        http: httpx.AsyncClient,
        run_deadline: float,
    ) -> None:
        self.registry = registry
        self.run_deadline = run_deadline  # seconds one run's call to the target may take
        self.stub = stub
        self.clock = clock
        self.tick_seconds = tick_seconds
        self.http = http
        self.events: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        # The tick: every cron wakes once per ``tick_seconds`` of the clock.
        self._ticks = Periodic(
            "cron tick", self.tick, tick_seconds, clock, first_after_interval=True
        )

    async def sync(self) -> None:
        """Start a loop for every cron in the registry, stop loops of removed crons."""
        present = {c.id for c in await asyncio.to_thread(self.registry.list)}
        for cron_id in present - self.tasks.keys():
            self.events[cron_id] = asyncio.Event()
            self.events[cron_id].set()  # first wake at once: a busy cron resumes its evaluation
            self.tasks[cron_id] = asyncio.create_task(self._loop(cron_id), name=cron_id)
        for cron_id in self.tasks.keys() - present:
            self.tasks.pop(cron_id).cancel()
            self.events.pop(cron_id, None)

    async def on_wake(self, cron_id: str) -> None:
        if cron_id not in self.events:
            await self.sync()
        if cron_id in self.events:
            self.events[cron_id].set()

    async def run(self) -> None:
        await self.sync()
        try:
            await self._ticks.run()
        finally:
            for task in self.tasks.values():
                task.cancel()
            for task in self.tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def tick(self) -> None:
        """Every cron of the registry wakes (new crons get a loop first)."""
        await self.sync()
        for event in self.events.values():
            event.set()

    def stop(self) -> None:
        self._ticks.stop()

    async def _loop(self, cron_id: str) -> None:
        event = self.events[cron_id]
        while True:
            await event.wait()
            event.clear()
            try:
                await self.serve(cron_id)
            except grpc.aio.AioRpcError as error:
                level = log.info if error.code() in GONE else log.warning
                level(
                    "cron wake failed",
                    cron_id=cron_id,
                    code=error.code().name,
                    detail=error.details(),
                )
            except Exception:
                log.exception("cron wake crashed", cron_id=cron_id)

    async def serve(self, cron_id: str) -> int:
        return await serve_cron(self.stub, self.http, cron_id, self.run_deadline)


async def serve_cron(
    stub: pool_pb2_grpc.PoolServiceAsyncStub,
    http: httpx.AsyncClient,
    cron_id: str,
    run_deadline: float,
) -> int:
    """One wake of a cron: run what is owed, each run's call to the target within
    ``run_deadline`` seconds in all; a cron that frees up takes the next item at once.
    Returns the runs performed. (A worker loop's wake, and an OpenClaw automation's.)"""
    performed = 0
    for _ in range(MAX_ROUNDS):
        woke = await stub.WakeCron(
            pb.WakeCronRequest(cron_id=cron_id), wait_for_ready=True, timeout=CALL_TIMEOUT
        )
        if not woke.assigned:
            return performed
        ev = woke.evaluation
        index = woke.next_run_index
        for _ in range(woke.runs_owed):
            case = case_from_pb(ev.cases[index % len(ev.cases)])
            result = await run_case(http, ev.target_url, case, run_deadline)
            recorded = await stub.RecordRun(
                pb.RecordRunRequest(
                    cron_id=cron_id,
                    evaluation_id=ev.id,
                    run_index=index,
                    case_id=case.id,
                    verdict=VERDICT_TO_PB[result.verdict],
                    score=result.score,
                    latency_ms=result.latency_ms,
                    failure_reason=result.failure_reason,
                ),
                wait_for_ready=True,
                timeout=CALL_TIMEOUT,
            )
            performed += 1
            index = recorded.next_run_index
            if not recorded.continue_evaluation:
                break
    return performed


async def main_async() -> None:
    common = CommonSettings()
    settings = WorkerSettings()
    clock = clock_from_spec(common.clock)
    # One worker per registry: a second one (say, a restart while the old one lingers) waits here.
    settings.local_registry.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    lock = open_private(settings.local_registry.with_suffix(".lock"))
    await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
    # The worker is part of the pool: it connects as the pool's bus user.
    bus = await Bus.connect(
        common.nats_servers,
        name="dispo-pool-worker",
        credentials=common.nats_credentials,
        inbox=inbox_prefix("pool"),
    )
    async with (
        open_channel(settings.pool_address, common.service_token) as channel,
        httpx.AsyncClient(timeout=settings.http_timeout_seconds) as http,
    ):
        worker = Worker(
            Registry(settings.local_registry),
            pool_pb2_grpc.PoolServiceStub(channel),
            clock,
            settings.tick_seconds,
            http,
            settings.http_timeout_seconds,
        )

        async def on_message(msg) -> None:
            await worker.on_wake(msg.subject.removeprefix(WAKE_SUBJECT + "."))

        await bus.nc.subscribe(f"{WAKE_SUBJECT}.*", cb=on_message)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        log.info(
            "pool worker running", registry=str(settings.local_registry), pool=settings.pool_address
        )
        await worker.run()
    await bus.close()
