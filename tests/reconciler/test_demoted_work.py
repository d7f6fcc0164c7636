"""task.demote: tracked per downstream, released when the downstream's health probe
passes — oldest first, no faster than the configured rate — pausable by hand, with
queue depth and oldest age queryable."""

from datetime import timedelta

import grpc
import pytest
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.recovery import redrive
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps
from sqlalchemy import text

from .conftest import TS, after_redrive, creates, envelope, node, outbox, row
from .test_operations import expect_error


def demoted(task_id, downstreams=("labels",)):
    nodes = [node("a.done", "SUCCEEDED", task_id=task_id)]
    nodes += [
        node(f"b{i}.wait", "DEMOTED", downstream=d, task_id=task_id)
        for i, d in enumerate(downstreams)
    ]
    return envelope(task_id, nodes, status="DEMOTED")


async def release_times(recon):
    async with recon.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT task_id, at FROM redrive_log WHERE trigger = 'release' ORDER BY id")
        )
        return [(r.task_id, r.at) for r in rows]


async def test_released_oldest_first_no_faster_than_the_rate_once_healthy(
    recon, manual_clock, fake_downstream
):
    fake_downstream.healthy = False
    for i in range(7):
        assert await redrive.intake(recon, demoted(f"d{i}"), "demote")
        manual_clock.advance(seconds=1)
    assert (await row(recon, "d0")).state is RecoveryState.DEMOTED

    await run_sweeps(recon, "health")
    assert await run_sweeps(recon, "release") == {"release": 0}
    manual_clock.advance(seconds=30)
    assert await run_sweeps(recon, "release") == {"release": 0}  # still down

    fake_downstream.healthy = True
    start = manual_clock.now()
    counts = []
    for _ in range(12):  # every 0.5 s of clock time: health probe, then release
        await run_sweeps(recon, "health")
        counts.append((await run_sweeps(recon, "release"))["release"])
        manual_clock.advance(seconds=0.5)
    assert sum(counts) == 7
    released = await release_times(recon)
    assert [t for t, _ in released] == [f"d{i}" for i in range(7)]  # oldest first
    # Rate 2/s with a bucket of 2: in any interval of T seconds at most 2 + 2·T releases.
    for i, (_, a) in enumerate(released):
        for j in range(i, len(released)):
            span = (released[j][1] - a).total_seconds()
            assert j - i + 1 <= 2 + 2 * span, (i, j, span)
    assert released[0][1] == start
    sent = {e.task_id: e for e in await creates(recon)}
    assert (
        after_redrive(sent["d3"], "a.done") == "SUCCEEDED"
        and after_redrive(sent["d3"], "b0.wait") == "PENDING"
    )
    # A release is a redrive, counted against the redrive policy, and counted as a release.
    assert (await row(recon, "d3")).releases == 1 and (await row(recon, "d3")).redrives == 1


