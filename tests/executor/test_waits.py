"""Wait nodes and signals (ADR-0102), through real processes: gateway, executor, the demo
downstream, PostgreSQL and NATS. A review waits for its verdict, which a business sends as
a signal; the verdict becomes the wait node's output and reaches the calls after it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import grpc
import pytest
from dispo.sdk import DispoError, cell
from pipeline_fixtures import Pipeline, dump, wait_until
from support.auth import business_token


def review_flow(name: str, review: str = "review") -> list:
    """A review, then the label, then the owner told the verdict (ADR-0093 references)."""
    return [
        cell(review, ref="review", name=name),
        cell("set_level", ref="label", name=name, level=3).after("review"),
        cell(
            "tell",
            ref="owner",
            name=f"owner-of-{name}",
            note=f"review of {name}: {{nodes.review.verdict.output.verdict}}",
        ).after("label"),
    ]


def statuses(view) -> dict[str, str]:
    return {n.node_id: n.status for n in view.nodes}


async def waiting(client, task_id: str):
    return await wait_until(
        client,
        task_id,
        lambda v: statuses(v).get("review.verdict") == "WAITING",
        wanted="the review WAITING",
    )


async def test_review_flow_signal_from_the_business_token_runs_what_follows(
    pipeline, downstream, database_url
):
    """The review waits (the task RUNNING, nothing after it called, no lease held); the
    business's own token signals the verdict; the label is applied and the owner is told
    the verdict, which is the wait node's output."""
    _, secret = await business_token(database_url, "shop")
    async with pipeline.client(token=secret) as shop:
        task = await shop.submit("shop", review_flow("c-1"), idempotency_key="review-c-1")
        view = await waiting(shop, task.task_id)
        assert view.status == "RUNNING", dump(view)
        assert statuses(view) == {
            "review.verdict": "WAITING",
            "label.call": "PENDING",
            "owner.send": "PENDING",
        }
        assert not [k for k in await downstream.calls() if k.startswith(task.task_id)]

        # By business and idempotency key, as a caller that kept only its own key.
        sent = await shop.signal(
            "",
            "verdict",
            {"verdict": "approved", "note": "fine"},
            signal_id="reviewer-1",
            business="shop",
            idempotency_key="review-c-1",
        )
        assert (sent.task_id, sent.signal_id, sent.duplicate) == (task.task_id, "reviewer-1", False)
        done = await shop.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("review.verdict").output == {"verdict": "approved", "note": "fine"}
    state = await downstream.state()
    assert state["effects"].get(f"{task.task_id}/label.call") == 1
    assert json.loads(state["bodies"][f"{task.task_id}/owner.send"])["note"] == (
        "review of c-1: approved"
    )


async def test_a_signal_before_the_node_waits_is_kept_and_taken_when_it_does(
    pipeline, client, downstream
):
    """The signal comes while the wait node is still PENDING behind a call held open: it is
    recorded, and the node takes it the moment it starts waiting (never WAITING for
    nothing)."""
    await downstream.control(hold={"path": "/step/early"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="first", name="early"),
            cell("review", ref="review", name="early").after("first"),
            cell("tell", ref="owner", name="o", note="{nodes.review.verdict.output.verdict}").after(
                "review"
            ),
        ],
    )
    await downstream.wait_held(1)
    sent = await client.signal(task.task_id, "verdict", {"verdict": "rejected"}, signal_id="s-1")
    assert not sent.duplicate
    view = await client.get(task.task_id)
    assert statuses(view)["review.verdict"] == "PENDING", dump(view)
    await downstream.control(release=True)
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("review.verdict").output == {"verdict": "rejected"}
    state = await downstream.state()
    assert json.loads(state["bodies"][f"{task.task_id}/owner.send"])["note"] == "rejected"


