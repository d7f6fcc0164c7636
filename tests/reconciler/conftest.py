"""Reconciler fixtures: an in-process reconciler context on the real database and bus,
driven by a manual clock; envelope builders; fake downstream and callback servers."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import Bus
from dispo.libs.catalogue import parse_catalogue
from dispo.libs.clock import ManualClock
from dispo.libs.egress import AllowList
from dispo.libs.grpcserver import create_server
from dispo.libs.outbox import OutboxRelay
from dispo.libs.payload import canonical_json, json_payload
from dispo.reconciler.context import Context
from dispo.reconciler.http_client import http_client
from dispo.reconciler.outbox import outbox as outbox_table
from dispo.reconciler.recovery import store
from dispo.reconciler.servicer import ReconcilerServicer
from dispo.reconciler.settings import ReconcilerSettings, parse_config
from dispo.reconciler.wiring import SERVICE_NAME, ensure_streams
from sqlalchemy import text
from support.auth import admin_channel, session_tokens, signing_secret

from .fakes import CallbackReceiver, FakeDownstream
from .processes import Reconciler

NS = common_pb2.NodeStatus
TS = common_pb2.TaskStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)

CONFIG = {
    "redrive": {
        "default": {
            "max_redrives": 3,
            "max_age": 86400,
            "base_delay": 10,
            "max_delay": 100,
            "jitter": 0.5,
        },
        "rules": [{"business": "search", "max_redrives": 1}],
    },
    "release": {"default": {"rate_per_second": 2, "burst": 2}},
    "settle_retry_delay": 30,
    "callbacks": {"max_attempts": 5, "base_delay": 10, "max_delay": 100, "jitter": 0},
    "reconciliation": {"sample_percent": 100, "delay": 60, "max_attempts": 2, "retry_delay": 30},
    "arbitration": {
        "window_seconds": 60,
        "priority": [{"business": "trust_safety"}, {"business": "ecommerce"}],
    },
}

# The cell the envelopes below use, with the conflict arbitration decides on.
CELLS = {
    "update_quality_level": {
        "fields": {"content_id": {"type": "string", "required": True}},
        "actions": {"set_label": {"kind": "http", "downstream": "labels", "path": "/labels"}},
        "conflict": {"key": "content_id", "effect": "quality_level"},
    }
}


def node(
    node_id: str,
    status: str = "PENDING",
    *,
    deps: tuple[str, ...] = (),
    downstream: str = "labels",
    probe: bool = True,
    idempotent: bool = True,
    retryable: bool = True,
    error: str = "",
    attempts: int = 0,
    cell: str = "update_quality_level",
    task_id: str = "t",
) -> task_pb2.Node:
    cell_ref = node_id.split(".")[0]
    key = f"{task_id}/{node_id}"
    n = task_pb2.Node(
        node_id=node_id,
        cell_ref=cell_ref,
        cell=cell,
        action=node_id.split(".")[-1],
        depends_on=list(deps),
        status=NS.Value(f"NODE_STATUS_{status}"),
        idempotency_key=key,
        last_error=error,
        spec=task_pb2.ActionSpec(
            kind="http",
            downstream=downstream,
            method="POST",
            path=f"/do/{node_id}",
            probe_path=f"/effects/{key}" if probe else "",
            idempotent=idempotent,
        ),
    )
    n.retry.attempts = attempts
    n.retry.round_attempts = attempts
    n.retry.retryable = retryable and status == "FAILED"
    return n


def envelope(
    task_id: str,
    nodes: list[tuple[str, str] | task_pb2.Node],
    *,
    business: str = "ecommerce",
    generation: int = 2,
    version: int = 7,
    status: str = "RETRY_EXHAUSTED",
    callback_url: str = "",
    payloads: dict[str, dict] | None = None,
    created_at: datetime = T0,
    **node_kw: Any,
) -> task_pb2.Task:
    env = task_pb2.Task(
        task_id=task_id,
        business=business,
        generation=generation,
        version=version,
        status=TS.Value(f"TASK_STATUS_{status}"),
        callback_url=callback_url,
        status_reason=f"test: {status.lower()}",
    )
    env.created_at.FromDatetime(created_at)
    for item in nodes:
        if isinstance(item, task_pb2.Node):
            env.nodes.append(item)
        else:
            node_id, st = item
            env.nodes.append(node(node_id, st, task_id=task_id, **node_kw))
    for ref, payload in (payloads or {}).items():
        env.payloads[ref].CopyFrom(json_payload(canonical_json(payload)))
    return env


def status_of(env: task_pb2.Task, node_id: str) -> str:
    return NS.Name(next(n.status for n in env.nodes if n.node_id == node_id)).removeprefix(
        "NODE_STATUS_"
    )


def after_redrive(env: task_pb2.Task, node_id: str) -> str:
    """The node's state once an executor that recorded what ``env`` reports applies
    ``env.redrive`` to it (the rule of dispo.executor.plan.redrive_changes)."""
    state = status_of(env, node_id)
    if node_id in env.redrive.settled_nodes and state in ("UNKNOWN", "SUCCEEDED"):
        return "SUCCEEDED"
    if node_id in env.redrive.reset_nodes and state not in ("SUCCEEDED", "CANCELLED", "RUNNING"):
        return "PENDING"
    return state


@pytest.fixture
async def fake_downstream(fake_server) -> FakeDownstream:
    fake = FakeDownstream()
    fake.server = await fake_server(fake.routes())
    return fake


@pytest.fixture
async def receiver(fake_server) -> CallbackReceiver:
    """Not listening until ``start()``; its URL is known before."""
    r = CallbackReceiver()
    r.server = await fake_server(r.routes(), start=False)
    return r


@pytest.fixture
async def ecommerce_secret(database_url: str) -> str:
    """The webhook signing secret of business ``ecommerce`` (the envelopes' business)."""
    return await signing_secret(database_url, "ecommerce")


@pytest.fixture
async def recon(
    ecommerce_secret: str,
    service_engine: Any,
    service_db: Any,
    bus: Bus,
    manual_clock: ManualClock,
    fake_downstream: FakeDownstream,
    receiver: CallbackReceiver,
) -> AsyncIterator[Context]:
    engine = await service_engine("reconciler")
    await ensure_streams(bus)
    url = fake_downstream.url
    catalogue = parse_catalogue(
        {
            "downstreams": {
                "labels": {"base_url": url, "health_url": f"{url}/healthz"},
                "review": {"base_url": url, "health_url": f"{url}/healthz"},
                "notify": {"base_url": url},
            },
            "cells": CELLS,
        }
    )
    settings = ReconcilerSettings(batch=100, http_timeout_seconds=2.0, sweep_interval_seconds=0)
    async with http_client() as http:  # the process's client: answers read up to a bound
        ctx = Context(
            engine,
            db := await service_db("reconciler"),
            manual_clock,
            parse_config(CONFIG, catalogue),
            settings,
            http,
            OutboxRelay(db, outbox_table, bus),
            bus,
            random.Random(7),
            # The callbacks' receiver, and a port where nothing listens.
            egress=AllowList.parse(f"{receiver.server.url},http://127.0.0.1:9"),
            service_token=session_tokens().services["reconciler"],
            signing_key=session_tokens().key,
        )
        yield ctx
        await ctx.deliveries.close()  # a delivery a test left hanging


@pytest.fixture
async def stub(
    recon: Context, authorizer: Any
) -> AsyncIterator[reconciler_pb2_grpc.ReconcilerServiceStub]:
    server = create_server(
        "127.0.0.1:0",
        [
            lambda s: reconciler_pb2_grpc.add_ReconcilerServiceServicer_to_server(
                ReconcilerServicer(recon), s
            )
        ],
        [SERVICE_NAME],
        authorizer(),
    )
    await server.start()
    async with admin_channel(f"127.0.0.1:{server.port}") as channel:
        yield reconciler_pb2_grpc.ReconcilerServiceStub(channel)
    await server.stop(0)


async def outbox(ctx: Context, subject: str | None = None) -> list[Any]:
    """Outbox rows (subject, msg_id, payload) in order, optionally for one subject."""
    async with ctx.engine.connect() as conn:
        rows = await conn.execute(text("SELECT subject, msg_id, payload FROM outbox ORDER BY id"))
        return [r for r in rows if subject is None or r.subject == subject]


async def creates(ctx: Context) -> list[task_pb2.Task]:
    return [task_pb2.Task.FromString(r.payload) for r in await outbox(ctx, "task.create")]


async def row(ctx: Context, task_id: str) -> store.RecoveryRow:
    async with ctx.db.connection() as conn:
        found = await store.task_get(conn, task_id)
    assert found is not None
    return found


@pytest.fixture
async def start_reconciler(
    start_service, file_clock, catalogue_file, tmp_path: Path, egress_allow: str, executor_port
):
    """A reconciler process reading callbacks' results from the executor at
    ``executor_port`` (the ``pipeline`` fixture's; a test's own Pipeline may use it too)."""
    config = {
        **CONFIG,
        "redrive": {
            "default": {"max_redrives": 3, "base_delay": 10, "max_delay": 10, "jitter": 0},
            "rules": [{"business": "flaky", "max_redrives": 1}],
        },
        "reconciliation": {"delay": 5, "sample_percent": 100},
        "arbitration": {
            "window_seconds": 60,
            "priority": [{"business": "trust_safety"}],
        },
    }
    path = tmp_path / "recovery.yaml"
    path.write_text(yaml.safe_dump(config))
    file_clock.set(datetime.now(UTC))
    channels = []

    async def start(**env: str) -> Reconciler:
        process = await start_service(
            "reconciler",
            {
                **file_clock.env,
                "DISPO_RECONCILER_CONFIG": str(path),
                "DISPO_CATALOGUE": str(catalogue_file),
                "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0.5",
                "DISPO_EGRESS_ALLOW": egress_allow,
                "DISPO_RECONCILER_EXECUTOR_ADDRESS": f"127.0.0.1:{executor_port}",
                **env,
            },
        )
        channel = admin_channel(process.address)
        channels.append(channel)
        return Reconciler(
            process, file_clock, channel, reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        )

    yield start
    for channel in channels:
        await channel.close()


@pytest.fixture
async def reconciler(start_reconciler):
    return await start_reconciler()
