"""No second effect of a non-idempotent action, with the real pipeline (gateway, executors,
reconciler and the demo downstream as processes) and a downstream that counts every effect
it performs (``dedupe`` off: it never deduplicates by key).

- A paused executor whose lease was taken over sends nothing it had claimed (the fence
  before every send, ADR-0066).
- An effect that lands after the call was given up on is found by the probe, never repeated:
  an unfenced "not done" is not final before the action's ``max_effect_seconds``.
- A fencing probe makes "not done" final at once: the node runs again, and the late request
  is refused by the downstream.
- A request that never had its effect runs again once ``max_effect_seconds`` have passed.

The reconciler's clock is a file the test moves; no test looks at how long anything took."""

from __future__ import annotations

import json
import os
import signal

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump
from support import eventually

LATE = "/late-once/"
SETTLING = pb.RECOVERY_STATE_AWAITING_SETTLEMENT


async def settlements(reconciler, task_id: str) -> list[pb.Settlement]:
    reply = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))
    return list(reply.settlements)


def logged(process, event: str, **fields: str) -> bool:
    """Whether ``process`` logged ``event`` with ``fields`` (its JSON log lines)."""
    for line in process.log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items()):
            return True
    return False


async def test_a_paused_executor_sends_nothing_it_claimed_once_its_lease_was_taken_over(
    start_service, catalogue_file, egress_allow, downstream, reconciler
):
    """Executor 1 claims a and c; a's call is held by the downstream and, with one
    connection to the downstreams, c's waits for it (claimed, not yet sent). Executor 1 is
    paused (SIGSTOP) past its lease; executor 2 takes the task over, a and c become UNKNOWN,
    are settled not done and run again: one effect each. Executor 1 resumes, a's held call
    ends and frees the connection: c's stale request must not go out."""
    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    await pipeline.start_gateway()
    first = await pipeline.start_executor(DISPO_EXECUTOR_MAX_CONNECTIONS="1")
    await downstream.control(dedupe=False, hold={"path": "/once/a", "times": 1})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("step_once", ref="a", name="a"), cell("step_once", ref="c", name="c")]
        )
        await downstream.wait_held(1)
        os.kill(first.pid, signal.SIGSTOP)
        try:
            await pipeline.start_executor()  # takes the task over once the lease expired
            await reconciler.wait_state(task.task_id, SETTLING, timeout=60)
            await reconciler.sweep_past_effects(50)  # both not done, and final: run again
            view = await client.wait(task.task_id, timeout=30)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert view.status == "SUCCEEDED", dump(view)
        await downstream.control(release=True)  # a's stale call ends: the connection frees
        await eventually(
            lambda: logged(first, "node result lost a race (lease expired?)", node_id="c.call"),
            bool,
            timeout=30,
            wanted="the paused pass done with c",
        )

    a, c = f"{task.task_id}/a.call", f"{task.task_id}/c.call"
    calls, effects = await downstream.calls(), await downstream.effects()
    assert effects[a] == 1 and effects[c] == 1, effects
    assert calls[a] == 2 and calls[c] == 1, calls  # c: only executor 2's call
    # Found lost by its heartbeat or by the step that records a's late result, whichever
    # comes first after SIGCONT: either way the pass stopped as a loser.
    assert any(
        logged(first, event, task_id=task.task_id)
        for event in ("lease lost", "lease lost; stopping pass")
    )


async def test_an_effect_that_lands_after_the_call_was_given_up_is_found_not_repeated(
    pipeline, downstream, reconciler
):
    await downstream.control(dedupe=False, late_effect={"ms": 4000, "times": 1, "path": LATE})
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("late_once", name="u")])
        key = f"{task.task_id}/late_once.call"
        await reconciler.wait_state(task.task_id, SETTLING, timeout=60)
        await reconciler.sweep()
        # "Not done" so far, but the request may still land: asked again, not re-sent.
        held = await reconciler.held(task.task_id)
        assert held.state == SETTLING and "not final before" in held.reason, held
        assert key not in await downstream.effects()
        await eventually(downstream.effects, lambda e: key in e, wanted="the late effect")
        await reconciler.sweep(seconds=5)  # the next probe: done
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "SUCCEEDED", dump(view)
    state = await downstream.state()
    assert state["late"] == 0 and state["calls"][key] == 1 and state["effects"][key] == 1
    [s] = await settlements(reconciler, task.task_id)
    assert (s.method, s.outcome) == (pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_SUCCEEDED)


async def test_a_fencing_probe_runs_the_node_again_at_once_and_the_late_request_is_refused(
    pipeline, downstream, reconciler
):
    await downstream.control(
        dedupe=False, fence=True, late_effect={"ms": 4000, "times": 1, "path": LATE}
    )
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("late_once", name="f")])
        key = f"{task.task_id}/late_once.call"
        await reconciler.wait_state(task.task_id, SETTLING, timeout=60)
        await reconciler.sweep()  # fenced: "not done" is final, runs again
        view = await client.wait(task.task_id, timeout=30)
        await eventually(downstream.state, lambda s: s["late"] == 0, wanted="the late request")

    assert view.status == "SUCCEEDED", dump(view)
    assert view.node("late_once.call").attempts == 2
    state = await downstream.state()
    assert state["calls"][key] == 2 and state["effects"][key] == 1, state
    assert state["refused"][key] == 1  # the first request, fenced before its effect landed
    [s] = await settlements(reconciler, task.task_id)
    assert s.outcome == common_pb2.NODE_STATUS_PENDING and "fenced" in s.reason


async def test_a_request_that_never_acted_runs_again_once_its_effect_can_no_longer_land(
    pipeline, downstream, reconciler
):
    await downstream.control(dedupe=False, drop={"times": 1, "path": LATE})  # reset, no effect
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("late_once", name="d")])
        key = f"{task.task_id}/late_once.call"
        await reconciler.wait_state(task.task_id, SETTLING, timeout=60)
        for _ in range(3):  # not done, not final: asked again, never re-sent
            await reconciler.sweep(seconds=2)
            assert (await reconciler.held(task.task_id)).state == SETTLING
        assert (await downstream.calls())[key] == 1
        await reconciler.sweep_past_effects(10)
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "SUCCEEDED", dump(view)
    calls, effects = await downstream.calls(), await downstream.effects()
    assert calls[key] == 2 and effects[key] == 1
    [s] = await settlements(reconciler, task.task_id)
    assert s.outcome == common_pb2.NODE_STATUS_PENDING and "10 s after" in s.reason
