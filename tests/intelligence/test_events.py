"""The cron pool's EVALUATIONS stream feeds the evaluation read model (real NATS JetStream)."""

from __future__ import annotations

import asyncio
import json

from dispo.intelligence.evaluations import EvaluationRecordStatus
from dispo.intelligence.events import consumer
from dispo.intelligence.job_rules import JobKind, JobStatus
from dispo.libs.api.common.v1 import common_pb2 as common
from dispo.libs.api.pool.v1 import events_pb2, pool_pb2
from dispo.libs.bus import ACK, Nak, Term
from dispo.libs.contracts.evaluations import ensure_evaluation_stream
from google.protobuf.timestamp_pb2 import Timestamp
from support import eventually

from .conftest import CONFIG, store_of


def started(evaluation_id: str, period: str, line: int = common.LINE_FORMAL) -> bytes:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return events_pb2.EvaluationStarted(
        evaluation_id=evaluation_id,
        series="pool",
        line=line,
        period=period,
        configuration_json=json.dumps(CONFIG),
        started_at=stamp,
    ).SerializeToString()


def run_recorded(
    evaluation_id: str, run_id: str, verdict: int = common.VERDICT_PASS, score: float = 1.0
) -> bytes:
    return events_pb2.EvaluationRunRecorded(
        evaluation_id=evaluation_id,
        run_id=run_id,
        case_id="c1",
        verdict=verdict,
        score=score,
        latency_ms=120,
        failure_reason="" if verdict == common.VERDICT_PASS else "wrong answer",
    ).SerializeToString()


def completed(
    evaluation_id: str, status: int = pool_pb2.EVALUATION_STATUS_COMPLETED, run_count: int = 0
) -> bytes:
    return events_pb2.EvaluationCompleted(
        evaluation_id=evaluation_id, status=status, run_count=run_count
    ).SerializeToString()


async def test_pool_events_build_evaluations_and_trigger_the_chain(app, bus):
    await ensure_evaluation_stream(bus)  # the pool does the same; both are idempotent
    feed = await consumer(bus, app.events, "intelligence-test")
    running = asyncio.create_task(feed.run())
    try:
        for period, evaluation_id, verdicts in (
            ("2026-01", "ev1", [common.VERDICT_PASS, common.VERDICT_PASS]),
            ("2026-02", "ev2", [common.VERDICT_PASS, common.VERDICT_FAIL]),
        ):
            await bus.publish(
                "evaluation.started",
                started(evaluation_id, period),
                msg_id=f"{evaluation_id}:started",
            )
            for i, verdict in enumerate(verdicts):
                run_id = f"{evaluation_id}-run{i}"
                await bus.publish(
                    "evaluation.run_recorded",
                    run_recorded(evaluation_id, run_id, verdict),
                    msg_id=run_id,
                )
            # a redelivery under a new message id is absorbed by the unique run_id
            await bus.publish(
                "evaluation.run_recorded",
                run_recorded(evaluation_id, f"{evaluation_id}-run0"),
                msg_id=f"{evaluation_id}-run0-again",
            )
            await bus.publish(
                "evaluation.completed",
                completed(evaluation_id, run_count=len(verdicts)),
                msg_id=f"{evaluation_id}:completed",
            )
            # Events are handled concurrently: a period's comparison reads the baseline that is
            # completed when it runs, so the next period starts only after this one is done.
            await eventually(
                lambda e_id=evaluation_id: store_of(app).evaluation_get(e_id),
                lambda e: e is not None and e.status == EvaluationRecordStatus.COMPLETED,
                timeout=20,
                wanted=f"{evaluation_id} completed",
            )

        async def chain_done() -> bool:
            job = await store_of(app).job_get(JobKind.COMPARISON, "ev2")
            return job is not None and job.status == JobStatus.COMPLETED

        await eventually(chain_done, timeout=20, wanted="the chain done")
    finally:
        feed.stop()
        await running

    ev2 = await store_of(app).evaluation_get("ev2")
    assert ev2.status == EvaluationRecordStatus.COMPLETED and ev2.run_count == 2
    comparison = await store_of(app).job_get(JobKind.COMPARISON, "ev2")
    assert comparison.baseline_evaluation_id == "ev1"
    deltas = {d["metric"]: d for d in comparison.result["deltas"]}
    assert deltas["pass_rate"]["baseline"] == 1.0 and deltas["pass_rate"]["current"] == 0.5


