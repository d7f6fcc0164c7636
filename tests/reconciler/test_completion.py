"""The three completion facts: finished, notified (signed webhook with retries, or a NATS
subject; each attempt recorded), reconciled (probes sampled, mismatches as findings)."""

import asyncio
import dataclasses
import json
from datetime import UTC, datetime

from dispo.auth.signing import SigningKey, SigningSecretRecord, signature
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.reconciler.completion import facts as completion
from dispo.reconciler.completion import store as cs
from dispo.reconciler.states import ReconcileState
from dispo.reconciler.sweeps import run_sweeps

from .conftest import TS, envelope, node


def finished(task_id, callback_url="", status="SUCCEEDED", **kw):
    return envelope(
        task_id,
        [
            node("a.set", "SUCCEEDED", task_id=task_id),
            node("a.audit", "SUCCEEDED", deps=("a.set",), probe=False, task_id=task_id),
            node("b.skip", "CANCELLED", task_id=task_id),
        ],
        status=status,
        callback_url=callback_url,
        generation=4,
        **kw,
    )


async def facts(stub, task_id):
    return await stub.GetCompletion(pb.GetCompletionRequest(task_id=task_id))


async def test_finished_is_recorded_once_and_non_terminal_snapshots_are_ignored(recon, stub):
    await completion.on_status(recon, finished("run", status="RUNNING"))
    await completion.on_status(recon, finished("f"))
    await completion.on_status(
        recon, finished("f", status="FAILED")
    )  # a later snapshot does not rewrite the fact
    reply = await facts(stub, "f")
    assert reply.completion.status == TS.TASK_STATUS_SUCCEEDED
    assert (
        reply.completion.notify_state == pb.NOTIFY_STATE_NONE
        and reply.completion.reconcile_state == pb.RECONCILE_STATE_PENDING
    )
    import grpc

    from .test_operations import expect_error

    await expect_error(
        stub.GetCompletion(pb.GetCompletionRequest(task_id="run")), grpc.StatusCode.NOT_FOUND
    )


async def test_what_needs_no_probe_is_reconciled_when_the_task_finishes(recon, manual_clock, stub):
    """A finished task none of whose nodes has a probe, or one outside the sample, is
    recorded NOTHING_TO_PROBE or NOT_SAMPLED with the finish: the reconcile sweep, which
    takes one batch of due rows a pass, never has it to do."""
    plain = envelope(
        "plain",
        [node("a.audit", "SUCCEEDED", probe=False, task_id="plain")],
        status="SUCCEEDED",
    )
    unprobed = finished("unprobed")
    outside = dataclasses.replace(
        recon,
        config=dataclasses.replace(
            recon.config,
            reconcile=dataclasses.replace(recon.config.reconcile, sample_percent=0),
        ),
    )
    assert await completion.on_statuses(recon, [plain]) == [True]
    assert await completion.on_statuses(outside, [unprobed]) == [True]
    for task_id, state in [
        ("plain", pb.RECONCILE_STATE_NOTHING_TO_PROBE),
        ("unprobed", pb.RECONCILE_STATE_NOT_SAMPLED),
    ]:
        reply = await facts(stub, task_id)
        assert reply.completion.reconcile_state == state, task_id
        assert reply.completion.HasField("reconciled_at"), task_id
    manual_clock.advance(seconds=61)  # past the delay: still nothing for the sweep
    assert (await run_sweeps(recon, "reconcile"))["reconcile"] == 0
    assert await completion.on_statuses(recon, [finished("probed")]) == [True]
    assert (await facts(stub, "probed")).completion.reconcile_state == pb.RECONCILE_STATE_PENDING


