"""Pool fixtures: a Pool on the real database and bus with a manual clock, helpers to make
evaluations and crons, and a real HTTP target the agent can call."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.egress import AllowList
from dispo.libs.grpcserver import create_server
from dispo.libs.process import ManagedProcess, ProcessSpec, python_module
from dispo.pool.app import SERVICE_NAME
from dispo.pool.domain import (
    Evaluation,
    EvaluationStatus,
    Line,
    PoolPolicy,
    Rule,
    Schedule,
    TestCase,
)
from dispo.pool.drivers.local import LocalDriver
from dispo.pool.drivers.openclaw import OpenClawCli
from dispo.pool.openclaw import OpenClawGateway, OpenClawUnavailable, ensure_openclaw
from dispo.pool.operations import Pool
from dispo.pool.servicer import PoolServicer
from dispo.pool.sweeps import create_cron
from dispo.tools.stack.stack import service_env
from support.auth import admin_channel, session_tokens
from support.http import FakeServer

DEFAULT_TARGET = "http://127.0.0.1:9"


def evaluation(
    evaluation_id: str,
    *,
    target: str = DEFAULT_TARGET,
    slots: int = 24,
    window: int = 86400,
    runs_per_slot: int = 1,
    line: str = "formal",
    cases: tuple[TestCase, ...] | None = None,
) -> Evaluation:
    return Evaluation(
        id=evaluation_id,
        series="search-quality",
        line=Line(line),
        period="2026-W01",
        configuration_json=json.dumps({"model": "m1"}),
        analysis_model="",
        target_url=target,
        cases=cases or (TestCase("c1", "GET", "/answer", "", (Rule("status", "200"),)),),
        schedule=Schedule(None, window, slots, runs_per_slot),  # type: ignore[arg-type]  # the window starts when evaluation_insert stores it
        status=EvaluationStatus.QUEUED,
    )


@dataclass
class Wakes:
    subjects: list[str] = field(default_factory=list)


@pytest.fixture
async def pool_engine(service_engine):
    return await service_engine("pool")


@pytest.fixture
async def pool_db(service_db):
    """The driver port on the pool's schema: what the pool's store runs on."""
    return await service_db("pool")


@pytest.fixture
async def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
async def pool(pool_db, manual_clock, tmp_path, bus, wakes) -> Pool:
    async def publish(subject: str, data: bytes) -> None:
        wakes.subjects.append(subject)
        await bus.nc.publish(subject, data)

    driver = LocalDriver(tmp_path / "registry.sqlite", publish)
    # The evaluations' default target, a port where nothing listens.
    return Pool(pool_db, driver, manual_clock, PoolPolicy(), egress=AllowList.parse(DEFAULT_TARGET))


@pytest.fixture
async def stub(pool: Pool, authorizer) -> AsyncIterator[pool_pb2_grpc.PoolServiceStub]:
    """The ``pool`` fixture's PoolService on a real gRPC server in this process."""
    server = create_server(
        "127.0.0.1:0",
        [lambda s: pool_pb2_grpc.add_PoolServiceServicer_to_server(PoolServicer(pool), s)],
        [SERVICE_NAME],
        authorizer(),
    )
    await server.start()
    async with admin_channel(f"127.0.0.1:{server.port}") as channel:
        yield pool_pb2_grpc.PoolServiceStub(channel)
    await server.stop(0)


async def add_crons(pool: Pool, n: int) -> list[str]:
    crons = [await create_cron(pool) for _ in range(n)]
    await pool.settle()  # the driver has them too
    return crons


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


@dataclass
class Target:
    server: FakeServer
    # path -> (status, json body)
    answers: dict[str, tuple[int, object]] = field(default_factory=dict)
    # While set to an unset event, requests wait for it (a run in flight).
    hold: asyncio.Event | None = None
    waiting: int = 0
    # Paths answered 200 with a body that never ends: a byte every ``drip_seconds``.
    drips: set[str] = field(default_factory=set)
    drip_seconds: float = 0.2

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def calls(self) -> int:
        return len(self.server.requests)


