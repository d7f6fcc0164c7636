"""Replicas race for the same work: every task is redriven once, a duplicate delivery
records one picture, one verdict per conflict, one delivery per callback."""

import asyncio
from dataclasses import replace

from dispo.reconciler.arbitration import arbiter
from dispo.reconciler.completion import facts
from dispo.reconciler.recovery import redrive
from dispo.reconciler.sweeps import run_sweeps

from .conftest import T0, creates, envelope, node, outbox, row
from .test_arbitration import submitted


async def replicas(recon, service_db, n=4):
    """``n`` reconciler contexts, each with its own connection pool, sharing the clock."""
    return [recon] + [replace(recon, db=await service_db("reconciler")) for _ in range(n - 1)]


async def test_concurrent_redrive_sweeps_redrive_each_task_once(recon, service_db, manual_clock):
    ids = [f"race{i:02d}" for i in range(40)]
    for task_id in ids:
        await redrive.intake(
            recon, envelope(task_id, [node("a.x", "FAILED", task_id=task_id)]), "fail"
        )
    manual_clock.advance(seconds=100)
    ctxs = await replicas(recon, service_db)
    results = await asyncio.gather(*(run_sweeps(c, "redrive") for c in ctxs for _ in range(2)))
    assert sum(r["redrive"] for r in results) == 40
    sent = await creates(recon)
    assert sorted(e.task_id for e in sent) == ids
    assert len({r.msg_id for r in await outbox(recon, "task.create")}) == 40


async def test_operator_redrive_racing_the_sweep_redrives_once(recon, service_db, manual_clock):
    from dispo.libs.errors import FailedPrecondition
    from dispo.reconciler.recovery import operations

    for i in range(10):
        await redrive.intake(
            recon, envelope(f"op{i}", [node("a.x", "FAILED", task_id=f"op{i}")]), "fail"
        )
    manual_clock.advance(seconds=100)
    other = (await replicas(recon, service_db, 2))[1]

    async def operator(task_id):
        try:
            await operations.redrive_one(other, task_id, "ops", "now", False)
            return 1
        except FailedPrecondition:
            return 0

    results = await asyncio.gather(
        run_sweeps(recon, "redrive"), *(operator(f"op{i}") for i in range(10))
    )
    assert results[0]["redrive"] + sum(results[1:]) == 10
    assert sorted(e.task_id for e in await creates(recon)) == sorted(f"op{i}" for i in range(10))


async def test_the_same_task_fail_delivered_twice_at_once_is_recorded_once(recon, service_db):
    ctxs = await replicas(recon, service_db, 2)
    env = envelope("dup", [node("a.x", "FAILED", task_id="dup")])
    outcomes = await asyncio.gather(*(redrive.intake(c, env, "fail") for c in ctxs))
    # The loser of the insert race asks for redelivery; the redelivery is then a no-op.
    for ctx, ok in zip(ctxs, outcomes, strict=False):
        if not ok:
            assert await redrive.intake(ctx, env, "fail")
    async with recon.db.connection() as conn:
        from dispo.reconciler.recovery import store

        assert len(await store.history_get(conn, "dup")) == 1
    assert (await row(recon, "dup")).generation == 2


async def test_concurrent_arbitration_passes_record_one_verdict(recon, service_db, manual_clock):
    for i in range(10):
        await arbiter.on_create(recon, submitted(f"e{i}", "ecommerce", f"c-{i}", T0))
        await arbiter.on_create(recon, submitted(f"t{i}", "trust_safety", f"c-{i}", T0))
    ctxs = await replicas(recon, service_db)
    results = await asyncio.gather(*(run_sweeps(c, "arbitrate") for c in ctxs))
    assert sum(r["arbitrate"] for r in results) == 10
    from .test_arbitration import cancelled

    assert sorted(await cancelled(recon)) == sorted(f"e{i}" for i in range(10))


async def test_concurrent_notify_sweeps_deliver_each_callback_once(recon, service_db, receiver):
    await receiver.start()
    for i in range(10):
        env = envelope(
            f"n{i}",
            [node("a.x", "SUCCEEDED", task_id=f"n{i}")],
            status="SUCCEEDED",
            callback_url=receiver.url,
        )
        await facts.on_status(recon, env)
    ctxs = await replicas(recon, service_db)
    await asyncio.gather(*(run_sweeps(c, "notify") for c in ctxs))
    assert sorted(r["headers"]["X-Dispo-Task-Id"] for r in receiver.received) == sorted(
        f"n{i}" for i in range(10)
    )


async def test_replicas_recording_overlapping_batches_record_each_task_once(recon, service_db):
    ids = [f"fin{i:02d}" for i in range(60)]
    snapshots = [
        envelope(t, [node("a.x", "SUCCEEDED", task_id=t)], status="SUCCEEDED") for t in ids
    ]
    for t in ids[:20]:  # parked tasks the finished fact resolves
        await redrive.intake(recon, envelope(t, [node("a.x", "FAILED", task_id=t)]), "fail")
    ctxs = await replicas(recon, service_db)
    # Every replica gets every snapshot, in its own order (a redelivery to each of them).
    orders = [
        snapshots,
        snapshots[::-1],
        snapshots[30:] + snapshots[:30],
        snapshots[::2] + snapshots[1::2],
    ]
    answers = await asyncio.gather(
        *(facts.on_statuses(c, order) for c, order in zip(ctxs, orders, strict=True))
    )
    recorded = [
        e.task_id
        for order, a in zip(orders, answers, strict=True)
        for e, ok in zip(order, a, strict=True)
        if ok
    ]
    assert sorted(recorded) == ids  # each fact recorded by exactly one replica
    for t in ids[:20]:
        assert (await row(recon, t)).state.value == "resolved"
