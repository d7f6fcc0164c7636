"""Every class of failed call through the real pipeline (gateway and executor processes,
PostgreSQL, NATS), against the demo downstream switched to count every effect it performs:
it does not deduplicate by idempotency key, so an effect performed twice shows as two.

One test per row of the table in docs/pipeline.md (*Failed calls*). The settlement of an
UNKNOWN node by its status probe is in tests/reconciler/test_end_to_end.py."""

from __future__ import annotations

from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump, stream_messages, wait_status, wait_until
from support import eventually
from support.auth import admin_channel


async def test_not_sent_connection_refused_is_retried_and_the_effect_happens_once(
    start_service, catalogue_file, downstream
):
    pipeline = Pipeline(start_service, catalogue_file)
    await pipeline.start_gateway()
    # Enough short retries to outlast the downstream's absence.
    await pipeline.start_executor(DISPO_EXECUTOR_MAX_RETRIES="1000")
    downstream.kill()  # nothing listens: every connect is refused
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("step_once", name="r")])
        view = await wait_until(
            client,
            task.task_id,
            lambda v: v.node("step_once.call").attempts >= 2,
            wanted="two refused attempts",
        )
        assert view.node("step_once.call").last_error.startswith("not sent: connection error")
        downstream.spawn()
        await downstream.wait_ready(15)
        await downstream.control(dedupe=False)
        done = await client.wait(task.task_id, timeout=60)

    assert done.status == "SUCCEEDED", dump(done)
    key = f"{task.task_id}/step_once.call"
    assert done.node("step_once.call").attempts >= 3
    # The refused attempts never reached it: one call, one effect, though not idempotent.
    assert (await downstream.calls())[key] == 1
    assert (await downstream.effects())[key] == 1


async def test_not_sent_breaker_open_demotes_without_a_call(
    start_service, catalogue_file, downstream
):
    pipeline = Pipeline(start_service, catalogue_file)
    await pipeline.start_gateway()
    await downstream.control(down=True, dedupe=False)
    executor = await pipeline.start_executor(DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0.1")

    async def demo_breaker() -> int:
        async with admin_channel(executor.address) as channel:
            reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListDownstreams(
                executor_pb2.ListDownstreamsRequest()
            )
        return next(d.breaker_state for d in reply.downstreams if d.name == "demo")

    await eventually(
        demo_breaker, lambda s: s == executor_pb2.BREAKER_STATE_OPEN, wanted="breaker open"
    )
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("step_once", name="b")])
        view = await wait_status(client, task.task_id, {"DEMOTED"})

    node = view.node("step_once.call")
    assert node.status == "DEMOTED" and node.attempts == 0, dump(view)
    assert node.last_error.startswith("not sent: downstream demo degraded")
    assert f"{task.task_id}/step_once.call" not in await downstream.calls()


async def test_refused_without_effect_is_retried_after_the_retry_after(client, downstream, bus):
    """429 and 503: retried (a non-idempotent action too: the downstream did nothing), not
    before the Retry-After the answer asked for, which is longer than the backoff."""
    await downstream.control(dedupe=False)
    for name, status in (("busy", 429), ("unavailable", 503)):
        await downstream.control(
            fail={"status": status, "times": 1, "path": f"/once/{name}", "retry_after": "2"}
        )
    tasks = {
        name: await client.submit("tests", [cell("step_once", name=name)])
        for name in ("busy", "unavailable")
    }
    views = {name: await client.wait(t.task_id, timeout=60) for name, t in tasks.items()}

    calls, effects = await downstream.calls(), await downstream.effects()
    published = [
        task_pb2.Task.FromString(m.data) for m in await stream_messages(bus, "task.create")
    ]
    retries = {env.task_id: env for env in published if env.generation == 1}
    for name, task in tasks.items():
        view, key = views[name], f"{task.task_id}/step_once.call"
        assert view.status == "SUCCEEDED", dump(view)
        assert view.node("step_once.call").attempts == 2 and calls[key] == 2
        assert effects[key] == 1  # the refusal had no effect, the retry had one
        # The short retry was scheduled after the Retry-After, not the (0.05 s) backoff.
        [node] = retries[task.task_id].nodes
        waited = node.retry.not_before.ToDatetime() - node.started_at.ToDatetime()
        assert waited.total_seconds() >= 2.0, node
        assert node.last_error.startswith(f"refused: HTTP {429 if name == 'busy' else 503}")