async def test_callback_down_then_up_is_delivered_once_signed_and_recorded(
    recon, manual_clock, receiver, stub, ecommerce_secret
):
    receiver_port_reserved = receiver  # not started: connection refused
    await completion.on_status(recon, finished("cb", callback_url=receiver.url))
    assert (await run_sweeps(recon, "notify"))["notify"] == 1
    reply = await facts(stub, "cb")
    assert (
        reply.completion.notify_state == pb.NOTIFY_STATE_PENDING
        and reply.completion.notify_attempts == 1
    )
    assert not reply.deliveries[0].ok and "delivery failed" in reply.deliveries[0].error
    assert (await run_sweeps(recon, "notify"))["notify"] == 0  # backoff: 10 s
    manual_clock.advance(seconds=11)
    assert (await run_sweeps(recon, "notify"))["notify"] == 1  # still down: attempt 2, then 20 s
    manual_clock.advance(seconds=21)

    await receiver_port_reserved.start()
    assert (await run_sweeps(recon, "notify"))["notify"] == 1
    manual_clock.advance(seconds=1000)
    assert (await run_sweeps(recon, "notify"))["notify"] == 0
    assert len(receiver.received) == 1
    got = receiver.received[0]
    body = json.loads(got["body"])
    assert body["task_id"] == "cb" and body["status"] == "SUCCEEDED"
    assert {n["node_id"]: n["status"] for n in body["nodes"]}["b.skip"] == "CANCELLED"
    headers = got["headers"]
    assert headers["X-Dispo-Signature"] == signature(
        ecommerce_secret, headers["X-Dispo-Timestamp"], got["body"]
    )
    assert (
        headers["Idempotency-Key"] == "cb/completion" and headers["X-Dispo-Delivery-Attempt"] == "3"
    )
    reply = await facts(stub, "cb")
    assert reply.completion.notify_state == pb.NOTIFY_STATE_DELIVERED and reply.completion.HasField(
        "notified_at"
    )
    assert [(d.attempt, d.ok) for d in reply.deliveries] == [(1, False), (2, False), (3, True)]
    assert reply.deliveries[2].status_code == 200


async def test_delivery_gives_up_visibly_after_max_attempts(recon, manual_clock, stub):
    await completion.on_status(recon, finished("gone", callback_url="http://127.0.0.1:9/hook"))
    for _ in range(5):
        await run_sweeps(recon, "notify")
        manual_clock.advance(seconds=200)
    reply = await facts(stub, "gone")
    assert (
        reply.completion.notify_state == pb.NOTIFY_STATE_GAVE_UP
        and reply.completion.notify_attempts == 5
    )


async def test_nats_callback_is_published_once_with_a_message_id(recon, bus, stub):
    sub = await bus.nc.subscribe("callbacks.ecommerce.done")
    await completion.on_status(recon, finished("nc", callback_url="nats:callbacks.ecommerce.done"))
    assert (await run_sweeps(recon, "notify"))["notify"] == 1
    msg = await sub.next_msg(timeout=5)
    assert json.loads(msg.data)["task_id"] == "nc"
    assert msg.headers["Nats-Msg-Id"] == "nc:completion"
    assert (await facts(stub, "nc")).completion.notify_state == pb.NOTIFY_STATE_DELIVERED
    await sub.unsubscribe()


async def test_reconciliation_pass_records_mismatches_as_findings(
    recon, manual_clock, fake_downstream, stub
):
    fake_downstream.done["ok/a.set"] = True
    fake_downstream.done["bad/b.skip"] = True  # the downstream did what Dispo recorded as cancelled
    await completion.on_status(recon, finished("ok"))
    await completion.on_status(recon, finished("bad"))
    assert (await run_sweeps(recon, "reconcile"))["reconcile"] == 0  # not before the delay
    manual_clock.advance(seconds=61)
    assert (await run_sweeps(recon, "reconcile"))["reconcile"] == 2
    ok, bad = await facts(stub, "ok"), await facts(stub, "bad")
    assert ok.completion.reconcile_state == pb.RECONCILE_STATE_MATCHED and ok.completion.HasField(
        "reconciled_at"
    )
    assert bad.completion.reconcile_state == pb.RECONCILE_STATE_MISMATCH
    found = {(f.node_id, f.recorded_status, f.observed) for f in bad.findings}
    assert found == {
        ("a.set", common_pb2.NODE_STATUS_SUCCEEDED, "not done"),
        ("b.skip", common_pb2.NODE_STATUS_CANCELLED, "done"),
    }
    listed = await stub.ListFindings(pb.ListFindingsRequest())
    assert {f.task_id for f in listed.findings} == {"bad"}
    # The audit node has no probe and is not sampled; nothing probed twice.
    assert fake_downstream.probes == {
        "ok/a.set": 1,
        "ok/b.skip": 1,
        "bad/a.set": 1,
        "bad/b.skip": 1,
    }


