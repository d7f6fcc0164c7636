"""Callback deliveries under hostile receivers: each delivery has a total deadline on the
reconciler's clock (a receiver dripping a byte now and then cannot hold one for ever), none
waits for another, and one business's slow receivers hold at most its share of the slots,
so another business's callback goes out while they hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
from dispo.libs.egress import AllowList
from dispo.libs.error_text import ERROR_TEXT_LIMIT
from dispo.reconciler.completion import facts
from dispo.reconciler.completion import store as cs
from dispo.reconciler.context import Context
from dispo.reconciler.states import NotifyState
from dispo.reconciler.sweeps import sweep_parts
from support.auth import signing_secret

from .fakes import RawReceiver, drip, dripping_body, huge, silent
from .test_completion import finished
from .test_sweep_parts import eventually


@pytest.fixture
async def receivers() -> AsyncIterator[Callable[..., RawReceiver]]:
    started: list[RawReceiver] = []

    async def make(answer) -> RawReceiver:
        r = RawReceiver(answer)
        await r.start()
        started.append(r)
        return r

    yield make
    for r in started:
        await r.stop()


@pytest.fixture
async def notifying(recon, receiver, database_url) -> AsyncIterator[Callable[..., Context]]:
    """The reconciler context with its notify sweep running as its part, and callbacks
    allowed to the given receivers beside the fast one (business ``search``'s)."""
    await signing_secret(database_url, "search")
    await receiver.start()
    running: list[tuple[object, asyncio.Task[None]]] = []

    def make(*raw: RawReceiver) -> Context:
        allowed = " ".join([receiver.server.url, *(r.origin for r in raw)])
        ctx = replace(recon, egress=AllowList.parse(allowed))
        part = sweep_parts(ctx, interval=1.0)["notify"]
        running.append((part, asyncio.create_task(part.run(), name=part.name)))
        return ctx

    yield make
    for part, task in running:
        part.stop()
        await asyncio.wait_for(task, 10)


async def attempts(ctx: Context, task_id: str) -> list:
    async with ctx.db.connection() as conn:
        return await cs.deliveries_get(conn, task_id)


async def state(ctx: Context, task_id: str) -> NotifyState:
    async with ctx.db.connection() as conn:
        return NotifyState((await cs.completion_get(conn, task_id)).notify_state)


async def test_another_business_is_notified_while_one_businesss_receivers_hang(
    recon, manual_clock, receiver, receivers, notifying
):
    dripping, mute, big = (
        await receivers(drip),
        await receivers(silent),
        await receivers(huge(500, 16 * 2**20)),
    )
    ctx = notifying(dripping, mute, big)
    for task_id, r in (("dripping", dripping), ("mute", mute), ("big", big)):
        assert await facts.on_status(ctx, finished(task_id, callback_url=r.url))
    await eventually(lambda: dripping.connections == 1 and mute.connections == 1)

    assert await facts.on_status(
        ctx, finished("fast", callback_url=receiver.url, business="search")
    )
    await eventually(lambda: len(receiver.received) == 1)

    async def fast_delivered() -> bool:
        return await state(ctx, "fast") is NotifyState.DELIVERED

    await eventually(fast_delivered)
    assert await attempts(ctx, "dripping") == []  # still under way, the clock standing still

    manual_clock.advance(seconds=recon.settings.http_timeout_seconds)  # the deadline passes

    async def all_tried() -> bool:
        return all([await attempts(ctx, t) for t in ("dripping", "mute", "big")])

    await eventually(all_tried)
    [dripped] = await attempts(ctx, "dripping")
    assert not dripped.ok and "deadline" in dripped.error
    assert await state(ctx, "dripping") is NotifyState.PENDING  # tried again after its backoff
    assert [a.ok for a in await attempts(ctx, "mute")] == [False]
    [answered] = await attempts(ctx, "big")
    assert not answered.ok and answered.status_code == 500


async def test_a_business_holds_at_most_its_share_of_the_delivery_slots(
    recon, receiver, receivers, notifying
):
    recon.settings.notify_concurrency = 3
    recon.settings.notify_per_business = 2
    dripping = await receivers(drip)
    ctx = notifying(dripping)
    for i in range(4):
        assert await facts.on_status(ctx, finished(f"d{i}", callback_url=dripping.url))
    await eventually(lambda: dripping.connections == 2)

    assert await facts.on_status(
        ctx, finished("fast", callback_url=receiver.url, business="search")
    )
    await eventually(lambda: len(receiver.received) == 1)
    assert dripping.connections == 2  # ecommerce's share, not every slot
    assert len(ctx.deliveries) == 2


async def test_a_callbacks_answer_is_not_read_and_a_refusals_only_up_to_its_error(
    recon, receivers, notifying
):
    """What a receiver answers after its status is not used: a 200 whose body never ends is
    delivered at once, the clock standing still; a 500 is recorded with the start of its
    answer, and a receiver answering 64 MiB cannot write them all (the reconciler hung up
    after the prefix)."""
    endless, bloated = await receivers(dripping_body(200)), await receivers(huge(500, 64 * 2**20))
    refusing = await receivers(dripping_body(503, first=4 * ERROR_TEXT_LIMIT))
    ctx = notifying(endless, bloated, refusing)
    for task_id, r in (("endless", endless), ("bloated", bloated), ("refusing", refusing)):
        assert await facts.on_status(ctx, finished(task_id, callback_url=r.url))

    async def settled() -> bool:
        return all([await attempts(ctx, t) for t in ("endless", "bloated", "refusing")])

    await eventually(settled)
    assert await state(ctx, "endless") is NotifyState.DELIVERED
    [answered] = await attempts(ctx, "bloated")
    assert answered.status_code == 500 and answered.error.startswith("HTTP 500: xxxx")
    assert len(answered.error) == ERROR_TEXT_LIMIT
    [refused] = await attempts(ctx, "refusing")
    assert refused.status_code == 503 and refused.error.startswith("HTTP 503: yyyy")
    await eventually(lambda: len(ctx.deliveries) == 0)
    assert bloated.finished == 0
