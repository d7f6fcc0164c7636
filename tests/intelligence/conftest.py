"""Fixtures of the intelligence tests: the service's objects on a migrated schema with a
manual clock, helpers to feed evaluations, and a fake OpenAI-compatible LLM server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from dispo.intelligence import store
from dispo.intelligence.analysis_models import ChatModelConfig, ModelRegistry
from dispo.intelligence.app import Intelligence, build
from dispo.intelligence.evaluations import EvaluationRecordStatus, new_evaluation, new_run_result
from dispo.intelligence.settings import IntelligenceSettings
from dispo.libs.clock import Clock, ManualClock
from dispo.libs.db.driver import Database
from support import eventually
from support.auth import admin_channel
from support.http import FakeServer

CONFIG = {"target": "http://127.0.0.1:9/answer", "cases": ["c1", "c2", "c3"], "runs_per_slot": 2}


@pytest.fixture
async def intel_engine(service_engine):
    return await service_engine("intelligence")


@pytest.fixture
async def intel_db(service_db):
    return await service_db("intelligence")


class StoreOf:
    """The functions of :mod:`dispo.intelligence.store` on ``db``, each on a connection of
    its own (each statement commits alone, as the service calls them):
    ``await store_of(app).job_get(kind, evaluation_id)``."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        function = getattr(store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            async with self.db.connection() as conn:
                return await function(conn, *args, **kwargs)

        return call


def store_of(app: Intelligence) -> StoreOf:
    return StoreOf(app.db)


@pytest.fixture
async def make_app(intel_db, manual_clock: ManualClock):
    """``make_app(default_analysis_model=..., models=...)``: the service's objects, no server;
    ``db`` and ``clock`` replace the test's own (another replica, a clock of its own)."""
    built: list[Intelligence] = []

    def make(
        *,
        models: ModelRegistry | None = None,
        db: Database | None = None,
        clock: Clock | None = None,
        **settings: Any,
    ) -> Intelligence:
        settings.setdefault("consume_events", False)
        app = build(db or intel_db, clock or manual_clock, IntelligenceSettings(**settings), models)
        built.append(app)
        return app

    yield make
    for app in built:
        await app.jobs.close(0)
        await app.models.aclose()


@pytest.fixture
def app(make_app) -> Intelligence:
    return make_app()


async def add_evaluation(
    app: Intelligence,
    evaluation_id: str,
    *,
    series: str = "nightly",
    line: str = "formal",
    period: str = "2026-W01",
    configuration: dict | None = None,
    analysis_model: str = "",
    runs: list[tuple[str, str, float, int, str]] | None = None,
    status: EvaluationRecordStatus | None = None,
) -> None:
    """Register an evaluation, record its runs ``(case, verdict, score, latency_ms, reason)``,
    and finish it with ``status`` (when given)."""
    evaluation = new_evaluation(
        evaluation_id, series, line, period, json.dumps(configuration or CONFIG), analysis_model
    )
    await app.feed.create(evaluation)
    if runs:
        results = [
            new_run_result(f"{evaluation_id}-r{i}", case, verdict, score, latency, reason)
            for i, (case, verdict, score, latency, reason) in enumerate(runs)
        ]
        await app.feed.record_runs(evaluation_id, results)
    if status is not None:
        await app.feed.complete(evaluation_id, status)


RUNS_GOOD = [
    ("c1", "pass", 1.0, 100, ""),
    ("c2", "pass", 0.9, 120, ""),
    ("c3", "pass", 0.8, 150, ""),
    ("c1", "pass", 1.0, 110, ""),
    ("c2", "fail", 0.2, 300, "expected 200, got 500 from 'svc-7'"),
]
RUNS_WORSE = [
    ("c1", "pass", 0.9, 200, ""),
    ("c2", "fail", 0.1, 400, "expected 200, got 503 from 'svc-2'"),
    ("c3", "error", 0.0, 900, "timeout after 800 ms"),
    ("c1", "pass", 0.8, 210, ""),
    ("c2", "fail", 0.3, 380, "expected 200, got 500 from 'svc-9'"),
]


COMPLETIONS = "/v1/chat/completions"


# One scripted answer of the fake model: an HTTP status with headers, or a misbehaviour.
RESET = "reset"  # the connection is closed before any response
SLOW = "slow"  # the answer comes after SLOW_SECONDS (longer than a short client timeout)
SLOW_SECONDS = 2.0
Scripted = tuple[int, dict[str, str]] | str


@dataclass
class FakeLLM:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint on 127.0.0.1.

    Requests take the answers in ``script`` first, one each, in order; then every request
    gets ``status`` (200: a completion with ``reply``).
    """

    server: FakeServer
    status: int = 200
    reply: str = "The evaluation is healthy."
    gate: asyncio.Event | None = None
    script: list[Scripted] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The body of every request, in order of arrival."""
        return [json.loads(r.body) for r in self.server.received(COMPLETIONS)]

    @property
    def headers(self) -> list[dict[str, str]]:
        return [r.headers for r in self.server.received(COMPLETIONS)]

    def config(self, name: str = "fake-gpt", **extra: Any) -> ChatModelConfig:
        return ChatModelConfig(
            name=name, base_url=self.url, model="fake-model-1", api_key="sk-test", **extra
        )


@pytest.fixture
async def fake_llm(fake_server) -> AsyncIterator[FakeLLM]:
    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if fake.gate is not None:
            await fake.gate.wait()
        answer: Scripted = fake.script.pop(0) if fake.script else (fake.status, {})
        if answer == RESET:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if answer == SLOW:
            await asyncio.sleep(SLOW_SECONDS)
            answer = (200, {})
        assert isinstance(answer, tuple)
        status, headers = answer
        if status != 200:
            return web.Response(
                status=status, headers=headers, text="upstream exploded " + "x" * 2000
            )
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": fake.reply},
                    }
                ],
            }
        )

    fake = FakeLLM(await fake_server({("POST", COMPLETIONS): completions}))
    yield fake
    if fake.gate is not None:
        fake.gate.set()


@pytest.fixture
async def serve_app(authorizer):
    """``stub = await serve_app(app)``: the app's servicer on a real gRPC server (port 0)."""
    from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
    from dispo.libs.grpcserver import create_server

    servers, channels = [], []

    async def serve(app: Intelligence):
        server = create_server(
            "127.0.0.1:0",
            [
                lambda s: intelligence_pb2_grpc.add_IntelligenceServiceServicer_to_server(
                    app.servicer, s
                )
            ],
            ["dispo.intelligence.v1.IntelligenceService"],
            authorizer(),
        )
        await server.start()
        servers.append(server)
        channel = admin_channel(f"127.0.0.1:{server.port}")
        channels.append(channel)
        return intelligence_pb2_grpc.IntelligenceServiceStub(channel)

    yield serve
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(0)


async def run_jobs(app: Intelligence, clock: ManualClock, step: float = 1.0) -> None:
    """Wait until no job of ``app`` runs, moving ``clock`` on by ``step`` seconds whenever
    something waits on it (a retry's backoff), so clock-time waits pass without sleeping."""

    def idle() -> bool:
        if clock.waiting:
            clock.advance(step)
        return not app.jobs.registry.running()

    await eventually(idle, timeout=30, interval=0.005, wanted="every job settled")