async def test_a_sweep_outcome_moves_a_task_once_per_attempt_read(recon, manual_clock):
    """Two sweeps that read the same attempt: the first outcome recorded wins, the second
    moves nothing; an outcome for a task not pending (or unknown) moves nothing either."""
    await completion.on_status(recon, finished("twice"))
    await completion.on_status(recon, finished("done"))
    now = manual_clock.now()
    async with recon.db.transaction() as conn:
        first = await cs.completions_set_reconcile_if_many(
            conn,
            [
                ("twice", 0, ReconcileState.PENDING, now),
                ("done", 0, ReconcileState.MATCHED, None),
                ("nobody", 0, ReconcileState.MATCHED, None),
            ],
            now,
        )
        again = await cs.completions_set_reconcile_if_many(
            conn,
            [("twice", 0, ReconcileState.MATCHED, None), ("done", 1, ReconcileState.MATCHED, None)],
            now,
        )
        later = await cs.completions_set_reconcile_if_many(
            conn, [("twice", 1, ReconcileState.MATCHED, None)], now
        )
    assert (first, again, later) == ({"twice", "done"}, set(), {"twice"})


async def test_unanswered_probes_are_retried_then_reported(
    recon, manual_clock, fake_downstream, stub
):
    fake_downstream.broken.update({"mute/a.set", "mute/b.skip"})
    await completion.on_status(recon, finished("mute"))
    manual_clock.advance(seconds=61)
    await run_sweeps(recon, "reconcile")
    assert (await facts(stub, "mute")).completion.reconcile_state == pb.RECONCILE_STATE_PENDING
    manual_clock.advance(seconds=31)
    await run_sweeps(recon, "reconcile")
    reply = await facts(stub, "mute")
    assert reply.completion.reconcile_state == pb.RECONCILE_STATE_MISMATCH
    assert {f.observed for f in reply.findings} == {"unreachable"}


async def test_a_probe_answer_is_read_only_up_to_a_bound(
    recon, manual_clock, fake_downstream, stub
):
    """A probe answering 8 MiB is cut off after 64 KiB: it could not say, and after the
    attempts the finding tells why, instead of the whole answer read and parsed."""
    fake_downstream.bloated.update({"long/a.set", "long/b.skip"})
    await completion.on_status(recon, finished("long"))
    for _ in range(2):  # the policy's attempts
        manual_clock.advance(seconds=61)
        await run_sweeps(recon, "reconcile")
    reply = await facts(stub, "long")
    assert reply.completion.reconcile_state == pb.RECONCILE_STATE_MISMATCH
    assert {f.observed for f in reply.findings} == {"unreachable"}
    assert all("answer longer than 65536 bytes" in f.detail for f in reply.findings)


async def test_the_three_facts_are_separate(recon, manual_clock, receiver, stub):
    await receiver.start()
    await completion.on_status(recon, finished("three", callback_url=receiver.url))
    reply = await facts(stub, "three")
    assert reply.completion.HasField("finished_at")
    assert not reply.completion.HasField("notified_at") and not reply.completion.HasField(
        "reconciled_at"
    )
    await run_sweeps(recon, "notify")
    reply = await facts(stub, "three")
    assert reply.completion.HasField("notified_at") and not reply.completion.HasField(
        "reconciled_at"
    )
    manual_clock.advance(seconds=61)
    await run_sweeps(recon, "reconcile")
    assert (await facts(stub, "three")).completion.HasField("reconciled_at")


async def test_a_batch_records_the_first_terminal_snapshot_of_each_task(recon, stub):
    batch = [
        finished("b1", status="RUNNING"),
        finished("b2"),
        finished("b2", status="FAILED"),  # a later snapshot of b2 in the same batch
        finished("b3", status="CANCELLED"),
        finished("b1"),
    ]
    assert await completion.on_statuses(recon, batch) == [False, True, False, True, True]
    assert await completion.on_statuses(recon, [finished("b3")]) == [False]  # recorded before
    statuses = {t: (await facts(stub, t)).completion.status for t in ("b1", "b2", "b3")}
    assert statuses == {
        "b1": TS.TASK_STATUS_SUCCEEDED,
        "b2": TS.TASK_STATUS_SUCCEEDED,
        "b3": TS.TASK_STATUS_CANCELLED,
    }


