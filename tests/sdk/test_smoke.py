"""The SDK against a real gateway and executor: async and sync clients, typed builders."""

import asyncio

import grpc
import pytest
from dispo.sdk import Client, DispoError, cell, cells


def test_typed_builders_make_cell_requests():
    label = cells.update_quality_level(content_id="c1", level=3)
    notify = cells.notify_owner(owner_id="u1", message="done").after(label)
    second = cells.update_quality_level(content_id="c2", level=1, reason="spam").named("second")

    assert label.to_proto().cell == "update_quality_level"
    request = label.to_proto()
    # Exact canonical JSON bytes, None fields left out; the integer stays an integer.
    assert request.WhichOneof("body") == "payload_json"
    assert request.payload_json == b'{"content_id":"c1","level":3}'
    with pytest.raises(ValueError):
        cells.update_quality_level(content_id="c1", level=float("nan")).to_proto()
    assert list(notify.to_proto().depends_on) == ["update_quality_level"]
    assert second.to_proto().ref == "second" and second.payload["reason"] == "spam"
    assert cells.start_review("c1").payload == {"content_id": "c1"}


async def test_async_client_submits_and_waits(client, downstream):
    task = await client.submit("smoke", [cell("pair", name="x"), cell("step", name="y")])
    assert task.status == "ACCEPTED" and not task.duplicate

    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED" and done.terminal
    assert set(done.node_statuses.values()) == {"SUCCEEDED"}
    calls = await downstream.calls()
    assert sorted(calls) == sorted(
        f"{task.task_id}/{n}" for n in ("pair.first", "pair.second", "step.call")
    )


async def test_sync_client_submit_get_wait_list_count_and_errors(pipeline):
    def use_sync_client():
        with Client(pipeline.gateway.address, token=pipeline.token) as dispo:
            task = dispo.submit("sync", [cell("noop")], idempotency_key="once")
            again = dispo.submit("sync", [cell("noop")], idempotency_key="once")
            done = dispo.wait(task.task_id, timeout=30)
            listed = [t.task_id for t in dispo.list(business="sync")]
            keyed = [t.task_id for t in dispo.list(idempotency_key="once")]
            counts = dispo.count(business="sync", idempotency_key="once")
            with pytest.raises(DispoError) as refused:
                dispo.submit("sync", [cell("nope")])
            return task, again, done, listed, keyed, counts, refused.value

    task, again, done, listed, keyed, counts, refused = await asyncio.to_thread(use_sync_client)

    assert again.task_id == task.task_id and again.duplicate
    assert done.status == "SUCCEEDED" and listed == keyed == [task.task_id]
    assert {s: n for s, n in counts.items() if n} == {"SUCCEEDED": 1} and len(counts) == 7
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.violations == {"cells[0].cell": "unknown cell 'nope'"}


async def test_sync_client_signals_a_waiting_task_by_its_key(pipeline):
    """``Client.signal`` (the blocking client) names the task by business and idempotency
    key; the signal's payload becomes the wait node's output, and a repeat is a duplicate."""

    def use_sync_client():
        with Client(pipeline.gateway.address, token=pipeline.token) as dispo:
            task = dispo.submit("sync", [cell("review", name="s")], idempotency_key="review")
            sent = dispo.signal(
                "",
                "verdict",
                {"verdict": "approved"},
                signal_id="r-1",
                business="sync",
                idempotency_key="review",
            )
            again = dispo.signal(task.task_id, "verdict", {"verdict": "approved"}, signal_id="r-1")
            return task, sent, again, dispo.wait(task.task_id, timeout=30)

    task, sent, again, done = await asyncio.to_thread(use_sync_client)
    assert (sent.task_id, sent.duplicate, again.duplicate) == (task.task_id, False, True)
    assert done.status == "SUCCEEDED"
    assert done.node("review.verdict").output == {"verdict": "approved"}
