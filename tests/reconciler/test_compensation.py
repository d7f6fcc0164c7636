"""Arbitration losers whose conflict declares a compensating cell get it submitted to the
real gateway, once per (verdict, loser), retried while the gateway is unreachable."""

from dataclasses import replace
from datetime import timedelta

from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.catalogue import Conflict
from dispo.libs.process import free_port
from dispo.reconciler.arbitration import arbiter
from dispo.reconciler.arbitration.compensation import compensate_sweep
from dispo.reconciler.servicer import ReconcilerServicer
from dispo.reconciler.sweeps import run_sweeps

from .conftest import T0, envelope, node


def submitted(task_id, business, name, at, cell="step"):
    return envelope(
        task_id,
        [node(f"{cell}.call", "PENDING", cell=cell, task_id=task_id)],
        business=business,
        generation=0,
        version=0,
        status="ACCEPTED",
        created_at=at,
        payloads={cell: {"name": name}},
    )


def with_compensation(recon, gateway_address, compensate="step_once"):
    arb = replace(
        recon.config.arbitration, conflicts={"step": Conflict("name", "stepped", compensate)}
    )
    return replace(
        recon,
        config=replace(recon.config, arbitration=arb),
        settings=recon.settings.model_copy(update={"gateway_address": gateway_address}),
    )


async def test_loser_gets_its_compensating_cell_once(
    recon, start_service, catalogue_file, manual_clock
):
    gateway = await start_service("gateway", {"DISPO_CATALOGUE": str(catalogue_file)})
    ctx = with_compensation(recon, gateway.address)
    await arbiter.on_create(ctx, submitted("lose", "ecommerce", "n-1", T0))
    await arbiter.on_create(ctx, submitted("win", "trust_safety", "n-1", T0 + timedelta(seconds=3)))
    assert (await run_sweeps(ctx, "arbitrate"))["arbitrate"] == 1
    assert await compensate_sweep(ctx) == 1
    assert await compensate_sweep(ctx) == 0
    [verdict] = (
        await ReconcilerServicer(ctx).ListVerdicts(pb.ListVerdictsRequest(), None)
    ).verdicts
    [comp] = verdict.compensations
    assert (comp.task_id, comp.cell, comp.state, comp.attempts) == (
        "lose",
        "step_once",
        pb.COMPENSATION_STATE_SUBMITTED,
        1,
    )
    assert len(comp.submitted_task_id) == 32

    # A compensating cell the gateway refuses ends FAILED with the gateway's reason.
    bad = with_compensation(recon, gateway.address, compensate="no_such_cell")
    await arbiter.on_create(bad, submitted("lose2", "ecommerce", "n-3", T0))
    await arbiter.on_create(bad, submitted("win2", "trust_safety", "n-3", T0))
    await run_sweeps(bad, "arbitrate")
    assert await compensate_sweep(bad) == 1
    reply = await ReconcilerServicer(bad).ListVerdicts(
        pb.ListVerdictsRequest(task_id="lose2"), None
    )
    [comp] = reply.verdicts[0].compensations
    assert (
        comp.state == pb.COMPENSATION_STATE_FAILED
        and "INVALID_ARGUMENT" in comp.error
        and "no_such_cell" in comp.error
    )


async def test_unreachable_gateway_is_retried_with_backoff(recon, manual_clock):
    ctx = with_compensation(recon, f"127.0.0.1:{free_port()}")
    await arbiter.on_create(ctx, submitted("l1", "ads", "n-2", T0))
    await arbiter.on_create(ctx, submitted("w1", "trust_safety", "n-2", T0))
    await run_sweeps(ctx, "arbitrate")
    assert await compensate_sweep(ctx) == 1
    [verdict] = (
        await ReconcilerServicer(ctx).ListVerdicts(pb.ListVerdictsRequest(), None)
    ).verdicts
    assert (
        verdict.compensations[0].state == pb.COMPENSATION_STATE_PENDING
        and "UNAVAILABLE" in verdict.compensations[0].error
    )
    assert await compensate_sweep(ctx) == 0  # backoff
    manual_clock.advance(seconds=20)
    assert await compensate_sweep(ctx) == 1