@pytest.fixture
async def target(fake_server) -> AsyncIterator[Target]:
    """A real HTTP server on 127.0.0.1 playing the system under evaluation."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path in state.drips:
            dripping = web.StreamResponse(headers={"content-type": "application/json"})
            await dripping.prepare(request)
            while True:  # until the caller gives up (or the server stops)
                await dripping.write(b" ")
                await asyncio.sleep(state.drip_seconds)
        if state.hold is not None and not state.hold.is_set():
            state.waiting += 1
            await state.hold.wait()
        status, body = state.answers.get(request.path, (200, {"answer": "paris", "items": [1, 2]}))
        return web.json_response(body, status=status)

    state = Target(await fake_server({("*", "/{tail:.*}"): handle}))
    yield state
    if state.hold is not None:
        state.hold.set()


@pytest.fixture
async def pool_stack(start_service, file_clock, tmp_path, infra, role_url, nats_url, target):
    """``await pool_stack(worker_env, **pool_env)``: the pool service and a pool-worker process
    (local driver), sharing a file clock and a registry, ``target`` on their allow-list.
    Returns (pool service, worker)."""
    workers: list[ManagedProcess] = []
    registry = tmp_path / "registry.sqlite"

    async def start(worker_env: dict[str, str] | None = None, **pool_env: str):
        env = {
            **file_clock.env,
            "DISPO_POOL_LOCAL_REGISTRY": str(registry),
            "DISPO_POOL_SWEEP_SECONDS": "30",
            "DISPO_POOL_SPAWN_WORKER": "false",
            "DISPO_EGRESS_ALLOW": target.url,
            **pool_env,
        }
        service = await start_service("pool", env=env)
        worker = ManagedProcess(
            ProcessSpec(
                "pool-worker",
                python_module("dispo.pool.worker"),
                {
                    **file_clock.env,
                    **service_env("pool", role_url("pool"), nats_url, infra.nats_users),
                    "DISPO_LOG_FORMAT": "json",
                    "DISPO_POOL_WORKER_POOL_ADDRESS": service.address,
                    "DISPO_POOL_WORKER_LOCAL_REGISTRY": str(registry),
                    "DISPO_EGRESS_ALLOW": target.url,
                    **session_tokens().service_env("pool-worker"),
                    **(worker_env or {}),
                },
                None,
                tmp_path / "pool-worker.log",
            )
        )
        worker.spawn()
        workers.append(worker)
        return service, worker

    yield start
    for worker in workers:
        worker.kill()


FAKE_CLI = Path(__file__).with_name("fake_openclaw.py")


@dataclass
class FakeOpenClaw:
    """The stand-in ``openclaw`` CLI (``fake_openclaw.py``) on its own folder."""

    folder: Path

    def cli(self, timeout: float = 60.0) -> OpenClawCli:
        return OpenClawCli(
            [sys.executable, str(FAKE_CLI)],
            ["--port", "1", "--token", "t"],
            {"FAKE_OPENCLAW_DIR": str(self.folder)},
            timeout,
        )

    def behave(self, **behaviour: object) -> None:
        """``hold=[...]``, ``apply_then_hold=True``, ``skip=[...]`` (see fake_openclaw.py)."""
        (self.folder / "release").unlink(missing_ok=True)
        (self.folder / "behaviour.json").write_text(json.dumps(behaviour))

    def release(self) -> None:
        """Held calls go on."""
        (self.folder / "release").touch()

    def in_flight(self) -> list[str]:
        """The commands of the CLI processes running now."""
        running = []
        for entry in (self.folder / "in-flight").glob("*"):
            try:
                os.kill(int(entry.name), 0)
                running.append(entry.read_text())
            except (ProcessLookupError, FileNotFoundError):
                continue
        return running

    def calls(self) -> list[str]:
        log = self.folder / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def automations(self) -> dict[str, dict]:
        """By declaration key."""
        path = self.folder / "jobs.json"
        jobs = json.loads(path.read_text()) if path.exists() else {}
        return {job["declarationKey"]: job for job in jobs.values()}


@pytest.fixture
def fake_openclaw(tmp_path) -> FakeOpenClaw:
    folder = tmp_path / "fake-openclaw"
    (folder / "in-flight").mkdir(parents=True)
    return FakeOpenClaw(folder)


@pytest.fixture(scope="session")
async def openclaw_gateway(tmp_path_factory) -> AsyncIterator[OpenClawGateway]:
    """One real OpenClaw gateway for the test session (tests keep apart by their pool's
    namespace), installed into the cache folder first if missing. A machine where it cannot
    be installed or started fails these tests, saying why."""
    try:
        install = await asyncio.to_thread(ensure_openclaw)
    except OpenClawUnavailable as error:
        pytest.fail(f"OpenClaw cannot be installed here: {error}", pytrace=False)
    root = tmp_path_factory.mktemp("openclaw")
    gateway = OpenClawGateway(install, root / "home", root / "gateway.log")
    try:
        await gateway.start()
    except OpenClawUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    yield gateway
    gateway.kill()