async def test_pause_holds_a_healthy_downstream_until_resumed(recon, manual_clock, stub):
    await redrive.intake(recon, demoted("p1"), "demote")
    reply = await stub.PauseDownstream(
        pb.PauseDownstreamRequest(name="labels", actor="dave", reason="deploy")
    )
    assert reply.downstream.paused and reply.downstream.paused_by == "dave"
    await run_sweeps(recon, "health")
    manual_clock.advance(seconds=5)
    assert (await run_sweeps(recon, "release"))["release"] == 0
    reply = await stub.ResumeDownstream(pb.ResumeDownstreamRequest(name="labels", actor="dave"))
    assert not reply.downstream.paused
    assert (await run_sweeps(recon, "release"))["release"] == 1
    await expect_error(
        stub.PauseDownstream(pb.PauseDownstreamRequest(name="")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "name",
    )
    await expect_error(
        stub.PauseDownstream(pb.PauseDownstreamRequest(name="nope")), grpc.StatusCode.NOT_FOUND
    )


async def test_a_task_waiting_for_two_downstreams_needs_both(recon, manual_clock, stub):
    await redrive.intake(recon, demoted("two", ("labels", "review")), "demote")
    await stub.PauseDownstream(pb.PauseDownstreamRequest(name="review", actor="x"))
    await run_sweeps(recon, "health")
    manual_clock.advance(seconds=5)
    assert (await run_sweeps(recon, "release"))["release"] == 0
    await stub.ResumeDownstream(pb.ResumeDownstreamRequest(name="review"))
    assert (await run_sweeps(recon, "release"))["release"] == 1


async def test_queue_depth_and_oldest_age_per_downstream(
    recon, manual_clock, stub, fake_downstream
):
    fake_downstream.healthy = False
    await redrive.intake(recon, demoted("q1"), "demote")
    manual_clock.advance(seconds=40)
    await redrive.intake(recon, demoted("q2"), "demote")
    await redrive.intake(
        recon, envelope("q3", [node("a.x", "FAILED", downstream="review", task_id="q3")]), "fail"
    )
    await run_sweeps(recon, "health")
    manual_clock.advance(seconds=20)
    reply = await stub.ListDownstreams(pb.ListDownstreamsRequest())
    by_name = {d.name: d for d in reply.downstreams}
    labels, review = by_name["labels"], by_name["review"]
    assert (labels.demoted_depth, labels.oldest_demoted_age_seconds) == (2, 60)
    assert labels.probed and not labels.healthy and "503" in labels.probe_error
    assert (review.failed_depth, review.oldest_failed_age_seconds, review.demoted_depth) == (
        1,
        20,
        0,
    )
    assert labels.release_rate_per_second == pytest.approx(2)
    assert set(by_name) >= {"labels", "review", "notify"}
    assert manual_clock.now() - timedelta(
        seconds=60
    ) == labels.oldest_demoted_at.ToDatetime().replace(tzinfo=manual_clock.now().tzinfo)


def demoted_again(task_id, generation, error="HTTP 500: cannot label this content"):
    """The executor's task.demote of a released task whose call failed until the breaker
    opened: the same generation it was released under, its node DEMOTED with the error."""
    env = demoted(task_id)
    env.generation = generation
    env.nodes[1].last_error = error
    return env


async def test_a_task_demoted_again_after_each_release_ends_failed_when_its_redrives_are_spent(
    recon, manual_clock
):
    """A downstream whose health check passes while it answers 500 for some content: each
    release of the task is followed by a demotion. Releases count against the redrive
    policy, so the loop ends: the demotion after the last allowed release ends the task
    FAILED, published as the terminal failure, instead of a release for ever."""
    policy = recon.config.redrive_policy("ecommerce", "update_quality_level")
    generation, releases = 2, 0
    for _ in range(policy.max_redrives + 3):
        assert await redrive.intake(recon, demoted_again("loop", generation), "demote")
        if (await row(recon, "loop")).state is not RecoveryState.DEMOTED:
            break
        manual_clock.advance(seconds=10)  # the release bucket refills
        await run_sweeps(recon, "health")
        releases += (await run_sweeps(recon, "release"))["release"]
        generation = (await row(recon, "loop")).generation
    ended = await row(recon, "loop")
    assert ended.state is RecoveryState.FAILED, ended.state
    assert releases == ended.releases == ended.redrives == policy.max_redrives
    assert ended.reason.startswith(
        f"redrive policy spent: {policy.max_redrives} of {policy.max_redrives} redrives used"
    )
    assert "HTTP 500: cannot label this content" in ended.reason
    [snapshot] = await outbox(recon, "task.status.loop.failed")
    assert task_pb2.Task.FromString(snapshot.payload).status == TS.TASK_STATUS_FAILED


async def test_a_task_failing_right_after_its_release_counts_the_release(recon, manual_clock):
    """Business search may be redriven once: its demoted task, released once, then failing,
    ends FAILED at once rather than being redriven again."""
    env = demoted("s1")
    env.business = "search"
    assert await redrive.intake(recon, env, "demote")
    await run_sweeps(recon, "health")
    assert (await run_sweeps(recon, "release"))["release"] == 1
    released = await row(recon, "s1")
    failing = envelope(
        "s1",
        [
            node("a.done", "SUCCEEDED", task_id="s1"),
            node("b0.wait", "FAILED", error="HTTP 500: cannot label this content", task_id="s1"),
        ],
        business="search",
        generation=released.generation,
    )
    assert await redrive.intake(recon, failing, "fail")
    ended = await row(recon, "s1")
    assert ended.state is RecoveryState.FAILED
    assert ended.reason.startswith("redrive policy spent: 1 of 1 redrives used")
