"""The fence before a call leaves (ADR-0066), on the real database and the demo downstream as
a real process, with an executor in this process on a manual clock: a call goes out only
while its pass's lease is proven to run beyond the send margin, and one task has one pass in
a process at a time."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from dispo.executor.actions import Call, http_session, run_action
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome
from dispo.executor.passes import Opening, Step
from dispo.executor.runner import IN_HAND_DELAY, Executor, ExecutorConfig
from dispo.executor.store.status_events import outbox
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Nak
from dispo.libs.catalogue import Downstream
from dispo.libs.outbox import OutboxRelay
from dispo.libs.payload import json_payload


def one_call(task_id: str, path: str = "/once/x") -> task_pb2.Task:
    env = task_pb2.Task(task_id=task_id, business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    env.nodes.add(
        node_id="a.call",
        cell_ref="a",
        status=common_pb2.NODE_STATUS_PENDING,
        idempotency_key=f"{task_id}/a.call",
        spec=task_pb2.ActionSpec(
            kind="http", downstream="demo", method="POST", path=path, timeout_ms=5000
        ),
    )
    env.payloads["a"].CopyFrom(json_payload(b"{}"))
    return env


@pytest.fixture(params=[True, False], ids=["group-commits", "inline-commits"])
async def executor(request, service_engine, service_db, bus, manual_clock, downstream):
    db = await service_db("executor")
    http, health = http_session(), httpx.AsyncClient()
    registry = {"demo": Downstream("demo", downstream.url)}
    # send margin: 1 s; the passes' writes group-committed, or each its own transaction
    # Each limit counted in this process: no timer renews shares of the cluster's here.
    config = ExecutorConfig(lease_ttl=5.0, group_commit=request.param, cluster_limits=False)
    yield Executor(db, OutboxRelay(db, outbox, bus), registry, manual_clock, config, http, health)
    await http.close()
    await health.aclose()


async def opened(executor: Executor, task_id: str, owner: str) -> Step:
    [step] = await executor.flushes.open([Opening(one_call(task_id), owner)])
    assert isinstance(step, Step) and step.state.lease_until is not None
    return step


async def test_a_lease_near_its_end_is_extended_before_a_send_and_a_taken_one_sends_nothing(
    executor, manual_clock
):
    mine = await opened(executor, "mine", "me")
    taken = await opened(executor, "taken", "me")
    assert await executor._may_send("mine", "me", mine.state)  # 5 s left: no write
    manual_clock.advance(seconds=3.5)  # 1.5 s left, under twice the margin: extended first
    assert await executor._may_send("mine", "me", mine.state)
    assert mine.state.lease_until == manual_clock.now() + timedelta(seconds=5)

    async with executor.db.transaction() as conn:  # another pass took the expired lease
        await conn.fetch("UPDATE task_runs SET lease_owner = 'other' WHERE task_id = 'taken'")
    assert not await executor._may_send("taken", "me", taken.state)
    assert taken.state.lease_lost  # and nothing more of this pass is sent
    assert not taken.state.holds_lease(manual_clock.now(), 0)


async def test_a_call_whose_fence_fails_once_it_has_its_connection_is_not_sent(downstream):
    call = Call("t", "a.call", "t/a.call", ActionSpec("http", "demo", "POST", "/once/x"), b"{}", 3)
    demo = Downstream("demo", downstream.url)
    async with http_session() as client:
        refused = await run_action(client, call, demo, lambda: False)
        assert (refused.outcome, refused.fenced) == (CallOutcome.NOT_SENT, True)
        assert "no longer holds the task's lease" in refused.detail
        assert "t/a.call" not in await downstream.calls()  # not a byte reached it
        sent = await run_action(client, call, demo, lambda: True)  # a reused connection too
        again = await run_action(client, call, demo, lambda: False)
    assert sent.outcome is CallOutcome.SUCCESS and again.outcome is CallOutcome.NOT_SENT
    assert (await downstream.calls())["t/a.call"] == 1


async def test_a_second_delivery_of_a_task_with_a_pass_here_waits_for_it(executor, downstream):
    """Two deliveries of one task.create at once in one process: the second is nak'ed at
    the door, so the node is claimed and called once."""
    await downstream.control(dedupe=False, hold={"path": "/once/door"})
    env = one_call("door", "/once/door")
    first = asyncio.create_task(executor.handle_create(env))
    await downstream.wait_held(1)
    assert await executor.handle_create(env) == Nak(delay=IN_HAND_DELAY)
    await downstream.control(release=True)  # the held call answers 503: a short retry
    assert await first == ACK  # its short retry goes out as a new generation
    assert (await downstream.calls())["door/a.call"] == 1
    assert "door" not in executor.in_hand