async def test_the_status_consumer_records_terminal_snapshots_from_the_bus(recon, bus, stub):
    from dispo.libs.contracts import tasks
    from dispo.reconciler.intake import consumers
    from nats.js.errors import NotFoundError
    from support import eventually

    ids = [f"bus{i:03d}" for i in range(300)]
    for task_id in ids:
        for status in ("RUNNING", "SUCCEEDED"):
            env = finished(task_id, status=status)
            await bus.publish(
                tasks.task_status(task_id, env.status),
                env.SerializeToString(),
                msg_id=f"{task_id}:{status}",
            )
    [status_consumer] = [c for name, c in consumers(recon, bus, "r") if name == "status consumer"]
    run = asyncio.create_task(status_consumer.run())
    try:

        async def settled():
            try:
                return await bus.js.consumer_info(tasks.TASK_STATUS.name, "r-status")
            except NotFoundError:  # not created yet
                return None

        info = await eventually(
            settled,
            lambda i: (
                i and i.num_pending == 0 and i.num_ack_pending == 0 and i.delivered.stream_seq
            ),
            timeout=30,
            wanted="status consumer settled",
        )
    finally:
        status_consumer.stop()
        await run
    # The server delivered the terminal snapshots only, each once.
    assert info.delivered.consumer_seq == len(ids) and info.num_redelivered == 0
    async with recon.engine.connect() as conn:
        from sqlalchemy import text

        recorded = (await conn.execute(text("SELECT task_id, status FROM completions"))).all()
    assert sorted(recorded) == [(t, "succeeded") for t in ids]


def test_each_business_of_a_batch_is_signed_with_its_own_secrets_or_not_sent():
    key, other_key = SigningKey(bytes(32)), SigningKey(bytes([1]) * 32)
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def record(secret_id, business, made_under=key, retires_at=None):
        return SigningSecretRecord(
            secret_id, business, secret_id.encode(), made_under.key_id, at, retires_at
        )

    current, previous = record("s2", "rotating"), record("s1", "rotating", retires_at=at)
    stale = record("s3", "rekeyed", made_under=other_key)
    signing = completion.signing_by_business(
        key,
        ["rotating", "rekeyed", "unsigned", "one"],
        [current, previous, stale, record("s4", "one")],
    )
    assert signing["rotating"] == [
        key.derive("rotating", "s2", b"s2"),
        key.derive("rotating", "s1", b"s1"),
    ]
    assert signing["one"] == [key.derive("one", "s4", b"s4")]
    assert signing["unsigned"] == "not sent: business 'unsigned' has no webhook signing secret"
    assert signing["rekeyed"].startswith("not sent: signing secret s3 was made under another")
    assert completion.signing_by_business(None, ["one"], [record("s4", "one")]) == {
        "one": "not sent: the reconciler has no signing key (DISPO_SIGNING_KEY)"
    }


async def test_a_sweeps_findings_are_recorded_together_and_once_per_node(recon, manual_clock):
    await completion.on_status(recon, finished("fx"))
    now = manual_clock.now()
    found = [
        cs.Finding("fx", "a.set", "labels", "SUCCEEDED", "not done", "probe says no"),
        cs.Finding("fx", "b.skip", "labels", "CANCELLED", "done", "probe says yes"),
    ]
    async with recon.db.connection() as conn:
        await cs.findings_add_many(conn, found, now)
        await cs.findings_add_many(conn, [found[0]._replace(detail="later")], now)
        rows = await cs.findings_list(conn, "fx", 10, 0)
    assert [(r.node_id, r.recorded_status, r.observed, r.detail) for r in rows] == [
        ("a.set", "succeeded", "not done", "probe says no"),
        ("b.skip", "cancelled", "done", "probe says yes"),
    ]