async def test_event_dispositions(app):
    events = app.events
    assert isinstance(
        await events.handle("evaluation.run_recorded", run_recorded("later", "r1")), Nak
    )
    gave_up = await events.handle(
        "evaluation.run_recorded", run_recorded("never", "r9"), deliveries=30
    )
    assert isinstance(gave_up, Term) and "after 30 deliveries" in gave_up.reason
    assert (
        await events.handle(
            "evaluation.started", started("later", "2026-01", line=common.LINE_TRIAL)
        )
        == ACK
    )
    assert (
        await events.handle(
            "evaluation.started", started("later", "2026-01", line=common.LINE_TRIAL)
        )
        == ACK
    )
    assert await events.handle("evaluation.run_recorded", run_recorded("later", "r1")) == ACK
    # a completion reporting a run not stored yet waits for it, and gives up in the end
    early = completed("later", pool_pb2.EVALUATION_STATUS_CANCELLED, run_count=2)
    assert isinstance(await events.handle("evaluation.completed", early), Nak)
    gave_up = await events.handle("evaluation.completed", early, deliveries=30)
    assert isinstance(gave_up, Term) and "1 of the 2 runs" in gave_up.reason
    assert (
        await events.handle(
            "evaluation.completed", completed("later", pool_pb2.EVALUATION_STATUS_CANCELLED)
        )
        == ACK
    )
    assert (
        await events.handle(
            "evaluation.completed", completed("later", pool_pb2.EVALUATION_STATUS_CANCELLED)
        )
        == ACK
    )

    assert isinstance(
        await events.handle(
            "evaluation.completed", completed("later", pool_pb2.EVALUATION_STATUS_COMPLETED)
        ),
        Term,
    )
    assert isinstance(await events.handle("evaluation.started", b"\xff\xff\xff"), Term)
    assert isinstance(await events.handle("evaluation.started", started("", "2026-01")), Term)
    assert isinstance(
        await events.handle(
            "evaluation.started", started("no-line", "2026-01", line=common.LINE_UNSPECIFIED)
        ),
        Term,
    )
    assert isinstance(
        await events.handle(
            "evaluation.run_recorded",
            run_recorded("later", "r3", verdict=common.VERDICT_UNSPECIFIED),
        ),
        Term,
    )
    assert isinstance(
        await events.handle(
            "evaluation.completed", completed("later", pool_pb2.EVALUATION_STATUS_EXECUTING)
        ),
        Term,
    )
    assert isinstance(
        await events.handle("evaluation.run_recorded", run_recorded("later", "r2", verdict=99)),
        Term,
    )
    assert isinstance(await events.handle("evaluation.paused", b""), Term)
    assert isinstance(
        await events.handle("evaluation.started", started("later", "2026-09")), Term
    )  # conflicting
    evaluation = await store_of(app).evaluation_get("later")
    assert (
        evaluation.status == EvaluationRecordStatus.CANCELLED
        and evaluation.run_count == 1
        and evaluation.period == "2026-01"
    )


async def test_two_replicas_sharing_the_consumer_keep_each_evaluations_order(app, bus):
    """A completion never overtakes its runs, nor a run its registration, even when they
    reach the stream backwards and two consumers race on one durable."""
    await ensure_evaluation_stream(bus)
    await bus.publish(
        "evaluation.completed", completed("ordered", run_count=40), msg_id="ordered:completed"
    )
    for i in reversed(range(40)):
        await bus.publish(
            "evaluation.run_recorded",
            run_recorded("ordered", f"ordered-{i}"),
            msg_id=f"ordered-{i}",
        )
    await bus.publish(
        "evaluation.started",
        started("ordered", "2026-01", line=common.LINE_TRIAL),
        msg_id="ordered:started",
    )

    dispositions = []

    async def recording(message):
        outcome = await app.events.handle_message(message)
        dispositions.append((message.subject, outcome))
        return outcome

    replicas = []
    for _ in range(2):
        replica = await consumer(bus, app.events, "intelligence-ordered")
        replica.handler = recording
        replicas.append(replica)
    running = [asyncio.create_task(replica.run()) for replica in replicas]
    try:

        async def finished() -> bool:
            evaluation = await store_of(app).evaluation_get("ordered")
            return evaluation is not None and evaluation.status == EvaluationRecordStatus.COMPLETED

        await eventually(finished, timeout=30, wanted="the evaluation completed")
    finally:
        for replica in replicas:
            replica.stop()
        await asyncio.gather(*running)

    assert (await store_of(app).evaluation_get("ordered")).run_count == 40
    # a run applied after the completion would have been refused: none was
    assert [d for d in dispositions if isinstance(d[1], Term)] == []
    early = {subject for subject, outcome in dispositions if isinstance(outcome, Nak)}
    assert "evaluation.completed" in early  # it did come first, and waited


async def test_a_stuck_evaluation_holds_no_other_evaluations_events(make_app, bus, intel_engine):
    """One evaluation's event keeps failing (it waits for a registration that never comes,
    then goes to the quarantine); the events of every other evaluation, published behind
    it, are applied meanwhile."""
    app = make_app(unknown_evaluation_retry_seconds=0.2, unknown_evaluation_max_deliveries=10_000)
    await ensure_evaluation_stream(bus)
    await bus.publish("evaluation.run_recorded", run_recorded("stuck", "stuck-0"), msg_id="stuck-0")
    others = [f"free-{i}" for i in range(8)]
    for evaluation_id in others:
        await bus.publish(
            "evaluation.started",
            started(evaluation_id, "2026-03", line=common.LINE_TRIAL),
            msg_id=f"{evaluation_id}:started",
        )
        await bus.publish(
            "evaluation.run_recorded",
            run_recorded(evaluation_id, f"{evaluation_id}-0"),
            msg_id=f"{evaluation_id}-0",
        )
        await bus.publish(
            "evaluation.completed",
            completed(evaluation_id, run_count=1),
            msg_id=f"{evaluation_id}:completed",
        )
    stuck_deliveries = []

    async def recording(message):
        outcome = await app.events.handle_message(message)
        if b"stuck" in message.data:
            stuck_deliveries.append(outcome)
        return outcome

    feed = await consumer(bus, app.events, "intelligence-free")
    feed.handler = recording
    running = asyncio.create_task(feed.run())
    try:

        async def all_completed() -> bool:
            for evaluation_id in others:
                evaluation = await store_of(app).evaluation_get(evaluation_id)
                if evaluation is None or evaluation.status != EvaluationRecordStatus.COMPLETED:
                    return False
            return True

        await eventually(all_completed, timeout=30, wanted="every other evaluation completed")
        # the stuck event is still being retried, not given up: it held nothing up
        assert stuck_deliveries and all(isinstance(o, Nak) for o in stuck_deliveries)
        assert await store_of(app).evaluation_get("stuck") is None
    finally:
        feed.stop()
        await running
    for evaluation_id in others:
        assert (await store_of(app).evaluation_get(evaluation_id)).run_count == 1
