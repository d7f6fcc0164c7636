"""Arbitration: conflicting effects on one target from different businesses within the
window get one verdict by the configured policy; the loser is cancelled via task.cancel."""

import asyncio
from datetime import timedelta

from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.arbitration import arbiter
from dispo.reconciler.intake import consumers
from dispo.reconciler.sweeps import run_sweeps
from support import eventually

from .conftest import T0, envelope, node, outbox


def submitted(task_id, business, content_id, at, cell="update_quality_level"):
    return envelope(
        task_id,
        [node("q.set_label", "PENDING", cell=cell, task_id=task_id)],
        business=business,
        generation=0,
        version=0,
        status="ACCEPTED",
        created_at=at,
        payloads={"q": {"content_id": content_id, "level": 3}},
    )


async def cancelled(recon):
    return [
        task_pb2.CancelRequest.FromString(r.payload).task_id
        for r in await outbox(recon, "task.cancel")
    ]


async def test_two_conflicting_tasks_one_verdict_loser_cancelled(recon, manual_clock, stub, bus):
    manual_clock.set(T0 + timedelta(seconds=30))
    for env in (
        submitted("eco", "ecommerce", "c-42", T0),
        submitted("ts", "trust_safety", "c-42", T0 + timedelta(seconds=20)),
    ):
        await bus.publish("task.create", env.SerializeToString(), msg_id=env.task_id)
    parts = [c for name, c in consumers(recon, bus, "reconciler") if name == "claims consumer"]
    run = asyncio.create_task(parts[0].run())
    try:
        await eventually(
            lambda: run_sweeps(recon, "arbitrate"),
            lambda done: done["arbitrate"],
            timeout=15,
            wanted="an arbitration decided",
        )
    finally:
        parts[0].stop()
        await run
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 0  # decided once
    [verdict] = (await stub.ListVerdicts(pb.ListVerdictsRequest())).verdicts
    assert (verdict.target, verdict.effect) == ("content_id=c-42", "quality_level")
    assert verdict.winner_task_id == "ts" and list(verdict.loser_task_ids) == ["eco"]
    assert "trust_safety" in verdict.reason and "priority" in verdict.reason
    assert await cancelled(recon) == ["eco"]
    assert (await stub.ListVerdicts(pb.ListVerdictsRequest(task_id="eco"))).verdicts[
        0
    ].id == verdict.id
    assert not (await stub.ListVerdicts(pb.ListVerdictsRequest(target="content_id=other"))).verdicts


async def test_tie_on_priority_goes_to_the_earlier_task(recon, manual_clock):
    await arbiter.on_create(recon, submitted("late", "ads", "c-1", T0 + timedelta(seconds=5)))
    await arbiter.on_create(recon, submitted("early", "search", "c-1", T0))
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 1
    assert await cancelled(recon) == ["late"]


async def test_no_conflict_same_business_other_target_or_outside_the_window(recon, manual_clock):
    await arbiter.on_create(recon, submitted("a1", "ads", "c-1", T0))
    await arbiter.on_create(
        recon, submitted("a2", "ads", "c-1", T0 + timedelta(seconds=1))
    )  # same business
    await arbiter.on_create(recon, submitted("b1", "search", "c-2", T0))  # other target
    await arbiter.on_create(
        recon, submitted("x", "search", "c-3", T0, cell="start_review")
    )  # no conflict key
    manual_clock.set(T0 + timedelta(seconds=61))
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 0
    # A late claim outside the window of the closed ones meets nobody.
    await arbiter.on_create(recon, submitted("c1", "search", "c-1", T0 + timedelta(seconds=200)))
    manual_clock.set(T0 + timedelta(seconds=300))
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 0
    assert await cancelled(recon) == []


async def test_a_stronger_late_claim_overrules_an_earlier_winner(recon, manual_clock):
    await arbiter.on_create(recon, submitted("s", "search", "c-9", T0))
    await arbiter.on_create(recon, submitted("e", "ecommerce", "c-9", T0 + timedelta(seconds=10)))
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 1  # ecommerce outranks search
    await arbiter.on_create(
        recon, submitted("t", "trust_safety", "c-9", T0 + timedelta(seconds=30))
    )
    assert (await run_sweeps(recon, "arbitrate"))["arbitrate"] == 1
    assert await cancelled(recon) == ["s", "e"]


async def test_redriven_envelopes_make_no_new_claims(recon):
    env = submitted("g", "ads", "c-5", T0)
    env.generation = 3
    assert await arbiter.on_create(recon, env) == 0


async def test_a_tasks_claims_are_recorded_together_and_once(recon):
    """Every conflict cell of a task is one claim, written in one statement; a claim
    recorded before (task.create delivered again) is not written twice."""
    from dispo.reconciler.arbitration import store as arb

    claims = [
        arb.Claim("q", "update_quality_level", "content_id=c-7", "quality_level", {"level": 3}),
        arb.Claim("r", "update_quality_level", "content_id=c-8", "quality_level", {"level": 1}),
    ]
    async with recon.db.connection() as conn:
        first = await arb.claims_add_many(conn, "two", "ecommerce", T0, claims)
        again = await arb.claims_add_many(conn, "two", "ecommerce", T0, claims[1:])
        rows = {
            r.cell_ref: r
            for target in ("content_id=c-7", "content_id=c-8")
            for r in await arb.claims_of_target(conn, target, "quality_level", 60)
        }
    assert (first, again) == (2, 0)
    assert {ref: (r.state, r.payload) for ref, r in rows.items()} == {
        "q": ("open", {"level": 3}),
        "r": ("open", {"level": 1}),
    }