async def test_a_repeated_signal_id_is_a_duplicate_and_changes_nothing(pipeline, client):
    task = await client.submit("tests", [cell("review", ref="review", name="dup")])
    await waiting(client, task.task_id)
    first = await client.signal(task.task_id, "verdict", {"verdict": "approved"}, signal_id="x")
    again = await client.signal(task.task_id, "verdict", {"verdict": "rejected"}, signal_id="x")
    assert (first.duplicate, again.duplicate) == (False, True)
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("review.verdict").output == {"verdict": "approved"}
    # Once ended, the same id is still answered duplicate; a new one is refused.
    assert (await client.signal(task.task_id, "verdict", {"verdict": "x"}, signal_id="x")).duplicate
    with pytest.raises(DispoError) as refused:
        await client.signal(task.task_id, "verdict", {"verdict": "approved"}, signal_id="y")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_refusals_name_the_field_and_change_nothing(pipeline, client, database_url):
    task = await client.submit("tests", [cell("review", ref="review", name="refused")])
    await waiting(client, task.task_id)

    async def refused(**kwargs) -> DispoError:
        with pytest.raises(DispoError) as caught:
            await client.signal(task.task_id, **kwargs)
        return caught.value

    undeclared = await refused(signal="approval", payload={"verdict": "approved"})
    assert undeclared.code == grpc.StatusCode.INVALID_ARGUMENT and "signal" in undeclared.violations
    assert "verdict" in undeclared.violations["signal"]
    mistyped = await refused(signal="verdict", payload={"verdict": 3})
    assert mistyped.code == grpc.StatusCode.INVALID_ARGUMENT
    assert mistyped.violations == {"payload": "not as the wait declares: verdict: must be string"}
    missing = await refused(signal="verdict", payload={})
    assert missing.code == grpc.StatusCode.INVALID_ARGUMENT and "payload" in missing.violations
    huge = await refused(signal="verdict", payload={"verdict": "x" * 70_000})
    assert huge.code == grpc.StatusCode.INVALID_ARGUMENT and "payload" in huge.violations

    # Another business's token: not its task (NOT_FOUND, as GetTask answers), nor may it
    # name this business (PERMISSION_DENIED naming `business`).
    _, secret = await business_token(database_url, "other")
    async with pipeline.client(token=secret) as other:
        with pytest.raises(DispoError) as hidden:
            await other.signal(task.task_id, "verdict", {"verdict": "approved"})
        assert hidden.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(DispoError) as denied:
            await other.signal(
                "", "verdict", {"verdict": "approved"}, business="tests", idempotency_key="k"
            )
        assert (
            denied.value.code == grpc.StatusCode.PERMISSION_DENIED
            and "business" in denied.value.violations
        )

    view = await client.get(task.task_id)
    assert view.status == "RUNNING" and statuses(view) == {"review.verdict": "WAITING"}

    # A cancelled (ended) task: nothing waits any more.
    await client.cancel(task.task_id)
    await wait_until(client, task.task_id, lambda v: v.status == "CANCELLED", wanted="CANCELLED")
    ended = await refused(signal="verdict", payload={"verdict": "approved"})
    assert ended.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_timeouts_fail_or_succeed_with_the_default_on_the_executors_clock(
    start_service, catalogue_file, downstream, file_clock
):
    """On the executor's clock, which moves only when the test moves it: nothing times out
    before its time; past it, `on_timeout: fail` ends the node FAILED ("no signal within
    N s") and its dependants DEPENDENCY_FAILED, `succeed` records the default output and
    what follows runs with it."""
    file_clock.set(datetime.now(UTC))
    pipeline = Pipeline(start_service, catalogue_file)
    await pipeline.start_gateway()
    await pipeline.start_executor(**file_clock.env, DISPO_EXECUTOR_WAIT_SWEEP_SECONDS="1")
    async with pipeline.client() as client:
        strict = await client.submit("tests", review_flow("strict"))
        lenient = await client.submit("tests", review_flow("lenient", review="lenient_review"))
        for task in (strict, lenient):
            await waiting(client, task.task_id)

        file_clock.advance(seconds=59)  # before either timeout: both still wait
        view = await client.get(lenient.task_id)
        assert statuses(view)["review.verdict"] == "WAITING", dump(view)

        file_clock.advance(seconds=2)  # past the lenient one's minute
        async with file_clock.running():  # what follows the wait runs on a moving clock
            done = await client.wait(lenient.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        assert done.node("review.verdict").output == {"verdict": "approved", "note": "no answer"}
        state = await downstream.state()
        assert json.loads(state["bodies"][f"{lenient.task_id}/owner.send"])["note"] == (
            "review of lenient: approved"
        )
        view = await client.get(strict.task_id)
        assert statuses(view)["review.verdict"] == "WAITING", dump(view)

        file_clock.advance(seconds=3600)  # past the strict one's hour
        async with file_clock.running():
            failed = await client.wait(strict.task_id, timeout=30)
    assert failed.status == "FAILED", dump(failed)
    assert statuses(failed) == {
        "review.verdict": "FAILED",
        "label.call": "DEPENDENCY_FAILED",
        "owner.send": "DEPENDENCY_FAILED",
    }
    assert failed.node("review.verdict").last_error == "no signal 'verdict' within 3600 s"
    assert not [k for k in await downstream.calls() if k.startswith(strict.task_id)]
