"""The reconciler as a real process: SIGKILL in the middle of a redrive sweep loses
nothing and redrives nothing twice."""

import asyncio
import contextlib
from pathlib import Path

import asyncpg
import yaml
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from nats.js.errors import NotFoundError
from support import eventually
from support.auth import admin_channel

from .conftest import CELLS, CONFIG, envelope, node

REDRIVEN = pb.RECOVERY_STATE_REDRIVEN


def reconciler_env(tmp_path: Path, file_clock, **extra: str) -> dict[str, str]:
    config = {
        **CONFIG,
        "redrive": {"default": {"max_redrives": 3, "base_delay": 10, "max_delay": 10, "jitter": 0}},
    }
    (tmp_path / "recovery.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "catalogue.yaml").write_text(
        yaml.safe_dump(
            {
                "downstreams": {"labels": {"base_url": "http://127.0.0.1:9", "health_url": ""}},
                "cells": CELLS,
            }
        )
    )
    return {
        **file_clock.env,
        "DISPO_RECONCILER_CONFIG": str(tmp_path / "recovery.yaml"),
        "DISPO_CATALOGUE": str(tmp_path / "catalogue.yaml"),
        "DISPO_RECONCILER_BATCH": "3",
        "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "1",
        **extra,
    }


async def states(address: str) -> dict[str, int]:
    async with admin_channel(address) as channel:
        stub = reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        reply = await stub.ListRecoveryTasks(
            pb.ListRecoveryTasksRequest(
                filter=pb.RecoveryFilter(states=[pb.RECOVERY_STATE_PARKED_FAILED, REDRIVEN])
            )
        )
        return {t.task_id: t.state for t in reply.tasks}


async def task_creates(bus) -> list[task_pb2.Task]:
    from nats.js.api import ConsumerConfig, DeliverPolicy

    info = await bus.js.stream_info("TASKS", subjects_filter="task.create")
    count = (info.state.subjects or {}).get("task.create", 0)
    if not count:
        return []
    sub = await bus.js.pull_subscribe(
        "task.create", stream="TASKS", config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    out = []
    while len(out) < count:
        out.extend(await sub.fetch(count - len(out), timeout=5))
    await sub.unsubscribe()
    return [task_pb2.Task.FromString(m.data) for m in out]


async def drive(file_clock, check) -> None:
    """Move the clock a second at a time until ``check`` holds. A move that lands while a sweep
    round runs pushes the loop's next round on by as much, so one move alone may run none."""

    async def moved_on():
        if await check():
            return True
        file_clock.advance(seconds=1)
        return False

    await eventually(moved_on, interval=0.3, wanted="the sweeps caught up")


async def _unsent(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM reconciler.outbox WHERE sent_at IS NULL")
    finally:
        await conn.close()


async def test_killed_mid_redrive_loses_nothing_and_redrives_nothing_twice(
    start_service, bus, file_clock, tmp_path, database_url
):
    reconciler = await start_service("reconciler", reconciler_env(tmp_path, file_clock))
    ids = [f"k{i:02d}" for i in range(12)]
    for task_id in ids:
        env = envelope(
            task_id,
            [
                node("a.ok", "SUCCEEDED", task_id=task_id),
                node("a.x", "FAILED", deps=("a.ok",), error="HTTP 503", task_id=task_id),
            ],
        )
        await bus.publish("task.fail", env.SerializeToString(), msg_id=f"{task_id}:fail:g2")
    await eventually(lambda: _count(reconciler.address, pb.RECOVERY_STATE_PARKED_FAILED, 12))

    file_clock.advance(seconds=11)  # all due; each sweep round redrives a batch of 3
    await drive(file_clock, lambda: _at_least(reconciler.address, REDRIVEN, 3))
    before_kill = sum(1 for s in (await states(reconciler.address)).values() if s == REDRIVEN)
    assert before_kill < 12
    file_clock.advance(seconds=1)  # the next round starts...
    await asyncio.sleep(0.02)
    reconciler.kill()  # ...and is cut short wherever it is
    await reconciler.restart()

    await drive(file_clock, lambda: _count(reconciler.address, REDRIVEN, 12))
    sent = await eventually(lambda: _creates_at_least(bus, 12))
    assert sorted(e.task_id for e in sent) == ids  # every task exactly once
    assert {e.generation for e in sent} == {3}
    async with admin_channel(reconciler.address) as channel:
        stub = reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        for task_id in ids:
            detail = await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))
            assert [r.generation for r in detail.redrives] == [3], task_id
    # Everything the reconciler has recorded to publish is out: no late duplicate is pending.
    await eventually(
        lambda: _unsent(database_url), lambda n: n == 0, wanted="the reconciler's outbox sent"
    )
    assert len(await task_creates(bus)) == 12


async def _count(address, state, n):
    return sum(1 for s in (await states(address)).values() if s == state) == n


async def _at_least(address, state, n):
    return sum(1 for s in (await states(address)).values() if s == state) >= n


async def _creates_at_least(bus, n):
    sent = await task_creates(bus)
    return sent if len(sent) >= n else None


async def test_the_consumers_take_the_reconcilers_ack_wait(
    start_service, bus, file_clock, tmp_path
):
    """A crashed reconciler's messages in hand come back after 5 s, not the bus's 30 s."""
    await start_service("reconciler", reconciler_env(tmp_path, file_clock))
    durables = {
        "reconciler-fail": tasks.TASKS.name,
        "reconciler-demote": tasks.TASKS.name,
        "reconciler-claims": tasks.TASKS.name,
        "reconciler-status": tasks.TASK_STATUS.name,
    }

    async def ack_waits() -> dict[str, float]:
        found = {}
        for durable, stream in durables.items():
            with contextlib.suppress(NotFoundError):
                info = await bus.js.consumer_info(stream, durable)
                found[durable] = info.config.ack_wait
        return found

    waits = await eventually(ack_waits, lambda w: len(w) == 4, wanted="the four durables")
    assert waits == dict.fromkeys(durables, 5.0)