async def test_definite_failure_fails_at_once_without_a_retry(client, downstream):
    await downstream.control(dedupe=False)
    for name, status in (("conflict", 409), ("invalid", 422)):
        await downstream.control(fail={"status": status, "times": 1, "path": f"/once/{name}"})
    tasks = [
        await client.submit("tests", [cell("step_once", name=name)])
        for name in ("conflict", "invalid")
    ]
    views = [await client.wait(t.task_id, timeout=30) for t in tasks]

    calls = await downstream.calls()
    for view, task in zip(views, tasks, strict=True):
        node = view.node("step_once.call")
        assert view.status == "FAILED" and node.status == "FAILED", dump(view)
        assert node.last_error.startswith("definite failure: HTTP 4")
        assert node.attempts == 1 and calls[f"{task.task_id}/step_once.call"] == 1
    assert not await downstream.effects()


# The ambiguous cases: the downstream performed the effect (or may have), then the answer
# came too late, the connection was reset, or it answered 500, 502 or 504.
AMBIGUOUS = {
    "late": {"hold": {"path": "/quick{once}/late", "effect": True, "times": 1}},
    "reset": {"drop": {"path": "/quick{once}/reset", "effect": True, "times": 1}},
    "e500": {"fail": {"path": "/quick{once}/e500", "status": 500, "times": 1}},
    "e502": {"fail": {"path": "/quick{once}/e502", "status": 502, "effect": True, "times": 1}},
    "e504": {"fail": {"path": "/quick{once}/e504", "status": 504, "effect": True, "times": 1}},
}
EFFECT_DONE = {"late", "reset", "e502", "e504"}


async def inject_ambiguous(downstream, once: bool) -> None:
    await downstream.control(dedupe=False)
    for switch in AMBIGUOUS.values():
        [(name, rule)] = switch.items()
        path = rule["path"].format(once="-once" if once else "")
        await downstream.control(**{name: {**rule, "path": path}})


async def test_ambiguous_call_of_a_non_idempotent_action_is_unknown_and_never_sent_again(
    client, downstream, bus
):
    await inject_ambiguous(downstream, once=True)
    tasks = {
        name: await client.submit("tests", [cell("quick_once", name=name)]) for name in AMBIGUOUS
    }
    views = {
        name: await wait_status(client, t.task_id, {"RETRY_EXHAUSTED"}, timeout=60)
        for name, t in tasks.items()
    }
    failed = {
        task_pb2.Task.FromString(m.data).task_id for m in await stream_messages(bus, "task.fail")
    }
    await downstream.control(release=True)

    calls, effects = await downstream.calls(), await downstream.effects()
    for name, task in tasks.items():
        view, key = views[name], f"{task.task_id}/quick_once.call"
        node = view.node("quick_once.call")
        assert node.status == "UNKNOWN", (name, dump(view))
        assert node.last_error.startswith("outcome unknown until settled"), node.last_error
        assert "ambiguous: " in node.last_error
        # One call, never a second: the effect, where it happened, happened once.
        assert node.attempts == 1 and calls[key] == 1, (name, calls)
        assert effects.get(key, 0) == (1 if name in EFFECT_DONE else 0), (name, effects)
        assert task.task_id in failed  # handed to the reconciler to settle by the probe


async def test_ambiguous_call_of_an_idempotent_action_is_retried_under_the_same_key(
    client, downstream
):
    await inject_ambiguous(downstream, once=False)
    tasks = {
        name: await client.submit("tests", [cell("quick_step", name=name)]) for name in AMBIGUOUS
    }
    views = {name: await client.wait(t.task_id, timeout=60) for name, t in tasks.items()}
    await downstream.control(release=True)

    calls, effects = await downstream.calls(), await downstream.effects()
    for name, task in tasks.items():
        view, key = views[name], f"{task.task_id}/quick_step.call"
        assert view.status == "SUCCEEDED", (name, dump(view))
        # Both calls carried the one key (a downstream honouring it would act once; this
        # one, not deduplicating, shows each call it acted on).
        assert view.node("quick_step.call").attempts == calls[key] == 2, (name, calls)
        assert effects[key] == (2 if name in EFFECT_DONE else 1), (name, effects)
