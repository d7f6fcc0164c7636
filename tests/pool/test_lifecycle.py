"""An evaluation's life through the cron protocol, its events on JetStream, and bad input."""

from __future__ import annotations

import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.pool.v1 import events_pb2, pool_pb2
from dispo.libs.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from dispo.pool.domain import EvaluationStatus, Rule, RunResult, TestCase, Verdict
from dispo.pool.events import outbox_relay

from .conftest import add_crons, evaluation

PASS = RunResult(Verdict.PASS, 1.0, 5)


async def _stream(bus, subject_filter: str = "evaluation.>") -> list[tuple[str, str, bytes]]:
    sub = await bus.js.pull_subscribe(subject_filter, stream="EVALUATIONS")
    out = []
    try:
        while True:
            for msg in await sub.fetch(50, timeout=0.5):
                out.append((msg.subject, msg.headers.get("Nats-Msg-Id"), msg.data))
                await msg.ack()
    except TimeoutError:
        pass
    await sub.unsubscribe()
    return out


async def test_evaluation_runs_slot_by_slot_completes_and_publishes_its_events(
    pool, service_db, manual_clock, bus
):
    # The relay ensures the stream itself.
    relay = outbox_relay(await service_db("pool"), bus, manual_clock)
    [cron] = await add_crons(pool, 1)
    await pool.create_evaluation(evaluation("e2e", window=120, slots=2, runs_per_slot=1))

    first = await pool.wake_cron(cron)
    assert first.runs_owed == 1
    out = await pool.record_run(cron, "e2e", 0, "c1", PASS)
    assert not out.continue_evaluation  # nothing more owed in slot 0: back to the pool
    assert (await pool.wake_cron(cron)).evaluation is None
    assert (await pool.record_run(cron, "e2e", 0, "c1", PASS)).duplicate

    manual_clock.advance(seconds=60)  # slot 1 is due
    second = await pool.wake_cron(cron)
    assert second.evaluation.id == "e2e" and second.next_run_index == 1
    out = await pool.record_run(
        cron, "e2e", 1, "c1", RunResult(Verdict.FAIL, 0.5, 7, "status 500 != 200")
    )
    assert out.evaluation_status is EvaluationStatus.COMPLETED and not out.continue_evaluation

    assert await relay.relay_once() == 4
    assert await relay.relay_once() == 0
    messages = await _stream(bus)
    assert [(s, m) for s, m, _ in messages] == [
        ("evaluation.started", "e2e:started"),
        ("evaluation.run_recorded", "e2e-r0"),
        ("evaluation.run_recorded", "e2e-r1"),
        ("evaluation.completed", "e2e:completed"),
    ]
    started = events_pb2.EvaluationStarted.FromString(messages[0][2])
    assert (started.series, started.line, started.period) == (
        "search-quality",
        common_pb2.LINE_FORMAL,
        "2026-W01",
    )
    run = events_pb2.EvaluationRunRecorded.FromString(messages[2][2])
    assert (run.verdict, run.score, run.latency_ms, run.failure_reason) == (
        common_pb2.VERDICT_FAIL,
        0.5,
        7,
        "status 500 != 200",
    )
    done = events_pb2.EvaluationCompleted.FromString(messages[3][2])
    assert done.status == pool_pb2.EVALUATION_STATUS_COMPLETED


async def test_pause_resume_cancel(pool):
    [cron] = await add_crons(pool, 1)
    await pool.create_evaluation(evaluation("pausable", runs_per_slot=3))
    await pool.wake_cron(cron)
    paused = await pool.pause("pausable")
    assert paused.status is EvaluationStatus.PAUSED and paused.assigned_cron_id is None
    assert (await pool.wake_cron(cron)).evaluation is None  # paused: not served
    with pytest.raises(FailedPrecondition):
        await pool.record_run(cron, "pausable", 0, "c1", PASS)
    resumed = await pool.resume("pausable")
    assert resumed.status is EvaluationStatus.EXECUTING
    assert (await pool.wake_cron(cron)).evaluation.id == "pausable"
    cancelled = await pool.cancel("pausable")
    assert cancelled.status is EvaluationStatus.CANCELLED
    with pytest.raises(FailedPrecondition):
        await pool.resume("pausable")
    assert [c.evaluation_id for c in await pool.crons()] == [None]


async def test_bad_input_is_refused_and_changes_nothing(pool):
    with pytest.raises(InvalidArgument) as bad:
        await pool.create_evaluation(
            evaluation(
                "BAD ID",
                target="ftp://x",
                slots=0,
                cases=(TestCase("c1", "GET", "x", "", (Rule("regex", "("),)),),
            )
        )
    fields = {v.field for v in bad.value.violations}
    assert fields == {
        "evaluation_id",
        "target_url",
        "slot_count",
        "cases[0].path",
        "cases[0].rules[0]",
    }
    big = evaluation("big")
    from dataclasses import replace

    with pytest.raises(ResourceExhausted):
        await pool.create_evaluation(
            replace(big, configuration_json='{"x": "' + "a" * 70000 + '"}')
        )
    first = await pool.create_evaluation(evaluation("dup"))
    again = await pool.create_evaluation(evaluation("dup"))  # the same request: the same one
    assert (again.id, again.created_at, again.schedule) == (
        first.id,
        first.created_at,
        first.schedule,
    )
    for changed, field in [
        (replace(evaluation("dup"), period="2026-W02"), "period"),
        (evaluation("dup", slots=12), "slot_count"),
        (evaluation("dup", cases=(TestCase("c2", "GET", "/answer", "", ()),)), "cases"),
    ]:
        with pytest.raises(FailedPrecondition) as refused:
            await pool.create_evaluation(changed)
        assert [v.field for v in refused.value.violations] == [field]
        assert field in refused.value.message
    assert (await pool.get_evaluation("dup")).schedule == first.schedule  # nothing changed
    status = await pool.status()
    assert status.queue_depth == 1
    with pytest.raises(InvalidArgument):
        await pool.boost("dup", 5000)


async def test_a_published_outbox_row_is_deleted_once_its_event_is_in_the_stream(
    pool, pool_engine, service_db, manual_clock, bus
):
    from sqlalchemy import text

    relay = outbox_relay(await service_db("pool"), bus, manual_clock)
    await bus.ensure_stream("EVALUATIONS", ["evaluation.>"])
    await pool.cancel((await pool.create_evaluation(evaluation("short-lived"))).id)
    async with pool_engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one() == 1
    assert await relay.relay_once() == 1
    assert (await bus.js.stream_info("EVALUATIONS")).state.messages == 1
    async with pool_engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one() == 0
